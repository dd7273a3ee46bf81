"""Token length distributions: draw prompt and output lengths from a seeded generator."""

from __future__ import annotations

import csv
import functools
import math
import random

from hearthgate.loadtests.scenario import (
    FixedLength,
    LengthDist,
    LognormalLength,
    TraceLength,
    UniformLength,
)


@functools.lru_cache(maxsize=32)
def _trace_rows(path: str) -> tuple[dict[str, str], ...]:
    with open(path, newline="") as fh:
        return tuple(csv.DictReader(fh))


@functools.lru_cache(maxsize=64)
def trace_column(path: str, column: str) -> tuple[int, ...]:
    """The positive integer values of `column` in a CSV trace, in file order."""
    rows = _trace_rows(path)
    if not rows:
        raise ValueError(f"trace {path} has no rows")
    if column not in rows[0]:
        raise ValueError(f"trace {path} has no column {column!r} (has: {', '.join(rows[0])})")
    values: list[int] = []
    for i, row in enumerate(rows, start=2):
        try:
            v = int(float(row[column]))
        except (TypeError, ValueError):
            raise ValueError(
                f"trace {path} line {i}: {column}={row[column]!r} is not a number"
            ) from None
        if v < 1:
            raise ValueError(f"trace {path} line {i}: {column} must be >= 1")
        values.append(v)
    return tuple(values)


def trace_length(path: str) -> int:
    return len(_trace_rows(path))


def sample_length(dist: LengthDist, rng: random.Random, row: int | None = None) -> int:
    """One length from `dist`. For a trace, `row` picks the row (drawn if None)."""
    if isinstance(dist, FixedLength):
        return dist.value
    if isinstance(dist, UniformLength):
        return rng.randint(dist.min, dist.max)
    if isinstance(dist, LognormalLength):
        value = rng.lognormvariate(math.log(dist.median), dist.sigma)
        return max(dist.min, min(dist.max, round(value)))
    if isinstance(dist, TraceLength):
        column = trace_column(dist.path, dist.column)
        index = rng.randrange(len(column)) if row is None else row
        return column[index]
    raise TypeError(f"unknown length distribution {dist!r}")  # pragma: no cover


def sample_pair(
    prompt: LengthDist, output: LengthDist | None, rng: random.Random
) -> tuple[int, int | None]:
    """Prompt and output lengths for one request; a shared trace file is sampled by row."""
    row: int | None = None
    if (
        isinstance(prompt, TraceLength)
        and isinstance(output, TraceLength)
        and prompt.path == output.path
    ):
        row = rng.randrange(trace_length(prompt.path))
    p = sample_length(prompt, rng, row)
    o = sample_length(output, rng, row) if output is not None else None
    return p, o
