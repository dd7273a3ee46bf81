"""Small statistics helpers: percentiles, Jain's fairness index, max-min fair allocation."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between closest ranks (numpy's
    default): rank = q/100 * (n - 1). None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    if not values:
        return None
    xs = sorted(values)
    rank = q / 100 * (len(xs) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def jain_index(values: Sequence[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n * sum x^2): 1 when all equal, 1/n when one takes
    everything. None for no values; 1.0 when every value is zero (nobody got anything)."""
    if not values:
        return None
    if any(v < 0 for v in values):
        raise ValueError("Jain's index needs non-negative values")
    sq = sum(v * v for v in values)
    if sq == 0:
        return 1.0
    return sum(values) ** 2 / (len(values) * sq)


def max_min_fair(
    capacity: float, demands: Mapping[str, float], weights: Mapping[str, float] | None = None
) -> dict[str, float]:
    """Weighted max-min fair split of `capacity` (water-filling): nobody gets more than it
    demands; the rest is shared in proportion to weight among the still unsatisfied."""
    w = {k: (weights or {}).get(k, 1.0) for k in demands}
    alloc = {k: 0.0 for k in demands}
    active = {k for k, d in demands.items() if d > 0}
    left = max(0.0, capacity)
    while active and left > 1e-12:
        total_w = sum(w[k] for k in active)
        # The level at which the first active member is satisfied, or the remaining capacity.
        per_w = min(
            left / total_w,
            min((demands[k] - alloc[k]) / w[k] for k in active),
        )
        for k in active:
            alloc[k] += per_w * w[k]
        left -= per_w * total_w
        active = {k for k in active if alloc[k] < demands[k] - 1e-9}
    return alloc
