"""Targets of a comparison and the launcher that brings each one up.

A targets file (YAML) lists what to measure, in order:

- `kind: vllm`: vLLM alone. A generation worker (and an embeddings worker when the scenario
  has embeddings flows) is started through `deploy/vllm_worker.py` with the target's extra
  `worker_args`; `send_priority: true` makes the client send each class's vLLM priority.
- `kind: gateway`: the same workers plus `hearthgate serve` in front, from a settings file
  (or inline `settings`) whose `listen` and `workers` are filled in by the launcher.
- `kind: url`: something already running; nothing is started.

Workers are restarted only when the next target needs different flags, so targets sharing
flags (vLLM fcfs and the gateway, say) share one warm worker.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from loadtests.runner import Endpoints
from loadtests.scenario import format_validation_error

REPO_ROOT = Path(__file__).resolve().parents[1]
SHIPPED_TARGETS = Path(__file__).parent / "targets"
# `hearthgate serve` through the current interpreter (the console script may not be installed).
GATEWAY_COMMAND = [sys.executable, "-m", "gateway.cli", "serve", "--config", "{config}"]


class TargetError(RuntimeError):
    """A targets file that does not validate, or a target that could not be brought up."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorkerPlacement(_Model):
    port: int = Field(ge=1, le=65535)
    core: int | str


class TargetSpec(_Model):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    kind: Literal["vllm", "gateway", "url"]
    description: str = ""
    worker_args: list[str] = []
    embed_worker_args: list[str] = []
    send_priority: bool = False
    headers: dict[str, str] = {}
    # gateway
    config: str | None = None
    settings: dict[str, Any] | None = None
    command: list[str] | None = None
    # url
    url: str | None = None
    embed_url: str | None = None
    worker_metrics: str | None = None
    embed_metrics: str | None = None
    gateway_metrics: str | None = None

    @model_validator(mode="after")
    def _kind_fields(self) -> TargetSpec:
        if self.kind == "url" and not self.url:
            raise ValueError("a target of kind url needs `url`")
        if self.kind != "url" and self.url:
            raise ValueError(f"`url` is only for kind url (this target is {self.kind})")
        if self.kind != "gateway" and (self.config or self.settings or self.command):
            raise ValueError("`config`, `settings` and `command` are only for kind gateway")
        if self.config and self.settings:
            raise ValueError("give either `config` or `settings`, not both")
        return self

    def describe(self) -> str:
        if self.kind == "url":
            return f"url {self.url}"
        flags = " ".join(self.worker_args) or "default flags"
        prio = ", client sends priorities" if self.send_priority else ""
        front = "hearthgate in front of " if self.kind == "gateway" else ""
        return f"{front}vLLM ({flags}){prio}"


class TargetsFile(_Model):
    gen_worker: WorkerPlacement = WorkerPlacement(port=18210, core=1)
    embed_worker: WorkerPlacement = WorkerPlacement(port=18211, core=0)
    gateway_port: int = Field(default=18220, ge=1, le=65535)
    run_dir: str = ".run/bench"
    start_timeout_s: float = Field(default=300.0, gt=0)
    targets: list[TargetSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> TargetsFile:
        names = [t.name for t in self.targets]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"target names must be unique, repeated: {', '.join(dup)}")
        return self


def load_targets(path: str | Path) -> TargetsFile:
    """Read a targets file; a bare name (`local`) is looked up in `loadtests/targets/`."""
    p = Path(path)
    if not p.exists():
        shipped = SHIPPED_TARGETS / (p.name if p.suffix else f"{p.name}.yaml")
        if not shipped.exists():
            raise TargetError(f"{path}: no such targets file")
        p = shipped
    try:
        data = yaml.safe_load(p.read_text())
        return TargetsFile.model_validate(data)
    except yaml.YAMLError as err:
        raise TargetError(f"{p.name}: invalid YAML: {err}") from None
    except ValidationError as err:
        raise TargetError(format_validation_error(err, p.name)) from None


def url_target(name: str, url: str, **kw: Any) -> TargetSpec:
    return TargetSpec(name=name, kind="url", url=url, **kw)


# ---------------------------------------------------------------- launching


class Worker(Protocol):
    """What the launcher needs of `deploy.vllm_worker.VllmWorker`."""

    @property
    def url(self) -> str: ...

    def start(self) -> None: ...

    def wait_ready(self, timeout: float = ..., interval: float = ...) -> float: ...

    def stop(self, timeout: float = ...) -> int | None: ...


WorkerFactory = Callable[[str, int, "int | str", Path, Sequence[str]], Worker]


def _vllm_worker(kind: str, port: int, core: int | str, log: Path, args: Sequence[str]) -> Worker:
    from deploy.vllm_worker import VllmWorker

    if kind not in ("gen", "embed"):
        raise ValueError(kind)
    return VllmWorker("gen" if kind == "gen" else "embed", port, core, log, args)


def _uses_priority_policy(args: Sequence[str]) -> bool:
    for i, a in enumerate(args):
        if a == "--scheduling-policy" and i + 1 < len(args) and args[i + 1] == "priority":
            return True
        if a == "--scheduling-policy=priority":
            return True
    return False


def _wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise TargetError(f"process for {url} exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.3)
    raise TargetError(f"{url} not ready after {timeout:.0f} s")


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
        self._gen: tuple[tuple[str, ...], Worker] | None = None
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
    ) -> tuple[tuple[str, ...], Worker]:
        key = tuple(args)
        if current is not None and current[0] == key:
            return current
        if current is not None:
            self.log(f"bench: stopping {kind} worker")
            current[1].stop()
        log = self.run_dir / f"vllm-{kind}-{place.port}.log"
        self.log(
            f"bench: starting {kind} worker on port {place.port} core {place.core} "
            f"({' '.join(args) or 'default flags'}), log {log}"
        )
        worker = self.worker_factory(kind, place.port, place.core, log, args)
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
        self._gen = self._ensure(self._gen, "gen", self.spec.gen_worker, target.worker_args)
        if self.need_embed:
            self._embed = self._ensure(
                self._embed, "embed", self.spec.embed_worker, target.embed_worker_args
            )
        started = [slot[1] for slot in (self._gen, self._embed) if slot is not None]
        if self.restarted:
            t = time.monotonic()
            for w in started:
                w.wait_ready(timeout=self.spec.start_timeout_s)
            self.log(f"bench: workers ready after {time.monotonic() - t:.0f} s")
        gen_url = self._gen[1].url
        embed_url = self._embed[1].url if self._embed is not None else None
        if target.kind == "vllm":
            return Endpoints(
                name=target.name,
                base_url=gen_url,
                embed_url=embed_url,
                headers=target.headers,
                send_priority=target.send_priority,
                worker_metrics=gen_url + "/metrics",
                embed_metrics=embed_url + "/metrics" if embed_url else None,
            )
        url = self._start_gateway(target, gen_url, embed_url)
        return Endpoints(
            name=target.name,
            base_url=url,
            headers=target.headers,
            send_priority=target.send_priority,
            worker_metrics=gen_url + "/metrics",
            embed_metrics=embed_url + "/metrics" if embed_url else None,
            gateway_metrics=url + "/metrics",
        )

    def gateway_settings(
        self, target: TargetSpec, gen_url: str, embed_url: str | None
    ) -> dict[str, Any]:
        """The target's settings with `listen` and `workers` pointing at what was started."""
        if target.config:
            base = yaml.safe_load((REPO_ROOT / target.config).read_text()) or {}
        else:
            base = dict(target.settings or {})
        gen_limits = base.pop("worker_limits", None) or {}
        workers: list[dict[str, Any]] = [
            {
                "name": "gen0",
                "url": gen_url,
                "models": ["tiny-llama"],
                "role": "general",
                "priority_scheduling": _uses_priority_policy(target.worker_args),
                "limits": gen_limits,
            }
        ]
        if embed_url:
            workers.append(
                {"name": "emb0", "url": embed_url, "models": ["minilm"], "role": "embeddings"}
            )
        return {
            **base,
            "listen": {"host": "127.0.0.1", "port": self.spec.gateway_port},
            "workers": workers,
        }

    def _start_gateway(self, target: TargetSpec, gen_url: str, embed_url: str | None) -> str:
        cfg = self.run_dir / f"gateway-{target.name}.yaml"
        cfg.write_text(yaml.safe_dump(self.gateway_settings(target, gen_url, embed_url)))
        cmd = [
            part.replace("{config}", str(cfg))
            for part in (
                target.command
                or [sys.executable, "-m", "gateway.cli", "serve", "--config", "{config}"]
            )
        ]
        log_path = self.run_dir / f"gateway-{target.name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTHGATE_")}
        env.update(self.env)
        self.log(f"bench: starting gateway: {' '.join(cmd)} (log {log_path})")
        with log_path.open("ab") as log:
            self._gateway = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=str(REPO_ROOT),
            )
        url = f"http://127.0.0.1:{self.spec.gateway_port}"
        try:
            _wait_http(url + "/readyz", 60.0, self._gateway)
        except TargetError as err:
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
        for slot in (self._gen, self._embed):
            if slot is not None:
                slot[1].stop()
        self._gen = self._embed = None
