"""Adaptive batching windows: how long a background request may wait for partners.

A *batch* gathers requests that can be sent to a worker together (for embeddings: one
upstream call with a list input). It opens when its first member joins. Each time the batch
or the load changes, :func:`decide` answers when the batch should be dispatched; the caller
dispatches it at that time (or at once when the time has passed). The rule, in order:

1. **Full**: the batch reached ``max_batch_size`` items or ``max_batch_tokens`` tokens:
   dispatch now.
2. **Zero window** (``max_wait_s == 0``, the default, and what interactive classes get):
   dispatch now.
3. **Interactive work active** (queued anywhere, or in its prefill): shrink to the minimum,
   ``opened_at + min_wait_s``, so background batches do not pile up behind voice and chat.
4. **Sparse** (no arrival rate measured yet, or the next partner is not expected before the
   window would close): no partner is expected soon, so waiting buys nothing: dispatch at
   the minimum.
5. **Worker idle**: dispatch at the minimum. An idle worker has time for a call of one;
   waiting for a partner would only delay this one. (It used to wait one expected gap for
   a partner. An app that embeds one text at a time, sending the next when the answer
   comes, is then held every time: its next request cannot come while it waits, so the
   gaps it shows are the gateway's own waits, and the wait kept itself near the maximum:
   22 ms on every call against 0.7 ms straight to the upstream, ``make bench-overhead``.)
   Partners that arrive while its call runs find the worker busy and gather (rule 6).
6. **Dense, worker busy**: the worker is working anyway, so waiting costs little; grow
   toward the maximum: wait the expected time to fill the batch
   (``last_join + gap * free items``), at most ``opened_at + max_wait_s``.

Every answer lies between the minimum and ``opened_at + max_wait_s``, and never after the
TTFT deadline of the batch's oldest member (``oldest_arrival + ttft_s - ttft_margin_s``):
when that has passed the batch goes now. The expected gap comes from :class:`ArrivalGaps`,
an exponentially weighted mean of the gaps between a class's arrivals, where the silence
since the last arrival counts as a gap at least that long (so a rate measured before a lull
goes stale instead of promising partners that do not come).

Pure: standard library only, the time is an argument, the same inputs give the same answer.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(what)


@dataclass(frozen=True, slots=True)
class WindowPolicy:
    """One class's batching window; times in seconds, ``None`` means no cap.

    ``min_wait_s`` / ``max_wait_s`` bound the wait measured from the batch's opening;
    ``max_batch_size`` caps items per batch (a single request with more items than that
    still goes, alone), ``max_batch_tokens`` caps their token estimate likewise. ``ttft_s``
    is the class's TTFT target; a batch is dispatched no later than ``ttft_margin_s`` before
    its oldest member would miss it.
    """

    min_wait_s: float = 0.0
    max_wait_s: float = 0.0
    max_batch_size: int | None = None
    max_batch_tokens: int | None = None
    ttft_s: float | None = None
    ttft_margin_s: float = 0.0

    def __post_init__(self) -> None:
        for key, value in (
            ("min_wait_s", self.min_wait_s),
            ("max_wait_s", self.max_wait_s),
            ("ttft_margin_s", self.ttft_margin_s),
        ):
            _require(math.isfinite(value) and value >= 0, f"window: {key} must be >= 0")
        _require(self.min_wait_s <= self.max_wait_s, "window: min_wait_s must be <= max_wait_s")
        if self.max_batch_size is not None:
            _require(self.max_batch_size >= 1, "window: max_batch_size must be >= 1")
        if self.max_batch_tokens is not None:
            _require(self.max_batch_tokens >= 1, "window: max_batch_tokens must be >= 1")
        if self.ttft_s is not None:
            _require(math.isfinite(self.ttft_s) and self.ttft_s > 0, "window: ttft_s must be > 0")

    def fits(self, size: int, tokens: int, items: int, item_tokens: int) -> bool:
        """Whether a request of ``items`` / ``item_tokens`` may join a batch holding
        ``size`` items and ``tokens`` tokens. An empty batch takes anything."""
        if size == 0:
            return True
        if self.max_batch_size is not None and size + items > self.max_batch_size:
            return False
        return self.max_batch_tokens is None or tokens + item_tokens <= self.max_batch_tokens

    def full(self, size: int, tokens: int) -> bool:
        """Whether a batch of ``size`` items and ``tokens`` tokens can take nothing more."""
        if self.max_batch_size is not None and size >= self.max_batch_size:
            return True
        return self.max_batch_tokens is not None and tokens >= self.max_batch_tokens


class ArrivalGaps:
    """Exponentially weighted mean of the gaps between one class's arrivals.

    ``alpha`` weighs the newest gap; single gaps are capped at ``cap_s`` so one long lull
    does not hide a dense burst that follows it for many arrivals.
    """

    def __init__(self, alpha: float = 0.2, cap_s: float = 1.0) -> None:
        _require(0 < alpha <= 1, "alpha must be in (0, 1]")
        _require(cap_s > 0, "cap_s must be > 0")
        self._alpha = alpha
        self._cap = cap_s
        self._last: float | None = None
        self._mean: float | None = None

    def observe(self, now: float) -> None:
        """One arrival at ``now`` (times must not go backwards; earlier ones count as now)."""
        if self._last is not None:
            gap = min(self._cap, max(0.0, now - self._last))
            self._mean = (
                gap if self._mean is None else self._mean + self._alpha * (gap - self._mean)
            )
            now = max(now, self._last)
        self._last = now

    def expected_gap(self, now: float) -> float | None:
        """The gap expected before the next arrival: the mean, or the silence since the last
        arrival if that is longer; ``None`` before two arrivals were seen."""
        if self._mean is None or self._last is None:
            return None
        return max(self._mean, now - self._last)

    def __repr__(self) -> str:
        return f"ArrivalGaps(mean={self._mean}, last={self._last})"


@dataclass(frozen=True, slots=True)
class BatchView:
    """The open batch: when it opened, its oldest member's arrival (its TTFT clock starts
    there), its latest join, and its items and token estimate so far."""

    opened_at: float
    oldest_arrival: float
    last_join: float
    size: int
    tokens: int


@dataclass(frozen=True, slots=True)
class Load:
    """What the window reacts to: the target worker has other work in flight
    (``worker_busy``); interactive work is queued or in its prefill (``interactive_active``)."""

    worker_busy: bool
    interactive_active: bool


class Reason(enum.StrEnum):
    """Which step of the rule decided (see the module docstring)."""

    FULL = "full"
    ZERO_WINDOW = "zero_window"
    INTERACTIVE = "interactive"
    SPARSE = "sparse"
    IDLE = "idle"
    BUSY_FILL = "busy_fill"


@dataclass(frozen=True, slots=True)
class Decision:
    """Dispatch the batch at ``dispatch_at`` (never before ``now``)."""

    dispatch_at: float
    reason: Reason

    def due(self, now: float) -> bool:
        return self.dispatch_at <= now


def deadline(policy: WindowPolicy, batch: BatchView) -> float:
    """The latest dispatch time the window allows for ``batch``: its opening plus the
    maximum wait, and no later than its oldest member's TTFT target minus the margin."""
    cap = batch.opened_at + policy.max_wait_s
    if policy.ttft_s is not None:
        cap = min(cap, batch.oldest_arrival + policy.ttft_s - policy.ttft_margin_s)
    return cap


def decide(
    policy: WindowPolicy,
    batch: BatchView,
    load: Load,
    expected_gap: float | None,
    now: float,
) -> Decision:
    """When to dispatch ``batch`` (the rule in the module docstring)."""
    if policy.full(batch.size, batch.tokens):
        return Decision(now, Reason.FULL)
    if policy.max_wait_s <= 0:
        return Decision(now, Reason.ZERO_WINDOW)
    cap = deadline(policy, batch)
    floor = min(batch.opened_at + policy.min_wait_s, cap)
    if load.interactive_active:
        return Decision(max(now, floor), Reason.INTERACTIVE)
    if expected_gap is None or batch.last_join + expected_gap > cap:
        return Decision(max(now, floor), Reason.SPARSE)
    if not load.worker_busy:
        return Decision(max(now, floor), Reason.IDLE)
    free = None if policy.max_batch_size is None else policy.max_batch_size - batch.size
    target = cap if free is None else batch.last_join + expected_gap * free
    return Decision(max(now, min(cap, max(floor, target))), Reason.BUSY_FILL)
