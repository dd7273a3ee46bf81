"""Arrival processes: scheduled send times drawn from an injected, seeded `random.Random`.

Every function is pure given its generator: the same seed gives the same schedule on every
machine, so the same workload can be replayed against several targets.
"""

from __future__ import annotations

import random

from hearthgate.loadtests.scenario import (
    ArrivalSpec,
    ConstantArrival,
    GammaArrival,
    OnOffArrival,
    PoissonArrival,
)


def _gaps_until(
    next_gap: _GapFn,
    start: float,
    end: float,
) -> list[float]:
    """Times start + g1, start + g1 + g2, ... strictly before `end`."""
    times: list[float] = []
    t = start + next_gap()
    while t < end:
        times.append(t)
        t += next_gap()
    return times


class _GapFn:
    """Callable drawing one inter-arrival gap."""

    def __init__(self, kind: str, rate: float, rng: random.Random, burstiness: float = 1.0):
        self.kind = kind
        self.rate = rate
        self.rng = rng
        self.shape = burstiness
        self.scale = 1.0 / (rate * burstiness)

    def __call__(self) -> float:
        if self.kind == "poisson":
            return self.rng.expovariate(self.rate)
        if self.kind == "gamma":
            return self.rng.gammavariate(self.shape, self.scale)
        return 1.0 / self.rate  # constant


def arrival_times(spec: ArrivalSpec, rng: random.Random, start: float, end: float) -> list[float]:
    """Send times in [start, end), in increasing order, for one flow."""
    if end <= start:
        return []
    if isinstance(spec, PoissonArrival):
        return _gaps_until(_GapFn("poisson", spec.rate, rng), start, end)
    if isinstance(spec, GammaArrival):
        return _gaps_until(_GapFn("gamma", spec.rate, rng, spec.burstiness), start, end)
    if isinstance(spec, ConstantArrival):
        return _gaps_until(_GapFn("constant", spec.rate, rng), start, end)
    if isinstance(spec, OnOffArrival):
        return _on_off(spec, rng, start, end)
    raise TypeError(f"unknown arrival process {spec!r}")  # pragma: no cover


def _on_off(spec: OnOffArrival, rng: random.Random, start: float, end: float) -> list[float]:
    times: list[float] = []
    period = spec.on_s + spec.off_s
    t = start if spec.start_on else start + spec.off_s
    while t < end:
        on_end = min(t + spec.on_s, end)
        # Each burst is an independent renewal process; for Poisson this is exactly the
        # memoryless process restricted to the on periods.
        times.extend(_gaps_until(_GapFn(spec.inner, spec.rate, rng), t, on_end))
        t += period
    return times


def mean_rate(spec: ArrivalSpec) -> float:
    """Long-run mean requests per second of the process."""
    return spec.mean_rate()
