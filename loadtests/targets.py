"""Targets of a comparison: what a targets file lists (``loadtests.launcher`` brings each up).

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

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hearthgate.deploy import box
from hearthgate.deploy.run_local import gateway_defaults, worker_flags
from hearthgate.gateway.settings import Worker as SettingsWorker
from hearthgate.loadtests.scenario import format_validation_error

REPO_ROOT = Path(__file__).resolve().parents[1]
SHIPPED_TARGETS = Path(__file__).parent / "targets"


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
    # Every process of each vLLM worker on the worker's core (the default, as make run
    # starts them); false: only vLLM's compute threads there, its engine-core and API
    # server processes free to run on any core (how every bench ran before 2026-12-06).
    pin_worker_sessions: bool = True
    # Each generation worker's API server process (not the engine core or compute threads
    # it started) moves to these cores once the worker is ready; None: it stays.
    api_server_core: int | str | None = None
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
