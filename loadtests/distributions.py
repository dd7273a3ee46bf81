"""Value models of the scenario file: token length distributions and arrival processes.

Frozen pydantic models, each a tagged variant (`dist:` for lengths, `process:` for arrivals);
the sampling code lives in `loadtests.lengths` and `loadtests.arrivals`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


# ---------------------------------------------------------------- length distributions


class FixedLength(_Model):
    """Always `value` tokens."""

    dist: Literal["fixed"] = "fixed"
    value: int = Field(ge=1)

    def upper(self) -> int:
        return self.value


class UniformLength(_Model):
    """Uniform integer in [min, max], both inclusive."""

    dist: Literal["uniform"]
    min: int = Field(ge=1)
    max: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> UniformLength:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self

    def upper(self) -> int:
        return self.max


class LognormalLength(_Model):
    """Lognormal with the given median and shape sigma, rounded and clamped to [min, max]."""

    dist: Literal["lognormal"]
    median: float = Field(gt=0)
    sigma: float = Field(ge=0)
    min: int = Field(default=1, ge=1)
    max: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> LognormalLength:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        if not self.min <= self.median <= self.max:
            raise ValueError(f"median ({self.median}) must lie within [min, max]")
        return self

    def upper(self) -> int:
        return self.max


class TraceLength(_Model):
    """Sampled from one column of a CSV trace (header row required).

    When a flow's prompt and output lengths both come from the same file, one row is drawn per
    request for both, keeping the input/output pairing of the trace. A relative `path` is
    resolved against the scenario file's folder.
    """

    dist: Literal["trace"]
    path: str
    column: str

    @field_validator("path")
    @classmethod
    def _resolve(cls, value: str, info: ValidationInfo) -> str:
        path = Path(value)
        base = info.context.get("base_dir") if isinstance(info.context, dict) else None
        if not path.is_absolute() and base is not None:
            path = Path(base) / path
        if not path.is_file():
            raise ValueError(f"trace file not found: {path}")
        return str(path)

    def upper(self) -> int:
        from hearthgate.loadtests.lengths import trace_column

        return max(trace_column(self.path, self.column))


LengthDist = Annotated[
    FixedLength | UniformLength | LognormalLength | TraceLength, Field(discriminator="dist")
]


def length_shorthand(value: Any) -> Any:
    """Allow `prompt_tokens: 40` as shorthand for `{dist: fixed, value: 40}`."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {"dist": "fixed", "value": value}
    return value


# ---------------------------------------------------------------- arrival processes


class PoissonArrival(_Model):
    """Exponential inter-arrival times, mean rate `rate` per second."""

    process: Literal["poisson"]
    rate: float = Field(gt=0)

    def mean_rate(self) -> float:
        return self.rate


class GammaArrival(_Model):
    """Gamma inter-arrival times with shape `burstiness` and mean 1/rate (vLLM's convention).

    burstiness 1 is Poisson; below 1 is burstier (inter-arrival CV = 1/sqrt(burstiness)),
    above 1 more regular.
    """

    process: Literal["gamma"]
    rate: float = Field(gt=0)
    burstiness: float = Field(gt=0)

    def mean_rate(self) -> float:
        return self.rate


class ConstantArrival(_Model):
    """One request every 1/rate seconds, the first at 1/rate after the flow starts."""

    process: Literal["constant"]
    rate: float = Field(gt=0)

    def mean_rate(self) -> float:
        return self.rate


class OnOffArrival(_Model):
    """Bursts: `on_s` seconds at `rate` (Poisson or constant inside), then `off_s` silent."""

    process: Literal["onoff"]
    rate: float = Field(gt=0)
    on_s: float = Field(gt=0)
    off_s: float = Field(ge=0)
    inner: Literal["poisson", "constant"] = "poisson"
    start_on: bool = True

    def mean_rate(self) -> float:
        return self.rate * self.on_s / (self.on_s + self.off_s)


ArrivalSpec = Annotated[
    PoissonArrival | GammaArrival | ConstantArrival | OnOffArrival,
    Field(discriminator="process"),
]

TAGS = {"fixed", "uniform", "lognormal", "trace", "poisson", "gamma", "constant", "onoff"}
