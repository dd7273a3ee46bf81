"""Failover: after an attempt on a worker failed before the client got anything, where the
request goes next. Pure: worker names and health in, a decision out."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass


class Failure(enum.Enum):
    """How an attempt failed, before any byte reached the client."""

    REFUSED = "refused"  # nothing listens: the worker is down
    DROPPED = "dropped"  # the connection closed before an answer (maybe a keep-alive race)
    BROKEN = "broken"  # the answer broke off before anything reached the client
    ERROR_ANSWER = "error_answer"  # the worker answered 500/502/503/504
    LOST = "lost"  # the worker was marked down while the request was on it
    SILENT = "silent"  # nothing within the class's first-byte limit


@dataclass(frozen=True, slots=True)
class Retry:
    """Queue the request again for these workers."""

    workers: frozenset[str]


@dataclass(frozen=True, slots=True)
class GiveUp:
    """No retry: pass the worker's own error answer on (``pass_answer``), or answer 503."""

    pass_answer: bool


def next_step(
    serving: Sequence[tuple[str, bool]],
    failed: frozenset[str],
    last: Failure,
    attempts: int,
    max_attempts: int = 3,
) -> Retry | GiveUp:
    """Where a request goes after its ``attempts``-th attempt failed with ``last``.

    ``serving``: (name, healthy) of every worker serving its model; ``failed``: the workers
    that failed it so far. A retry goes to the healthy workers that have not failed it; when
    none is left, a dropped connection or a broken answer is worth another try on the same
    workers (a pooled connection the worker had just closed; a worker that just died is then
    refused and marked down), anything else is given up. A worker's own error answer is
    passed on when no other worker is left; otherwise the client gets 503 (or 502 for
    answers that kept breaking on a worker that is still up).
    """
    if attempts >= max_attempts:
        return GiveUp(pass_answer=last is Failure.ERROR_ANSWER)
    fresh = frozenset(n for n, healthy in serving if healthy and n not in failed)
    if fresh:
        return Retry(fresh)
    if last in (Failure.DROPPED, Failure.BROKEN):
        again = frozenset(n for n, healthy in serving if healthy)
        if again:
            return Retry(again)
    return GiveUp(pass_answer=last is Failure.ERROR_ANSWER)
