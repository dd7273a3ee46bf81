"""``make run``: CPU vLLM workers and the gateway on this machine, until Ctrl-C.

Starts the generation worker (core 0) and the embedding worker (core 1) named in the
settings file, at the ports their URLs give, then the gateway; prints ready-to-paste
``curl`` commands; stops everything it started on Ctrl-C or SIGTERM.

``--layout split`` (``make run LAYOUT=split``) replaces the workers (and routing) with those
of ``deploy/settings.split.yaml``: a general worker on core 0, a long-prefill worker on
core 1, and the embedding worker sharing core 1.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import types
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from deploy.vllm_worker import REPO_ROOT, Kind, VllmWorker, WorkerError, start_all, stop_all
from gateway.settings import Settings, SettingsError, Worker, load_settings

RUN_DIR = REPO_ROOT / ".run"
LAYOUTS = {"single": None, "split": REPO_ROOT / "deploy/settings.split.yaml"}


class _Stop(Exception):
    pass


def _on_signal(signum: int, frame: types.FrameType | None) -> None:
    raise _Stop(signal.Signals(signum).name)


def _local(spec: Worker) -> bool:
    url = urlparse(spec.url)
    return url.hostname in ("127.0.0.1", "localhost") and url.port is not None


def assign_cores(specs: list[Worker], cores: int = 2) -> dict[str, int]:
    """A CPU core per local worker. With fewer generation workers than cores, every worker
    takes the next core in turn (the single layout: generation on 0, embeddings on 1).
    Otherwise the generation workers take the cores in turn and each embeddings worker
    shares the core of the last long-prefill (else the last) generation worker, so the
    first general worker, the interactive one, keeps its core to itself."""
    local = [s for s in specs if _local(s)]
    gen = [s for s in local if s.role != "embeddings"]
    if len(gen) < cores:
        return {s.name: i % cores for i, s in enumerate(local)}
    out = {s.name: i % cores for i, s in enumerate(gen)}
    lp = [s for s in gen if s.role == "long_prefill"]
    shared = out[(lp or gen)[-1].name]
    out.update({s.name: shared for s in local if s.role == "embeddings"})
    return out


def plan_workers(settings: Settings) -> list[VllmWorker]:
    """One local vLLM process per configured worker on this host (see ``assign_cores``).
    A worker whose ``upstream_models`` renames its (single) model is served under that name."""
    workers: list[VllmWorker] = []
    cores = assign_cores(list(settings.workers))
    for spec in settings.workers:
        if not _local(spec):
            continue  # a remote worker: the user runs it
        port = urlparse(spec.url).port
        assert port is not None
        kind: Kind = "embed" if spec.role == "embeddings" else "gen"
        extra = ["--scheduling-policy", "priority"] if spec.priority_scheduling else []
        log = RUN_DIR / f"vllm-{spec.name}.log"
        worker = VllmWorker(kind, port, cores[spec.name], log, extra)
        served = spec.upstream_models.get(worker.served_model_name)
        if served is not None:
            worker.served_model_name = served
        workers.append(worker)
    return workers


def layout_config(config: str, layout: str) -> str:
    """The settings file to run: ``config`` itself, or for another layout ``config`` with
    the layout file's keys replacing its own, written to ``.run/settings-<layout>.yaml``."""
    overlay = LAYOUTS[layout]
    if overlay is None:
        return config
    data: dict[str, Any] = yaml.safe_load(Path(config).read_text()) or {}
    data.update(yaml.safe_load(overlay.read_text()) or {})
    RUN_DIR.mkdir(exist_ok=True)
    out = RUN_DIR / f"settings-{layout}.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(out)


def demo_keys(settings: Settings, environ: dict[str, str]) -> dict[str, str]:
    """App name -> key; apps whose key variable is unset get a demo key set in ``environ``."""
    keys: dict[str, str] = {}
    for app in settings.apps:
        if app.key_env is None:
            continue
        if not environ.get(app.key_env):
            environ[app.key_env] = f"demo-{app.name}-key"
        keys[app.name] = environ[app.key_env]
    return keys


def _curl_examples(host: str, port: int, settings: Settings, keys: dict[str, str]) -> str:
    base = f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}"
    gen = next((w.models[0] for w in settings.workers if w.role != "embeddings"), None)
    emb = next((w.models[0] for w in settings.workers if w.role == "embeddings"), None)
    lines = [f"hearthgate is ready at {base}/v1  (status: {base}/status, metrics: {base}/metrics)"]
    auth = ""
    if keys:
        lines += ["", "App keys (Authorization: Bearer <key>):"]
        lines += [f"  {name}: {key}" for name, key in keys.items()]
        chat_app = next(
            (a.name for a in settings.apps if a.default_class == "chat" and a.name in keys),
            next(iter(keys)),
        )
        auth = f" -H 'Authorization: Bearer {keys[chat_app]}'"
    if gen:
        lines += [
            "",
            "Chat (streaming):",
            f"  curl -N {base}/v1/chat/completions{auth} -H 'Content-Type: application/json' \\",
            f'    -d \'{{"model": "{gen}", "messages": [{{"role": "user", "content": '
            '"What is for dinner?"}], "max_tokens": 32, "stream": true}\'',
        ]
    if emb:
        lines += [
            "",
            "Embeddings:",
            f"  curl {base}/v1/embeddings{auth} -H 'Content-Type: application/json' \\",
            f'    -d \'{{"model": "{emb}", "input": ["pasta with tomato sauce"]}}\'',
        ]
    lines += ["", "Press Ctrl-C to stop the gateway and the workers."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default=str(REPO_ROOT / "deploy/settings.example.yaml"))
    parser.add_argument(
        "--layout",
        choices=sorted(LAYOUTS),
        default="single",
        help="single: the workers of --config; split: general + long-prefill + embeddings",
    )
    args = parser.parse_args(argv)
    try:
        args.config = layout_config(args.config, args.layout)
        settings = load_settings(args.config)
    except SettingsError as exc:
        print(f"hearthgate: {exc}", file=sys.stderr)
        return 2
    RUN_DIR.mkdir(exist_ok=True)
    workers = plan_workers(settings)
    gateway: subprocess.Popen[bytes] | None = None
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_signal)
    try:
        names = ", ".join(f"{w.kind} on :{w.port} (core {w.core})" for w in workers)
        print(f"starting vLLM workers: {names}; this takes about a minute", flush=True)
        print(f"worker logs: {RUN_DIR}/vllm-*.log", flush=True)
        start_all(workers, timeout=300)
        env = dict(os.environ)
        keys = demo_keys(settings, env)
        cmd = [sys.executable, "-m", "gateway.cli", "serve", "--config", args.config]
        gateway = subprocess.Popen(cmd, env=env)
        port = settings.listen.port
        deadline = time.monotonic() + 30
        while True:
            if gateway.poll() is not None:
                print("the gateway exited; see its output above", file=sys.stderr)
                return 1
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    print("the gateway did not become ready in 30 s", file=sys.stderr)
                    return 1
                time.sleep(0.2)
        print("\n" + _curl_examples(settings.listen.host, port, settings, keys) + "\n", flush=True)
        while gateway.poll() is None and all(w.running for w in workers):
            time.sleep(0.5)
        print("a process exited unexpectedly; stopping the rest", file=sys.stderr)
        return 1
    except _Stop:
        print("\nstopping...", flush=True)
        return 0
    except WorkerError as exc:
        print(f"a vLLM worker failed to start:\n{exc}", file=sys.stderr)
        return 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        if gateway is not None and gateway.poll() is None:
            gateway.terminate()
            try:
                gateway.wait(10)
            except subprocess.TimeoutExpired:
                gateway.kill()
        stop_all(workers)


if __name__ == "__main__":
    sys.exit(main())
