"""Targets of a comparison and the launcher that brings each one up.

A targets file (YAML) lists what to measure, in order:

- `kind: vllm`: vLLM alone. The generation worker(s) (and an embeddings worker when the
  scenario has embeddings flows) are started through `deploy/vllm_worker.py` with the target's
  extra `worker_args`; `send_priority: true` makes the client send each class's vLLM priority.
  With several generation workers (`gen_workers`), vLLM alone sits behind a round-robin split:
  request i of the planned workload goes to worker i mod n (see `runner.Endpoints`).
- `kind: gateway`: the same workers plus `hearthgate serve` in front, from a settings file
  (`config`) and/or inline `settings` (merged over the file), whose `listen` and `workers`
  are filled in by the launcher: one settings worker per generation worker, with the role
  and limits the target's `workers` entry gives it.
- `kind: url`: something already running; nothing is started.

Workers are restarted only when the next target needs different flags, so targets sharing
flags (vLLM fcfs and the gateway, say) share one warm worker.
"""

from __future__ import annotations

import copy
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

from hearthgate.deploy import box
from hearthgate.deploy.run_local import gateway_defaults, worker_flags
from hearthgate.gateway.settings import Worker as SettingsWorker
from hearthgate.loadtests.runner import Endpoints
from hearthgate.loadtests.scenario import format_validation_error

REPO_ROOT = Path(__file__).resolve().parents[1]
SHIPPED_TARGETS = Path(__file__).parent / "targets"
# `hearthgate serve` through the current interpreter (the console script may not be installed).
GATEWAY_COMMAND = [sys.executable, "-m", "hearthgate.gateway.cli", "serve", "--config", "{config}"]


class TargetError(RuntimeError):
    """A targets file that does not validate, or a target that could not be brought up."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorkerPlacement(_Model):
    # The generation worker's name in gateway settings and `workers:` of a target (default
    # gen0, gen1, ... in order); unused for the embeddings worker.
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+$")
    port: int = Field(ge=1, le=65535)
    core: int | str
    nice: int = Field(default=0, ge=0, le=19)


class TargetWorker(_Model):
    """A target's settings for one generation worker (by name)."""

    # vLLM flags of this worker instead of the target's `worker_args` (None: those).
    worker_args: list[str] | None = None
    # gateway targets only: the worker's role and its limits (merged over `worker_limits`
    # of the settings; a key set to null removes it).
    role: Literal["general", "long_prefill"] = "general"
    limits: dict[str, Any] | None = None


class TargetSpec(_Model):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    kind: Literal["vllm", "gateway", "url"]
    description: str = ""
    worker_args: list[str] = []
    # Each generation worker starts with the flags `make run` gives a worker of its role on
    # this box (deploy/run_local.py `worker_flags`, which depend on the CPU) ahead of its
    # `worker_args`, and a gateway target's settings go over those `make run` gives the
    # gateway on this box (`gateway_defaults`), so a target follows the shipped worker and
    # gateway on whatever box it runs on.
    make_run_flags: bool = False
    embed_worker_args: list[str] = []
    # per generation worker (by name): flags, and for gateway targets role and limits
    workers: dict[str, TargetWorker] = {}
    send_priority: bool = False
    headers: dict[str, str] = {}
    # gateway
    config: str | None = None
    settings: dict[str, Any] | None = None
    command: list[str] | None = None
    # A fresh gateway for every point of a matrix round; the default (false) is one gateway
    # that lives through the round's points, as a gateway lives for days at home.
    gateway_per_point: bool = False
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
        if self.kind != "gateway" and (
            self.config or self.settings or self.command or self.gateway_per_point
        ):
            raise ValueError(
                "`config`, `settings`, `command` and `gateway_per_point` are only for kind gateway"
            )
        if self.kind == "url" and (self.workers or self.make_run_flags):
            raise ValueError("`workers` and `make_run_flags` are not for kind url")
        if self.kind != "gateway":
            odd = sorted(
                n for n, w in self.workers.items() if w.role != "general" or w.limits is not None
            )
            if odd:
                raise ValueError(
                    f"workers {', '.join(odd)}: `role` and `limits` are only for kind gateway"
                )
        return self

    def args_for(self, worker: str) -> list[str]:
        """The vLLM flags of generation worker `worker` for this target."""
        own = self.workers.get(worker)
        args = self.worker_args if own is None or own.worker_args is None else own.worker_args
        return self.make_run_args("general" if own is None else own.role) + list(args)

    def make_run_args(self, role: Literal["general", "long_prefill"] = "general") -> list[str]:
        """The flags `make run` gives a worker of `role` on this box, if `make_run_flags`."""
        if not self.make_run_flags:
            return []
        url = "http://127.0.0.1:8000"
        return worker_flags(SettingsWorker(name="w", url=url, models=["m"], role=role))

    def make_run_settings(self) -> dict[str, Any]:
        """The settings `make run` gives the gateway on this box, if `make_run_flags`."""
        if not self.make_run_flags or self.kind != "gateway":
            return {}
        return gateway_defaults(box.has_avx512())

    def describe(self) -> str:
        if self.kind == "url":
            return f"url {self.url}"
        flags = " ".join(self.make_run_args() + self.worker_args) or "default flags"
        prio = ", client sends priorities" if self.send_priority else ""
        front = "hearthgate in front of " if self.kind == "gateway" else ""
        per = "; ".join(
            f"{n}: {w.role}" + (f" {' '.join(w.worker_args)}" if w.worker_args is not None else "")
            for n, w in self.workers.items()
        )
        return f"{front}vLLM ({flags}){prio}" + (f" [{per}]" if per else "")


class TargetsFile(_Model):
    # One generation worker (`gen_worker`) or several (`gen_workers`, a list), not both.
    gen_worker: WorkerPlacement = WorkerPlacement(port=18210, core=1)
    gen_workers: list[WorkerPlacement] | None = Field(default=None, min_length=1)
    embed_worker: WorkerPlacement = WorkerPlacement(port=18211, core=0)
    gateway_port: int = Field(default=18220, ge=1, le=65535)
    # CPU cores for the gateway process and for the load generator itself (None: unpinned).
    gateway_core: int | None = Field(default=None, ge=0)
    client_core: int | None = Field(default=None, ge=0)
    run_dir: str = ".run/bench"
    start_timeout_s: float = Field(default=300.0, gt=0)
    targets: list[TargetSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> TargetsFile:
        names = [t.name for t in self.targets]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"target names must be unique, repeated: {', '.join(dup)}")
        if self.gen_workers is not None and "gen_worker" in self.model_fields_set:
            raise ValueError("give either `gen_worker` or `gen_workers`, not both")
        gens = self.generation_workers()
        gen_names = [w.name for w in gens]
        dup = sorted({str(n) for n in gen_names if gen_names.count(n) > 1})
        if dup:
            raise ValueError(f"generation worker names must be unique, repeated: {', '.join(dup)}")
        ports = [w.port for w in gens] + [self.embed_worker.port, self.gateway_port]
        clash = sorted({p for p in ports if ports.count(p) > 1})
        if clash:
            raise ValueError(f"workers and gateway need distinct ports, repeated: {clash}")
        for t in self.targets:
            unknown = sorted(set(t.workers) - set(str(n) for n in gen_names))
            if unknown:
                raise ValueError(
                    f"target {t.name}: workers: no generation worker named {', '.join(unknown)} "
                    f"(workers: {', '.join(str(n) for n in gen_names)})"
                )
        return self

    def generation_workers(self) -> list[WorkerPlacement]:
        """The generation workers in order, each with its name (default gen0, gen1, ...)."""
        listed = self.gen_workers if self.gen_workers is not None else [self.gen_worker]
        return [
            w if w.name else w.model_copy(update={"name": f"gen{i}"}) for i, w in enumerate(listed)
        ]


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
    ) -> Worker: ...


def _vllm_worker(
    kind: str, port: int, core: int | str, log: Path, args: Sequence[str], nice: int = 0
) -> Worker:
    from hearthgate.deploy.vllm_worker import VllmWorker

    if kind not in ("gen", "embed"):
        raise ValueError(kind)
    return VllmWorker("gen" if kind == "gen" else "embed", port, core, log, args, nice=nice)


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
            f"nice {place.nice} "
            f"({' '.join(args) or 'default flags'}), log {log}"
        )
        worker = self.worker_factory(kind, place.port, place.core, log, args, nice=place.nice)
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
                self._gens.get(name), "gen", place, target.args_for(name)
            )
        if self.need_embed:
            self._embed = self._ensure(
                self._embed, "embed", self.spec.embed_worker, target.embed_worker_args
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
        cmd = [
            part.replace("{config}", str(cfg))
            for part in (
                target.command
                or [sys.executable, "-m", "hearthgate.gateway.cli", "serve", "--config", "{config}"]
            )
        ]
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
        for slot in (*self._gens.values(), self._embed):
            if slot is not None:
                slot[1].stop()
        self._gens = {}
        self._embed = None
