"""Decode pacing: hold a worker's token gap under a target by capping its background work.

Every sequence running on a vLLM worker gets one token per engine step, so the gap between
tokens of *any* stream on that worker measures the step time an interactive stream sees.
Each step grows with the decode batch and with the prefill chunks admitted into it, so the
more background work the gateway lets onto the worker, the slower every stream runs. The
static budgets (in-flight caps, prefill tokens) set that trade once; this controller sets it
from what is measured, as the machine's speed and the mix change.

``DecodePacer`` keeps one cap on the background (non-interactive) sequences of one worker,
adjusted once per interval from the mean token gap observed in it (additive increase,
multiplicative decrease):

- gap above the target: the cap drops to ``decrease`` times what is in flight (at least
  ``min_cap``). It drops again only once the background work in flight has come down to the
  cap, so the sequences admitted before the cut, which take a while to finish, do not drive
  it to the floor;
- gap below ``headroom`` times the target while the cap is what holds work back (background
  in flight at the cap): one more sequence;
- no gap observed (nothing streamed): unchanged.

Pure: the caller passes the time and the observations; no clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PacingRule:
    """``target_gap_s``: the mean gap between tokens to hold; ``interval_s``: how often the
    cap moves; ``max_cap``: the cap at start and its ceiling."""

    target_gap_s: float
    interval_s: float = 0.5
    decrease: float = 0.7
    headroom: float = 0.85
    min_cap: int = 1
    max_cap: int = 64

    def __post_init__(self) -> None:
        if not (math.isfinite(self.target_gap_s) and self.target_gap_s > 0):
            raise ValueError("target_gap_s must be > 0")
        if not (math.isfinite(self.interval_s) and self.interval_s > 0):
            raise ValueError("interval_s must be > 0")
        if not 0 < self.decrease < 1:
            raise ValueError("decrease must be in (0, 1)")
        if not 0 < self.headroom <= 1:
            raise ValueError("headroom must be in (0, 1]")
        if self.min_cap < 1 or self.max_cap < self.min_cap:
            raise ValueError("need 1 <= min_cap <= max_cap")


class DecodePacer:
    """The background cap of one worker (see the module docstring)."""

    def __init__(self, rule: PacingRule, now: float) -> None:
        self.rule = rule
        self.cap = rule.max_cap
        self.last_gap_s: float | None = None  # mean gap of the last interval with tokens
        self._since = now
        self._time = 0.0
        self._tokens = 0
        self._settling = False  # a cut was made; wait until in-flight work is down to it

    def observe(self, seconds: float, tokens: int) -> None:
        """``tokens`` tokens of one stream arrived ``seconds`` after its previous token."""
        if tokens > 0 and seconds >= 0 and math.isfinite(seconds):
            self._time += seconds
            self._tokens += tokens

    def update(self, now: float, background_in_flight: int) -> int:
        """Move the cap if an interval has passed; the cap now."""
        if now - self._since < self.rule.interval_s:
            return self.cap
        self._since = now
        if self._tokens == 0:
            return self.cap
        gap = self._time / self._tokens
        self._time, self._tokens = 0.0, 0
        self.last_gap_s = gap
        r = self.rule
        if self._settling and background_in_flight <= self.cap:
            self._settling = False
        if gap > r.target_gap_s:
            if not self._settling:
                base = min(self.cap, background_in_flight)
                self.cap = max(r.min_cap, math.floor(base * r.decrease))
                self._settling = background_in_flight > self.cap
        elif gap < r.headroom * r.target_gap_s and background_in_flight >= self.cap:
            self.cap = min(r.max_cap, self.cap + 1)
        return self.cap
