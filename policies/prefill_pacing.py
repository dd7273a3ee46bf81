"""Prefill pacing: the share of a worker's prefill speed background prompts may use.

``PrefillPacer`` sets the share of the worker's measured prefill speed that background
prompts may use (their *duty*), from the mean gap the *interactive* streams see, stalls
included, against a looser target, and from their first tokens: cut to ``decrease`` times
when the gap is above its target or an interactive request waited more than half its
``ttft_s`` on the worker for its first token (background prompts queued in vLLM ahead of it:
vLLM's own queue is first come, first served); one ``step`` more when well under the gap
target or when no interactive stream ran in the interval (nobody to protect: background
gets the capacity back). Background prompts admitted run up a debt in
prompt tokens that is paid back at duty x prefill rate; background waits while it is unpaid.
While background work is *behind* (a background class's oldest queued request has waited
more than ``BEHIND`` of its own first-token target), the gap the duty holds loosens to
``behind_gap_s`` and a first token is late only past ``LATE_START_BEHIND`` of its target
(not half of it): interactive streams stay within their own targets, and background
is not held to a fixed share of the worker it cannot keep up in (at RAG 3/s of 1.8k-token
prompts on a CPU worker that prefills ~10k tokens/s, a duty held near 0.5 queued RAG for
22 s at p50: results/matrix.md of 2026-12-02 in git history).

Pure: the caller passes the time and the observations; no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

# An interactive first token later than this share of its class's ttft_s, counted from
# when the request reached the worker, cuts the background prefill duty (PrefillPacer).
LATE_START = 0.5

# Background work is behind once a background class's oldest queued request has waited
# this share of its class's ttft_s (PrefillPacer's behind_gap_s then applies).
BEHIND = 0.5
# While background is behind (and the rule has a behind_gap_s), a first token is late only
# past this share of its ttft_s: interactive work is held within its targets, not half.
LATE_START_BEHIND = 0.75


def background_behind(
    oldest_arrivals: Mapping[str, float | None], ttft_s: Mapping[str, float], now: float
) -> bool:
    """Whether any background class in ``ttft_s`` (class -> its first-token target) has a
    queued request (``oldest_arrivals``: class -> its oldest queued arrival, None when
    empty) that has waited more than ``BEHIND`` of its target."""
    for cls, target in ttft_s.items():
        oldest = oldest_arrivals.get(cls)
        if oldest is not None and now - oldest > BEHIND * target:
            return True
    return False


class PrefillPacer:
    """The background prefill duty of one worker (see the module docstring)."""

    def __init__(
        self,
        target_gap_s: float,
        interval_s: float,
        now: float,
        decrease: float = 0.7,
        headroom: float = 0.85,
        step: float = 0.1,
        min_duty: float = 0.1,
        behind_gap_s: float | None = None,
    ) -> None:
        self.target_gap_s = target_gap_s
        self.behind_gap_s = behind_gap_s
        self.interval_s = interval_s
        self.decrease = decrease
        self.headroom = headroom
        self.step = step
        self.min_duty = min_duty
        self.duty = 1.0
        self._since = now
        self._time = 0.0
        self._tokens = 0
        self._debt = 0.0  # background prompt tokens admitted and not yet paid back
        self._paid_at = now
        # The latest interactive first token of this interval, as a share of its target.
        self._lateness = 0.0
        self.cuts_gap = 0  # intervals the duty was cut for the interactive gap
        self.cuts_late = 0  # intervals the duty was cut for a late interactive first token

    def observe(self, seconds: float, tokens: int) -> None:
        """An interactive stream's ``tokens`` came ``seconds`` after its previous token."""
        if tokens > 0 and seconds >= 0 and math.isfinite(seconds):
            self._time += seconds
            self._tokens += tokens

    def observe_start(self, seconds: float, ttft_s: float) -> None:
        """An interactive request's first token came ``seconds`` after it was sent to the
        worker; its class's first-token target is ``ttft_s``."""
        if ttft_s > 0:
            self._lateness = max(self._lateness, seconds / ttft_s)

    def late(self, behind: bool = False) -> bool:
        """An interactive first token came late in the current interval: past
        ``LATE_START`` of its target, or ``LATE_START_BEHIND`` while background is
        ``behind`` and a ``behind_gap_s`` is set."""
        share = LATE_START_BEHIND if behind and self.behind_gap_s is not None else LATE_START
        return self._lateness > share

    def update(self, now: float, rate: float, behind: bool = False) -> float:
        """Move the duty if an interval has passed (``rate``: the worker's prefill speed in
        tokens per second, to pay the debt at the old duty up to now); the duty now.
        ``behind``: background work is waiting past its share of its target (the gap to
        hold is then ``behind_gap_s``, when set)."""
        if now - self._since < self.interval_s:
            return self.duty
        self._pay(now, rate)
        self._since = now
        late = self.late(behind)
        self._lateness = 0.0
        if late:
            self.duty = max(self.min_duty, self.duty * self.decrease)
            self.cuts_late += 1
            self._time, self._tokens = 0.0, 0
            return self.duty
        if self._tokens == 0:  # no interactive stream to protect
            self.duty = min(1.0, self.duty + self.step)
            return self.duty
        gap = self._time / self._tokens
        self._time, self._tokens = 0.0, 0
        target = self.target_gap_s
        if behind and self.behind_gap_s is not None:
            target = self.behind_gap_s
        if gap > target:
            self.duty = max(self.min_duty, self.duty * self.decrease)
            self.cuts_gap += 1
        elif gap < self.headroom * target:
            self.duty = min(1.0, self.duty + self.step)
        return self.duty

    def charge(self, now: float, prompt_tokens: int, rate: float) -> None:
        """A background prompt of ``prompt_tokens`` was admitted to the worker."""
        if self.duty < 1.0:
            self._pay(now, rate)
            self._debt += prompt_tokens

    def open(self, now: float, rate: float) -> bool:
        """Whether background prompts may be admitted now (the debt is paid)."""
        if self.duty >= 1.0:
            return True
        self._pay(now, rate)
        return self._debt < 1.0  # under one token: paid (rounding aside)

    def paid_in(self, now: float, rate: float) -> float:
        """Seconds until the debt is paid and background prompts may start (0: now)."""
        if self.open(now, rate):
            return 0.0
        return (self._debt - 1.0) / (self.duty * rate) if rate > 0 else math.inf

    def _pay(self, now: float, rate: float) -> None:
        if self.duty >= 1.0:
            self._debt = 0.0
        elif self._debt > 0.0:
            self._debt = max(0.0, self._debt - (now - self._paid_at) * self.duty * rate)
        self._paid_at = now
