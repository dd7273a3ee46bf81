"""``make run``: CPU vLLM workers and the gateway on this machine, until Ctrl-C.

Starts the generation worker (core 0) and the embedding worker (core 1) named in the
settings file, at the ports their URLs give, then the gateway with a new random key for
every app (unless its ``key_env`` is set already); prints the keys and ready-to-paste
``curl`` commands that use them; stops everything it started on Ctrl-C or SIGTERM.

When the settings name no Redis (``redis.url``), a local ``redis-server`` is started for the
run (``deploy/redis_server.py``: append-only, its data in ``.run/redis``, kept across runs;
port 6390 unless that is busy) and handed to the gateway as ``HEARTHGATE_REDIS__URL``.

``--layout split`` (``make run LAYOUT=split``) replaces the workers (and routing) with those
of ``deploy/settings.split.yaml``: a general worker on core 0, a long-prefill worker on
core 1, and the embedding worker sharing core 1.
"""

from __future__ import annotations

import argparse
import os
import secrets
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

from hearthgate.deploy import box
from hearthgate.deploy.gateway_process import free_port
from hearthgate.deploy.redis_server import RedisServer, RedisServerError, port_free
from hearthgate.deploy.tts_server import TtsServer
from hearthgate.deploy.vllm_worker import (
    REPO_ROOT,
    SERVED_NAMES,
    Kind,
    VllmWorker,
    WorkerError,
    start_all,
    stop_all,
)
from hearthgate.gateway.settings import Settings, SettingsError, Worker, load_settings

RUN_DIR = REPO_ROOT / ".run"
LAYOUTS = {"single": None, "split": REPO_ROOT / "deploy/settings.split.yaml"}
REDIS_DIR = RUN_DIR / "redis"
REDIS_PORT = 6390
REDIS_URL_VAR = "HEARTHGATE_REDIS__URL"


class _Stop(Exception):
    pass


def _on_signal(signum: int, frame: types.FrameType | None) -> None:
    raise _Stop(signal.Signals(signum).name)


def _local(spec: Worker) -> bool:
    url = urlparse(spec.url)
    return url.hostname in ("127.0.0.1", "localhost") and url.port is not None


def worker_kind(spec: Worker) -> str:
    """What ``make run`` starts for a local worker: ``tts`` (the Piper speech server) for
    role speech; the vLLM kind whose model it serves (``stt``, ``rerank``...); else
    ``embed`` for role embeddings and ``gen``."""
    if spec.role == "speech":
        return "tts"
    if spec.role == "transcription":
        return "stt"
    by_model = {name: kind for kind, name in SERVED_NAMES.items()}
    served = [by_model[m] for m in spec.models if m in by_model]
    if served and served[0] not in ("gen", "embed"):
        return served[0]
    return "embed" if spec.role == "embeddings" else "gen"


def assign_cores(specs: list[Worker], cores: int = 2) -> dict[str, int]:
    """A CPU core per local worker. The generation workers take the cores in turn; the
    others (embeddings, speech to text, rerank, speech) share one: the next core when
    there are fewer generation workers than cores (the single layout: generation on 0,
    the rest on 1), else the core of the last long-prefill (else the last) generation
    worker, so the first general worker, the interactive one, keeps its core to itself."""
    local = [s for s in specs if _local(s)]
    gen = [s for s in local if worker_kind(s) == "gen"]
    out = {s.name: i % cores for i, s in enumerate(gen)}
    if len(gen) < cores:
        shared = len(gen)
    else:
        lp = [s for s in gen if s.role == "long_prefill"]
        shared = out[(lp or gen)[-1].name]
    out.update({s.name: shared for s in local if s.name not in out})
    return out


# vLLM's CPU default step is 2,048 tokens, so a ~1.8k-token RAG prompt is prefilled in one
# ~200 ms step, and a voice turn arriving meanwhile waits it out. With 1,024-token steps
# background got 5-9% more tokens behind the gateway at home-mix x10 and in every RAG burst,
# in each of three rounds, interactive work 99.8-100% (loadtests/results/chunks.md); 512
# gave background less. The full matrix after the change (another day,
# loadtests/results/matrix-2026-12-03-morning.md) had no voice misses but did not show the
# background gain against vLLM alone, and the chat UI did worse under the doubled flood. A
# long-prefill worker keeps vLLM's default.
GENERAL_STEP_TOKENS = 1024

# vLLM runs the requests it has started first, so a long prompt in prefill takes what is
# left of each step and a voice or chat prompt that arrives waits until it is through. With
# --long-prefill-token-threshold one request takes at most this many prompt tokens of a
# step while anything else runs or waits, so the step a voice prompt waits behind is short.
# By the box, as the worker's dtype (vllm_worker.gen_dtype): with AVX-512, 384 halved voice
# and chat first-token p99s for the same background tokens (loadtests/results/
# prefill-threshold.md, 3 rounds). Without it the worker runs in float32 and prefilled
# ~1,600-2,600 tokens/s in these runs, so one 384-token chunk alone took ~0.15-0.25 s of
# voice's 300 ms first-token target; 128 put more interactive requests on time than 384 in
# each of 3 rounds at home-mix x1 and rag-burst x1 (medians 98.2 against 88.9% and 95.5
# against 90.1%), background 1-2% fewer tokens (loadtests/results/threshold-steps.md). 64
# there, with the gateway holding one background prompt in prefill at a time
# (gateway_defaults), left fewer voice and chat requests off target than 128 at five of
# seven matrix points and as few at the other two (39 against 76 over two or three
# rounds), background level but at rag-burst x2, 15% fewer in the median (threshold-64.md,
# threshold-64-heavy.md, threshold-64-rest.md, docs/measurements.md).
PREFILL_THRESHOLD_AVX512 = 384
PREFILL_THRESHOLD_AVX2 = 64


def prefill_threshold(avx512: bool) -> int:
    """At most this many prompt tokens of one request per step of a general worker."""
    return PREFILL_THRESHOLD_AVX512 if avx512 else PREFILL_THRESHOLD_AVX2


def gateway_defaults(avx512: bool) -> dict[str, Any]:
    """Settings ``make run`` gives the gateway on this box, under the user's own: without
    AVX-512, one background prompt in prefill per general worker at a time (each 64-token
    chunk of a prompt is ~35 ms of a step there, so two or three of them in one step
    already make every stream's gap longer than chat's 50 ms target); with it, none (the
    per-app cap's gap follows the worker's own speed, ``scheduler.pacing.app_gap_steps``)."""
    if avx512:
        return {}
    return {"scheduler": {"pacing": {"background_prefill": 1}}}


def gateway_environment(settings: Settings, avx512: bool) -> dict[str, str]:
    """``gateway_defaults`` as the gateway's environment variables, leaving out every key
    the settings (their file or the environment) name themselves."""
    env: dict[str, str] = {}

    def walk(path: list[str], values: dict[str, Any], model: Any) -> None:
        for key, value in values.items():
            if isinstance(value, dict):
                walk([*path, key], value, getattr(model, key))
            elif key not in model.model_fields_set:
                env["HEARTHGATE_" + "__".join(p.upper() for p in [*path, key])] = str(value)

    walk([], gateway_defaults(avx512), settings)
    return env


def worker_flags(spec: Worker) -> list[str]:
    """The vLLM flags ``make run`` adds to a local worker's command line on this box."""
    flags: list[str] = []
    if spec.role == "general":
        threshold = prefill_threshold(box.has_avx512())
        flags += ["--max-num-batched-tokens", str(GENERAL_STEP_TOKENS)]
        flags += ["--long-prefill-token-threshold", str(threshold)]
    if spec.priority_scheduling:
        flags += ["--scheduling-policy", "priority"]
    return flags


def plan_workers(settings: Settings) -> list[VllmWorker | TtsServer]:
    """One local server process per configured worker on this host (see ``assign_cores``
    and ``worker_kind``). A worker whose ``upstream_models`` renames its (single) model is
    served under that name."""
    workers: list[VllmWorker | TtsServer] = []
    cores = assign_cores(list(settings.workers))
    for spec in settings.workers:
        if not _local(spec):
            continue  # a remote worker: the user runs it
        port = urlparse(spec.url).port
        assert port is not None
        kind = worker_kind(spec)
        if kind == "tts":
            log = RUN_DIR / f"tts-{spec.name}.log"
            workers.append(TtsServer(port, log, core=cores[spec.name]))
            continue
        log = RUN_DIR / f"vllm-{spec.name}.log"
        vllm_kind: Kind = kind  # type: ignore[assignment]
        worker = VllmWorker(vllm_kind, port, cores[spec.name], log, worker_flags(spec))
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


def configured_redis_url(settings: Settings, environ: dict[str, str]) -> str | None:
    """The Redis the settings (or ``HEARTHGATE_REDIS__URL``) name; None when there is none.
    Read defensively: settings without a ``redis`` section have no URL."""
    url = getattr(getattr(settings, "redis", None), "url", None)
    return str(url) if url else environ.get(REDIS_URL_VAR) or None


def plan_redis(
    settings: Settings,
    environ: dict[str, str],
    *,
    data_dir: Path = REDIS_DIR,
    port: int = REDIS_PORT,
) -> RedisServer | None:
    """A local Redis for this run when the settings name none (None otherwise): its data in
    ``data_dir``, on ``port`` unless that is busy, then on a free port. Not started."""
    if configured_redis_url(settings, environ) is not None:
        return None
    return RedisServer(data_dir, port=port if port_free(port) else free_port())


KEY_VAR = "HEARTHGATE_KEY"  # the key the printed examples and the README's SDK example use


def demo_keys(settings: Settings, environ: dict[str, str]) -> dict[str, str]:
    """App name -> key, for every app with a ``key_env``: the variable's value when it is
    set, else a new random key, set in ``environ`` for the gateway. Every run (and every
    machine) gets its own keys, never a fixed, guessable one. Apps whose key is given as
    ``key_sha256`` are left out: only its owner knows the key."""
    keys: dict[str, str] = {}
    for app in settings.apps:
        if app.key_env is None:
            continue
        if not environ.get(app.key_env):
            environ[app.key_env] = secrets.token_urlsafe(24)
        keys[app.name] = environ[app.key_env]
    return keys


def demo_admin_key(settings: Settings, environ: dict[str, str]) -> str | None:
    """The admin key (``auth.admin_key_env``), made up as :func:`demo_keys` does; None
    when the settings name no admin key variable."""
    env = settings.auth.admin_key_env
    if env is None:
        return None
    if not environ.get(env):
        environ[env] = secrets.token_urlsafe(24)
    return environ[env]


def base_url(settings: Settings) -> str:
    """Where this machine reaches the gateway (a wildcard address means every interface)."""
    host = settings.listen.host
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.listen.port}"


def gateway_command(config: str) -> list[str]:
    return [sys.executable, "-m", "hearthgate.gateway.cli", "serve", "--config", config]


def ready_message(
    settings: Settings,
    keys: dict[str, str],
    admin_key: str | None = None,
    redis: RedisServer | None = None,
) -> str:
    """What ``make run`` prints once the gateway is ready: the keys of this run and
    commands that work when pasted into another terminal as printed; ``redis``: the local
    Redis started for this run, if any."""
    base = base_url(settings)
    gen = next((w.models[0] for w in settings.workers if w.role != "embeddings"), None)
    emb = next((w.models[0] for w in settings.workers if w.role == "embeddings"), None)
    lines = [f"hearthgate is ready at {base}/v1  (status: {base}/status, metrics: {base}/metrics)"]
    if redis is not None:
        lines.append(f"Redis for this run: {redis.url}  (data kept in {redis.data_dir})")
    auth = ""
    if keys:
        by_name = {a.name: a for a in settings.apps}
        width = max(len(n) for n in keys)
        envs = ", ".join(str(by_name[n].key_env) for n in keys)
        lines += ["", f"App keys of this run, new every run (to keep your own, set {envs}):"]
        lines += [f"  {n:<{width}}  {by_name[n].key_env}={k}" for n, k in keys.items()]
        chat_app = next(
            (a.name for a in settings.apps if a.default_class == "chat" and a.name in keys),
            next(iter(keys)),
        )
        lines += [
            "",
            f"In another terminal, as the {chat_app} app (the examples below and the",
            f"README's OpenAI SDK example read {KEY_VAR}):",
            f"  export {KEY_VAR}={keys[chat_app]}",
        ]
        auth = f' -H "Authorization: Bearer ${KEY_VAR}"'
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
    if admin_key is not None:
        lines += [
            "",
            f"Status (admin key, {settings.auth.admin_key_env}):",
            f"  curl {base}/status -H 'Authorization: Bearer {admin_key}'",
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
    problem = settings.exposure_problem()
    if problem is not None:  # the gateway would refuse it: say so before the workers start
        print(f"hearthgate: refusing to serve {args.config}: {problem}", file=sys.stderr)
        return 2
    RUN_DIR.mkdir(exist_ok=True)
    workers = plan_workers(settings)
    redis = plan_redis(settings, dict(os.environ))
    gateway: subprocess.Popen[bytes] | None = None
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_signal)
    try:
        if redis is not None:
            redis.start()
            print(f"started Redis at {redis.url}; data and log in {redis.data_dir}", flush=True)
        names = ", ".join(f"{w.kind} on :{w.port} (core {w.core})" for w in workers)
        print(f"starting workers: {names}; this takes a minute or two", flush=True)
        print(f"worker logs: {RUN_DIR}/vllm-*.log, {RUN_DIR}/tts-*.log", flush=True)
        start_all(workers, timeout=300)
        env = dict(os.environ)
        if redis is not None:
            env[REDIS_URL_VAR] = redis.url
        keys = demo_keys(settings, env)
        admin = demo_admin_key(settings, env)
        for_box = gateway_environment(settings, box.has_avx512())
        if for_box:
            said = " ".join(f"{k}={v}" for k, v in for_box.items())
            print(f"this CPU has no AVX-512: the gateway starts with {said}", flush=True)
        env.update(for_box)
        gateway = subprocess.Popen(gateway_command(args.config), env=env)
        deadline = time.monotonic() + 30
        while True:
            if gateway.poll() is not None:
                print("the gateway exited; see its output above", file=sys.stderr)
                return 1
            try:
                with urllib.request.urlopen(f"{base_url(settings)}/readyz", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    print("the gateway did not become ready in 30 s", file=sys.stderr)
                    return 1
                time.sleep(0.2)
        print("\n" + ready_message(settings, keys, admin, redis) + "\n", flush=True)
        while (
            gateway.poll() is None
            and all(w.running for w in workers)
            and (redis is None or redis.running)
        ):
            time.sleep(0.5)
        print("a process exited unexpectedly; stopping the rest", file=sys.stderr)
        return 1
    except _Stop:
        print("\nstopping...", flush=True)
        return 0
    except WorkerError as exc:
        print(f"a vLLM worker failed to start:\n{exc}", file=sys.stderr)
        return 1
    except RedisServerError as exc:
        print(f"the local Redis failed to start:\n{exc}", file=sys.stderr)
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
        try:
            stop_all(workers)
        finally:
            if redis is not None:
                redis.stop()  # after the gateway, which may still write to it as it stops


if __name__ == "__main__":
    sys.exit(main())
