"""Arrival processes and length distributions: rates, burstiness and determinism."""

from __future__ import annotations

import itertools
import random
import statistics
from pathlib import Path

import pytest

from hearthgate.loadtests.arrivals import arrival_times
from hearthgate.loadtests.lengths import sample_length, sample_pair
from hearthgate.loadtests.scenario import (
    ConstantArrival,
    FixedLength,
    GammaArrival,
    LognormalLength,
    OnOffArrival,
    PoissonArrival,
    TraceLength,
    UniformLength,
)

HORIZON = 2000.0


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def _cv2(times: list[float]) -> float:
    g = _gaps(times)
    return statistics.pvariance(g) / statistics.fmean(g) ** 2


def test_poisson_mean_rate_and_cv() -> None:
    times = arrival_times(PoissonArrival(process="poisson", rate=5), random.Random(1), 0, HORIZON)
    assert len(times) / HORIZON == pytest.approx(5, rel=0.03)
    assert _cv2(times) == pytest.approx(1.0, abs=0.08)


@pytest.mark.parametrize("burstiness", [0.25, 0.5, 1.0, 4.0])
def test_gamma_rate_and_burstiness(burstiness: float) -> None:
    spec = GammaArrival(process="gamma", rate=4, burstiness=burstiness)
    times = arrival_times(spec, random.Random(2), 0, HORIZON)
    assert len(times) / HORIZON == pytest.approx(4, rel=0.05)
    # Gamma inter-arrivals with shape k have squared coefficient of variation 1/k.
    assert _cv2(times) == pytest.approx(1 / burstiness, rel=0.12)


def test_constant_is_exact() -> None:
    times = arrival_times(ConstantArrival(process="constant", rate=4), random.Random(0), 1.0, 3.0)
    assert times == pytest.approx([1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75])


def test_on_off_bursts() -> None:
    spec = OnOffArrival(process="onoff", rate=20, on_s=2, off_s=3)
    times = arrival_times(spec, random.Random(3), 0, HORIZON)
    assert len(times) / HORIZON == pytest.approx(spec.mean_rate(), rel=0.05)
    assert spec.mean_rate() == pytest.approx(8.0)
    assert all((t % 5) < 2 for t in times)  # nothing in the off periods


def test_on_off_starting_off_and_constant_inner() -> None:
    spec = OnOffArrival(process="onoff", rate=2, on_s=1, off_s=1, inner="constant", start_on=False)
    times = arrival_times(spec, random.Random(0), 0, 6)
    assert times == pytest.approx([1.5, 3.5, 5.5])


def test_window_bounds_and_order() -> None:
    times = arrival_times(PoissonArrival(process="poisson", rate=50), random.Random(4), 10, 12)
    assert times == sorted(times)
    assert all(10 <= t < 12 for t in times)
    assert arrival_times(PoissonArrival(process="poisson", rate=1), random.Random(4), 5, 5) == []


def test_same_seed_same_schedule() -> None:
    spec = GammaArrival(process="gamma", rate=3, burstiness=0.5)
    a = arrival_times(spec, random.Random("s:flow"), 0, 100)
    b = arrival_times(spec, random.Random("s:flow"), 0, 100)
    c = arrival_times(spec, random.Random("t:flow"), 0, 100)
    assert a == b
    assert a != c


def test_length_distributions() -> None:
    rng = random.Random(5)
    assert sample_length(FixedLength(value=7), rng) == 7
    xs = [sample_length(UniformLength(dist="uniform", min=3, max=6), rng) for _ in range(2000)]
    assert set(xs) == {3, 4, 5, 6}
    spec = LognormalLength(dist="lognormal", median=100, sigma=0.5, min=10, max=1000)
    ys = [sample_length(spec, rng) for _ in range(4000)]
    assert statistics.median(ys) == pytest.approx(100, rel=0.06)
    assert min(ys) >= 10 and max(ys) <= 1000
    clamped = LognormalLength(dist="lognormal", median=100, sigma=3, min=50, max=150)
    zs = [sample_length(clamped, rng) for _ in range(500)]
    assert min(zs) == 50 and max(zs) == 150


def test_trace_pairs_rows(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("input_tokens,output_tokens\n10,1\n20,2\n30,3\n")
    p = TraceLength(dist="trace", path=str(trace), column="input_tokens")
    o = TraceLength(dist="trace", path=str(trace), column="output_tokens")
    rng = random.Random(6)
    pairs = {sample_pair(p, o, rng) for _ in range(200)}
    assert pairs == {(10, 1), (20, 2), (30, 3)}
    assert p.upper() == 30
