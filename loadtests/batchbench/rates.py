"""Rates and aggregation of `hearthgate bench batch`: lines per second, the rate within a
window, the medians over the rounds and the targets."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from typing import Any

ATTAINMENT_TOLERANCE = 0.01  # B may be at most 1 point below A
THROUGHPUT_TARGET = 0.9  # C / D


def lines_per_s(lines: int, start: float, end: float | None) -> float | None:
    """``lines`` / (``end`` - ``start``); None without an end or a positive span."""
    if end is None or end <= start:
        return None
    return lines / (end - start)


def done_at(polls: Sequence[tuple[float, int]], t: float) -> float:
    """Lines done at time ``t``, linearly interpolated between polls (time, done)."""
    if not polls:
        return 0.0
    if t <= polls[0][0]:
        return float(polls[0][1])
    for (t0, d0), (t1, d1) in itertools.pairwise(polls):
        if t0 <= t <= t1:
            return d0 + (d1 - d0) * ((t - t0) / (t1 - t0)) if t1 > t0 else float(d1)
    return float(polls[-1][1])


def rate_in_window(
    polls: Sequence[tuple[float, int]], lo: float, hi: float, ended: float | None = None
) -> tuple[float | None, float]:
    """(lines per second within [lo, hi], the fraction of [lo, hi] the batch was running).
    A batch that ended at ``ended`` inside the window is counted up to then; one that ended
    before ``lo`` has no rate."""
    if hi <= lo:
        return None, 0.0
    top = hi if ended is None else min(hi, ended)
    coverage = max(0.0, (top - lo) / (hi - lo))
    if top <= lo:
        return None, 0.0
    return (done_at(polls, top) - done_at(polls, lo)) / (top - lo), coverage


def median(values: Sequence[float | None]) -> float | None:
    xs = [float(v) for v in values if v is not None]
    return statistics.median(xs) if xs else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def aggregate(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds with each round's value, B - A in points, C / D, and
    whether the targets are met. A round is ``{"A": {"attainment"}, "B": {"attainment",
    "lines_per_s"}, "C": {"lines_per_s"}, "D": {"lines_per_s"}}`` (E is B's lines_per_s)."""

    def runs(step: str, key: str) -> list[float | None]:
        return [(r.get(step) or {}).get(key) for r in rounds]

    series = {
        "A": runs("A", "attainment"),
        "B": runs("B", "attainment"),
        "C": runs("C", "lines_per_s"),
        "D": runs("D", "lines_per_s"),
        "E": runs("B", "lines_per_s"),
    }
    out: dict[str, Any] = {k: {"median": median(v), "runs": v} for k, v in series.items()}
    deltas = [
        None if a is None or b is None else b - a
        for a, b in zip(series["A"], series["B"], strict=True)
    ]
    ratios = [_ratio(c, d) for c, d in zip(series["C"], series["D"], strict=True)]
    a_med, b_med = out["A"]["median"], out["B"]["median"]
    delta = None if a_med is None or b_med is None else b_med - a_med
    ratio = _ratio(out["C"]["median"], out["D"]["median"])
    out["B_minus_A"] = {"median": delta, "runs": deltas}
    out["C_over_D"] = {"median": ratio, "runs": ratios}
    out["E_over_C"] = {"median": _ratio(out["E"]["median"], out["C"]["median"])}
    out["targets"] = {
        "attainment_within_1_point": None if delta is None else delta >= -ATTAINMENT_TOLERANCE,
        "throughput_ratio_at_least_0.9": None if ratio is None else ratio >= THROUGHPUT_TARGET,
    }
    return out
