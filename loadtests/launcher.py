"""The launcher that brings the targets of a comparison up one after another
(``loadtests.targets``): vLLM workers through ``deploy/vllm_worker.py``, reused while their
flags do not change, and ``hearthgate serve`` in front for gateway targets."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import yaml

from hearthgate.deploy.gateway_process import wait_http
from hearthgate.loadtests.runner import Endpoints
from hearthgate.loadtests.targets import (
    REPO_ROOT,
    TargetError,
    TargetsFile,
    TargetSpec,
    TargetWorker,
    WorkerPlacement,
)

# `hearthgate serve` through the current interpreter (the console script may not be installed).
GATEWAY_COMMAND = [sys.executable, "-m", "hearthgate.gateway.cli", "serve", "--config", "{config}"]


class Worker(Protocol):
    """What the launcher needs of `deploy.vllm_worker.VllmWorker`."""

    @property
    def url(self) -> str: ...

    def start(self) -> None: ...

    def wait_ready(self, timeout: float = ..., interval: float = ...) -> float: ...

    def stop(self, timeout: float = ...) -> int | None: ...


class WorkerFactory(Protocol):
    """Makes the worker the launcher starts (tests pass a fake one)."""

    def __call__(
        self,
        kind: str,
        port: int,
        core: int | str,
        log: Path,
        args: Sequence[str],
        nice: int = 0,
        pin_session: bool = True,
        api_server_core: int | str | None = None,
    ) -> Worker: ...


def _vllm_worker(
    kind: str,
    port: int,
    core: int | str,
    log: Path,
    args: Sequence[str],
    nice: int = 0,
    pin_session: bool = True,
    api_server_core: int | str | None = None,
) -> Worker:
    from hearthgate.deploy.vllm_worker import VllmWorker

    if kind not in ("gen", "embed"):
        raise ValueError(kind)
    return VllmWorker(
        "gen" if kind == "gen" else "embed",
        port,
        core,
        log,
        args,
        nice=nice,
        pin_session=pin_session,
        api_server_core=api_server_core,
    )


def _uses_priority_policy(args: Sequence[str]) -> bool:
    for i, a in enumerate(args):
        if a == "--scheduling-policy" and i + 1 < len(args) and args[i + 1] == "priority":
            return True
        if a == "--scheduling-policy=priority":
            return True
    return False


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` merged into `base`, recursively for mappings (`over` wins)."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


class Launcher:
    """Brings targets up one after another, reusing workers whose flags did not change.
    Always `close()` it (or use it as a context manager): it stops what it started."""

    def __init__(
        self,
        spec: TargetsFile,
        *,
        need_embed: bool,
        env: dict[str, str] | None = None,
        worker_factory: WorkerFactory = _vllm_worker,
        log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True),
    ) -> None:
        self.spec = spec
        self.need_embed = need_embed
        self.env = dict(env or {})
        self.worker_factory = worker_factory
        self.log = log
        self.run_dir = (REPO_ROOT / spec.run_dir).resolve()
        # generation workers by name, in the targets file's order
        self._gens: dict[str, tuple[tuple[str, ...], Worker]] = {}
        self._embed: tuple[tuple[str, ...], Worker] | None = None
        self._gateway: subprocess.Popen[bytes] | None = None
        self.restarted = False
        """Whether the last `up()` (re)started a worker: the caller should warm it up."""

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ensure(
        self,
        current: tuple[tuple[str, ...], Worker] | None,
        kind: str,
        place: WorkerPlacement,
        args: Sequence[str],
        pin_session: bool = True,
        api_server_core: int | str | None = None,
    ) -> tuple[tuple[str, ...], Worker]:
        key = (*args, f"pin_session={pin_session}", f"api_server_core={api_server_core}")
        if current is not None and current[0] == key:
            return current
        if current is not None:
            self.log(f"bench: stopping {kind} worker")
            current[1].stop()
        log = self.run_dir / f"vllm-{kind}-{place.port}.log"
        self.log(
            f"bench: starting {kind} worker on port {place.port} core {place.core} "
            f"nice {place.nice}{'' if pin_session else ' (compute threads only)'}"
            f"{'' if api_server_core is None else f', API server on {api_server_core}'} "
            f"({' '.join(args) or 'default flags'}), log {log}"
        )
        worker = self.worker_factory(
            kind,
            place.port,
            place.core,
            log,
            args,
            nice=place.nice,
            pin_session=pin_session,
            api_server_core=api_server_core,
        )
        worker.start()
        self.restarted = True
        return key, worker

    def up(self, target: TargetSpec) -> Endpoints:
        """Start (or reuse) what `target` needs and return where to send requests."""
        self.restarted = False
        self._stop_gateway()
        if target.kind == "url":
            assert target.url is not None
            return Endpoints(
                name=target.name,
                base_url=target.url,
                embed_url=target.embed_url,
                headers=target.headers,
                send_priority=target.send_priority,
                worker_metrics=target.worker_metrics,
                embed_metrics=target.embed_metrics,
                gateway_metrics=target.gateway_metrics,
            )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for place in self.spec.generation_workers():
            name = str(place.name)
            self._gens[name] = self._ensure(
                self._gens.get(name),
                "gen",
                place,
                target.args_for(name),
                target.pin_worker_sessions,
                target.api_server_core,
            )
        if self.need_embed:
            self._embed = self._ensure(
                self._embed,
                "embed",
                self.spec.embed_worker,
                target.embed_worker_args,
                target.pin_worker_sessions,
            )
        started = [slot[1] for slot in (*self._gens.values(), self._embed) if slot is not None]
        if self.restarted:
            t = time.monotonic()
            for w in started:
                w.wait_ready(timeout=self.spec.start_timeout_s)
            self.log(f"bench: workers ready after {time.monotonic() - t:.0f} s")
        gen_urls = {name: slot[1].url for name, slot in self._gens.items()}
        first, *rest = gen_urls.values()
        embed_url = self._embed[1].url if self._embed is not None else None
        if target.kind == "vllm":
            return Endpoints(
                name=target.name,
                base_url=first,
                # several workers: vLLM alone behind a round-robin split
                base_urls=tuple(gen_urls.values()) if rest else (),
                embed_url=embed_url,
                headers=target.headers,
                send_priority=target.send_priority,
                worker_metrics=first + "/metrics",
                more_worker_metrics=tuple(u + "/metrics" for u in rest),
                embed_metrics=embed_url + "/metrics" if embed_url else None,
            )
        url = self._start_gateway(target, gen_urls, embed_url)
        return Endpoints(
            name=target.name,
            base_url=url,
            headers=target.headers,
            send_priority=target.send_priority,
            worker_metrics=first + "/metrics",
            more_worker_metrics=tuple(u + "/metrics" for u in rest),
            embed_metrics=embed_url + "/metrics" if embed_url else None,
            gateway_metrics=url + "/metrics",
        )

    def gateway_settings(
        self, target: TargetSpec, gen_urls: str | dict[str, str], embed_url: str | None
    ) -> dict[str, Any]:
        """The target's settings with `listen` and `workers` pointing at what was started:
        `gen_urls` maps each generation worker's name to its URL (a single URL: gen0). The
        settings' `worker_limits` apply to every generation worker, under the target's own
        per-worker `limits`."""
        if isinstance(gen_urls, str):
            gen_urls = {"gen0": gen_urls}
        base = target.make_run_settings()
        if target.config:
            base = _merge(base, yaml.safe_load((REPO_ROOT / target.config).read_text()) or {})
        base = _merge(base, dict(target.settings or {}))
        gen_limits = base.pop("worker_limits", None) or {}
        workers: list[dict[str, Any]] = []
        for name, gen_url in gen_urls.items():
            own = target.workers.get(name, TargetWorker())
            limits = {
                k: copy.deepcopy(v)
                for k, v in {**gen_limits, **(own.limits or {})}.items()
                if v is not None
            }
            workers.append(
                {
                    "name": name,
                    "url": gen_url,
                    "models": ["tiny-llama"],
                    "role": own.role,
                    "priority_scheduling": _uses_priority_policy(target.args_for(name)),
                    "limits": limits,
                }
            )
        if embed_url:
            workers.append(
                {"name": "emb0", "url": embed_url, "models": ["minilm"], "role": "embeddings"}
            )
        return {
            **base,
            "listen": {"host": "127.0.0.1", "port": self.spec.gateway_port},
            "workers": workers,
        }

    def _start_gateway(
        self, target: TargetSpec, gen_urls: dict[str, str], embed_url: str | None
    ) -> str:
        cfg = self.run_dir / f"gateway-{target.name}.yaml"
        cfg.write_text(yaml.safe_dump(self.gateway_settings(target, gen_urls, embed_url)))
        cmd = [part.replace("{config}", str(cfg)) for part in (target.command or GATEWAY_COMMAND)]
        log_path = self.run_dir / f"gateway-{target.name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTHGATE_")}
        env.update(self.env)
        self.log(f"bench: starting gateway: {' '.join(cmd)} (log {log_path})")
        core = self.spec.gateway_core
        with log_path.open("ab") as log:
            self._gateway = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=str(REPO_ROOT),
                preexec_fn=None if core is None else lambda: os.sched_setaffinity(0, {core}),
            )
        url = f"http://127.0.0.1:{self.spec.gateway_port}"
        try:
            wait_http(url + "/readyz", 60.0, self._gateway)
        except (RuntimeError, TimeoutError) as err:
            self._stop_gateway()
            raise TargetError(f"gateway did not come up: {err}; log {log_path}") from None
        return url

    def _stop_gateway(self) -> None:
        proc, self._gateway = self._gateway, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def close(self) -> None:
        self._stop_gateway()
        for slot in (*self._gens.values(), self._embed):
            if slot is not None:
                slot[1].stop()
        self._gens = {}
        self._embed = None
