"""Per-key counts kept as plain dicts, where a key that reaches zero is dropped."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


def count_down(counts: dict[K, int], key: K, n: int = 1) -> None:
    """Count ``n`` fewer under ``key``; a key that reaches zero is dropped, so the dict
    holds only the keys with something counted (its length is how many are busy)."""
    left = counts[key] - n
    if left:
        counts[key] = left
    else:
        del counts[key]
