"""Priority bands with the starvation guard: the order in which classes are tried."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hearthgate.policies.types import ClassPolicy


@dataclass(frozen=True, slots=True)
class Backlog:
    """One backlogged class as the band decision sees it.

    ``oldest_arrival`` is the arrival of its longest-waiting queued request; ``share`` its
    share of dispatched tokens during the current backlog (None: nothing dispatched yet).
    """

    policy: ClassPolicy
    oldest_arrival: float
    share: float | None


def overdue(b: Backlog, now: float) -> bool:
    """The class's oldest request has waited at least its ``max_wait_s``."""
    mw = b.policy.max_wait_s
    return mw is not None and now - b.oldest_arrival >= mw


def under_share(b: Backlog) -> bool:
    """The class got less than its ``min_share`` of the tokens dispatched while backlogged."""
    ms = b.policy.min_share
    return ms is not None and b.share is not None and b.share < ms


def precedence(backlogs: Sequence[Backlog], now: float) -> list[str]:
    """Class names in the order the scheduler should try them.

    First the overdue classes, longest past their max wait first; then the classes below
    their min share, by band; then everything else by band (lower priority number first).
    Ties end in the class name, so the order is total.
    """

    def band(b: Backlog) -> tuple[int, str]:
        return (b.policy.priority, b.policy.name)

    late: list[tuple[float, int, str]] = []
    short: list[tuple[int, str]] = []
    rest: list[tuple[int, str]] = []
    for b in backlogs:
        if overdue(b, now):
            mw = b.policy.max_wait_s
            assert mw is not None
            late.append((b.oldest_arrival + mw, *band(b)))
        elif under_share(b):
            short.append(band(b))
        else:
            rest.append(band(b))
    return [k[-1] for k in sorted(late)] + [k[-1] for k in sorted(short) + sorted(rest)]
