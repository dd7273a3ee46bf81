"""Scenario model: a YAML file describing a mixed workload, validated into frozen pydantic models.

A scenario has *classes* (SLO targets, vLLM priority, whether the class is interactive), *apps*
(the API key each app sends) and *flows*: a stream of requests of one class from one app, with
an endpoint, prompt and output length distributions, and an arrival process. Two apps in one
class are two flows naming the same class.

`load_scenario` raises `ScenarioError` whose message names the file and the bad key, e.g.
``home-mix.yaml: flows[2].arrival.rate: Input should be greater than 0``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from hearthgate.loadtests.distributions import (
    TAGS,
    ArrivalSpec,
    ConstantArrival,
    FixedLength,
    GammaArrival,
    LengthDist,
    LognormalLength,
    OnOffArrival,
    PoissonArrival,
    TraceLength,
    UniformLength,
    length_shorthand,
)

__all__ = [
    "ArrivalSpec",
    "ClassSpec",
    "ConstantArrival",
    "FixedLength",
    "Flow",
    "GammaArrival",
    "LengthDist",
    "LognormalLength",
    "OnOffArrival",
    "PoissonArrival",
    "Scenario",
    "ScenarioError",
    "Slo",
    "TraceLength",
    "UniformLength",
    "load_scenario",
    "validate_scenario",
]

Endpoint = Literal["chat", "completions", "embeddings"]
ENDPOINT_PATHS: dict[str, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}


class ScenarioError(ValueError):
    """A scenario file that cannot be read or does not validate."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


# ---------------------------------------------------------------- classes, apps, flows


class Slo(_Model):
    """Latency targets of a class. A missing target is not checked.

    `itl_stat` says which inter-token statistic of one request is compared with `itl_s`:
    `tpot` (the default) is the mean gap, (last token - first token) / (output tokens - 1),
    as vLLM's benchmark and VLLM_CPU.md use; `p99_gap` is the request's 99th percentile gap;
    `max_gap` its largest gap. For a non-streamed request "first token" is the full response,
    so only `ttft_s` applies.
    """

    ttft_s: float | None = Field(default=None, gt=0)
    itl_s: float | None = Field(default=None, gt=0)
    itl_stat: Literal["tpot", "p99_gap", "max_gap"] = "tpot"


class ClassSpec(_Model):
    """A request class: its SLO, the vLLM priority a priority-aware client would send (lower
    runs first), whether it counts as interactive (sweeps find the rate at which interactive
    attainment stays >= 90%), and extra headers sent with its requests."""

    slo: Slo = Slo()
    priority: int = 0
    interactive: bool = False
    headers: dict[str, str] = {}


class AppSpec(_Model):
    """An app sending requests, identified by `Authorization: Bearer <key>`.

    The key is the value of environment variable `key_env` when that is set and present,
    otherwise `key`, otherwise the app's name. `weight` is the app's fair-share weight, used
    for the max-min fairness index in the report.
    """

    key: str | None = None
    key_env: str | None = None
    weight: float = Field(default=1.0, gt=0)

    def resolve_key(self, name: str, environ: dict[str, str] | None = None) -> str:
        env = os.environ if environ is None else environ
        if self.key_env and env.get(self.key_env):
            return env[self.key_env]
        return self.key if self.key is not None else name


class Flow(_Model):
    """A stream of requests of one class from one app."""

    name: str | None = None
    klass: str = Field(alias="class")
    app: str
    endpoint: Endpoint
    model: str | None = None
    stream: bool | None = None
    prompt_tokens: LengthDist
    output_tokens: LengthDist | None = None
    arrival: ArrivalSpec
    start_s: float = Field(default=0.0, ge=0)
    stop_s: float | None = Field(default=None, gt=0)
    priority: int | None = None

    @field_validator("prompt_tokens", "output_tokens", mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return length_shorthand(value)

    @model_validator(mode="after")
    def _endpoint_rules(self) -> Flow:
        if self.endpoint == "embeddings":
            if self.output_tokens is not None:
                raise ValueError("output_tokens is not allowed for the embeddings endpoint")
            if self.stream:
                raise ValueError("the embeddings endpoint cannot stream")
        elif self.output_tokens is None:
            raise ValueError(f"output_tokens is required for the {self.endpoint} endpoint")
        if self.stop_s is not None and self.stop_s <= self.start_s:
            raise ValueError(f"stop_s ({self.stop_s}) must be after start_s ({self.start_s})")
        return self

    @property
    def label(self) -> str:
        return self.name or f"{self.klass}/{self.app}"

    @property
    def streams(self) -> bool:
        if self.stream is not None:
            return self.stream
        return self.endpoint != "embeddings"


class Models(_Model):
    """Served model names per endpoint."""

    chat: str = "tiny-llama"
    completions: str = "tiny-llama"
    embeddings: str = "minilm"

    def for_endpoint(self, endpoint: str) -> str:
        return str(getattr(self, endpoint))


class Scenario(_Model):
    """A whole workload. Arrivals run over [0, duration_s); requests scheduled before
    `warmup_s` are sent but left out of the statistics, and throughput is counted over
    [warmup_s, duration_s) (the steady window). Before the clock starts, `prime_requests`
    requests of every flow's shape are sent and discarded, so each shape has been seen."""

    name: str
    description: str = ""
    seed: int = 0
    duration_s: float = Field(gt=0)
    warmup_s: float = Field(default=0.0, ge=0)
    prime_requests: int = Field(default=2, ge=0)
    request_timeout_s: float = Field(default=300.0, gt=0)
    max_model_len: int = Field(default=4096, ge=16)
    models: Models = Models()
    apps: dict[str, AppSpec]
    classes: dict[str, ClassSpec]
    flows: list[Flow] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        if self.warmup_s >= self.duration_s:
            raise ValueError(
                f"warmup_s ({self.warmup_s}) must be shorter than duration_s ({self.duration_s})"
            )
        seen: set[str] = set()
        for i, flow in enumerate(self.flows):
            where = f"flows[{i}]"
            if flow.klass not in self.classes:
                raise ValueError(
                    f"{where}: class {flow.klass!r} is not defined in classes "
                    f"(known: {', '.join(sorted(self.classes)) or 'none'})"
                )
            if flow.app not in self.apps:
                raise ValueError(
                    f"{where}: app {flow.app!r} is not defined in apps "
                    f"(known: {', '.join(sorted(self.apps)) or 'none'})"
                )
            if flow.label in seen:
                raise ValueError(f"{where}: duplicate flow name {flow.label!r}; set `name`")
            seen.add(flow.label)
            if flow.start_s >= self.duration_s:
                raise ValueError(f"{where}: start_s is not before duration_s")
            longest = flow.prompt_tokens.upper() + (
                flow.output_tokens.upper() if flow.output_tokens is not None else 0
            )
            if longest > self.max_model_len:
                raise ValueError(
                    f"{where}: longest prompt + output ({longest} tokens) exceeds "
                    f"max_model_len ({self.max_model_len})"
                )
        return self

    def model_for(self, flow: Flow) -> str:
        return flow.model or self.models.for_endpoint(flow.endpoint)

    def priority_for(self, flow: Flow) -> int:
        return flow.priority if flow.priority is not None else self.classes[flow.klass].priority

    def with_overrides(
        self,
        *,
        rate_scale: float | None = None,
        duration_s: float | None = None,
        warmup_s: float | None = None,
        seed: int | None = None,
        classes: set[str] | None = None,
        without: set[str] | None = None,
        without_apps: set[str] | None = None,
        apps: set[str] | None = None,
    ) -> Scenario:
        """A copy with rates multiplied (for the flows of `classes` and of `apps`, or all),
        the run length or seed replaced, and the classes in `without` and the apps in
        `without_apps` left out (a solo run of the others). Flow time bounds are kept;
        ones past the new duration drop."""
        data = self.model_dump(by_alias=True)
        for key, field, what, names in (
            ("classes", "class", "class", without),
            ("apps", "app", "app", without_apps),
        ):
            if not names:
                continue
            unknown = sorted(names - set(data[key]))
            if unknown:
                raise ScenarioError(f"no such {what} to leave out: {', '.join(unknown)}")
            data["flows"] = [f for f in data["flows"] if f[field] not in names]
            data[key] = {k: v for k, v in data[key].items() if k not in names}
        if duration_s is not None:
            data["duration_s"] = duration_s
            if warmup_s is None and self.warmup_s >= duration_s:
                data["warmup_s"] = 0.0
        if warmup_s is not None:
            data["warmup_s"] = warmup_s
        if seed is not None:
            data["seed"] = seed
        if rate_scale is not None:
            if not rate_scale > 0 or math.isinf(rate_scale):
                raise ScenarioError(f"rate scale must be a positive number, got {rate_scale}")
            for flow in data["flows"]:
                if (classes is None or flow["class"] in classes) and (
                    apps is None or flow["app"] in apps
                ):
                    flow["arrival"]["rate"] *= rate_scale
        data["flows"] = [f for f in data["flows"] if f["start_s"] < data["duration_s"]]
        return validate_scenario(data, source=self.name)


def _format_loc(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    prev: int | str | None = None
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in TAGS and prev in {"arrival", "prompt_tokens", "output_tokens"}:
            pass  # pydantic puts the union tag in the path; the key is what the user wrote
        else:
            parts.append(("." if parts else "") + item)
        prev = item
    return "".join(parts)


def format_validation_error(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        loc = _format_loc(tuple(e["loc"]))
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"{source}: {loc + ': ' if loc else ''}{msg}")
    return "\n".join(lines)


def validate_scenario(
    data: Any, *, source: str = "<scenario>", base_dir: Path | None = None
) -> Scenario:
    """Validate already-parsed data; raise `ScenarioError` naming the bad key."""
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: expected a mapping at the top level")
    try:
        return Scenario.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as err:
        raise ScenarioError(format_validation_error(err, source)) from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario YAML file. A bare name such as `home-mix` is looked up
    among the scenarios shipped in `loadtests/scenarios/`."""
    p = resolve_scenario_path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as err:
        raise ScenarioError(f"{p}: cannot read: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise ScenarioError(f"{p.name}: invalid YAML: {err}") from None
    return validate_scenario(data, source=p.name, base_dir=p.parent)


SHIPPED_DIR = Path(__file__).parent / "scenarios"


def resolve_scenario_path(path: str | Path) -> Path:
    p = Path(path)
    if p.exists():
        return p
    shipped = SHIPPED_DIR / (p.name if p.suffix else f"{p.name}.yaml")
    if shipped.exists():
        return shipped
    raise ScenarioError(
        f"{path}: no such scenario file (shipped: "
        + ", ".join(sorted(s.stem for s in SHIPPED_DIR.glob("*.yaml")))
        + ")"
    )
