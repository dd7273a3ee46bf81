"""What each class's oldest queued request waits for, summed over time.

After every admission pass that leaves work queued, the scheduler names, per class with a
queue, the first limit that kept the class's head off every worker: a budget verdict
(``policies.budgets.Verdict``: ``class_cap``, ``saturated``, ``slots``, ``prefill``,
``paced``, ``app_paced``) or one of the reasons below. ``WaitLedger`` counts the seconds
each (class, reason) held until the next pass: over a run, where the queueing time went.
"""

from __future__ import annotations

from collections.abc import Mapping

HELD = "held"  # an earlier class's head, blocked on a shared budget, holds its workers
APP_CAP = "app_cap"  # every queued app of the class is at its own max_in_flight
NO_WORKER = "no_worker"  # no healthy worker the router allows for it


class WaitLedger:
    """Seconds per (class, reason), from the reasons each pass reports.

    ``settle(now, reasons)`` closes the interval since the previous settle (charged to the
    reasons found then) and opens one for ``reasons``; ``seconds(now)`` includes the open
    interval. Times must not go backwards; a smaller ``now`` adds nothing."""

    def __init__(self) -> None:
        self._since: float | None = None
        self._open: dict[str, str] = {}
        self._total: dict[tuple[str, str], float] = {}

    def settle(self, now: float, reasons: Mapping[str, str]) -> None:
        self._total = self.seconds(now)
        self._open = dict(reasons)
        self._since = now if self._since is None else max(self._since, now)

    def seconds(self, now: float) -> dict[tuple[str, str], float]:
        out = dict(self._total)
        if self._since is not None and now > self._since:
            for cls, reason in self._open.items():
                key = (cls, reason)
                out[key] = out.get(key, 0.0) + (now - self._since)
        return out

    def current(self) -> dict[str, str]:
        """The reasons of the last pass (class -> reason), classes with a queue only."""
        return dict(self._open)
