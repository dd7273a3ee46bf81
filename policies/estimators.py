"""Rates the gateway measures as it runs, as pure code on times passed in.

:class:`DrainRate` (requests of each class finished per second, for ``Retry-After``) and
:class:`PrefillRates` (prompt tokens per second each worker prefills, for releasing the
prefill budget of requests whose first token the gateway cannot see). Both hold bounded
memory whatever the traffic.
"""

from __future__ import annotations

import math
from collections import deque


class DrainRate:
    """Requests of each class finished per second over a sliding window (for Retry-After
    and late shedding). Memory is bounded: old ends are dropped as new ones come, and at
    most ``max_events`` ends are kept per class.

    A class whose busy periods are reported (``busy``: it has requests queued or running)
    is measured over the time it was busy in the window, not the whole window: a class
    that just started, or that comes in bursts, finishes requests as fast as the worker
    serves it while it has work, and the idle time before must not make that look slower
    (a 30 s window at start-up or between bursts of RAG had the gateway refuse requests
    the worker could serve within target).
    """

    def __init__(
        self,
        window_s: float = 30.0,
        max_events: int = 100_000,
        min_ends: int = 8,
        min_busy_s: float = 10.0,
    ) -> None:
        self._window = window_s
        self._max = max_events
        self.min_ends = min_ends
        self.min_busy_s = min_busy_s
        self._ends: dict[str, deque[float]] = {}
        self._busy_since: dict[str, float] = {}  # class -> start of its busy period now
        self._periods: dict[str, deque[tuple[float, float]]] = {}  # closed busy periods
        self._period_s: dict[str, float] = {}  # their summed lengths

    def record(self, cls: str, now: float) -> None:
        ends = self._ends.get(cls)
        if ends is None:
            ends = self._ends[cls] = deque(maxlen=self._max)
        ends.append(now)
        self._trim(ends, now)

    def busy(self, cls: str, now: float, active: bool) -> None:
        """Whether ``cls`` has requests queued or running now (call on every change;
        repeating the same state is harmless)."""
        since = self._busy_since.get(cls)
        periods = self._periods.get(cls)
        if periods is None:
            periods = self._periods[cls] = deque()
            self._period_s[cls] = 0.0
        if active and since is None:
            self._busy_since[cls] = now
        elif not active and since is not None:
            del self._busy_since[cls]
            periods.append((since, now))
            self._period_s[cls] += now - since
            if len(periods) > self._max:
                self._drop_period(cls, periods)
        while periods and periods[0][1] < now - self._window:
            self._drop_period(cls, periods)

    def _drop_period(self, cls: str, periods: deque[tuple[float, float]]) -> None:
        start, end = periods.popleft()
        self._period_s[cls] = max(0.0, self._period_s[cls] - (end - start)) if periods else 0.0

    def _busy_seconds(self, cls: str, now: float) -> float | None:
        """Seconds ``cls`` was busy in the window; None if its busy periods are not
        reported."""
        periods = self._periods.get(cls)
        if periods is None:
            return None
        lo = now - self._window
        while periods and periods[0][1] <= lo:
            self._drop_period(cls, periods)
        # Periods are disjoint and in order: only the oldest can start before the window.
        total = self._period_s[cls] - (max(0.0, lo - periods[0][0]) if periods else 0.0)
        since = self._busy_since.get(cls)
        if since is not None:
            total += now - max(since, lo)
        return total

    def _trim(self, ends: deque[float], now: float) -> None:
        while ends and ends[0] < now - self._window:
            ends.popleft()

    def held(self, cls: str) -> int:
        """Ends currently kept for ``cls`` (for tests of the memory bound)."""
        return len(self._ends.get(cls, ()))

    def rate(self, cls: str, now: float) -> float:
        ends = self._ends.get(cls)
        if not ends:
            return 0.0
        self._trim(ends, now)
        busy = self._busy_seconds(cls, now)
        span = self._window if busy is None else max(busy, 0.1)
        return len(ends) / span

    def measured_rate(self, cls: str, now: float) -> float:
        """``rate``, or 0 while fewer than ``min_ends`` requests of ``cls`` finished in the
        window (too few to refuse anyone on), unless ``cls`` has had work without a break
        for ``min_busy_s``: then the few it finished are what the worker did in that time.
        A class the box serves slower than ``min_ends`` a window (RAG on a slow CPU:
        0.2-0.3 a second) is the one most in need of being told early, and waiting for
        its whole window let a flood queue 30 s of arrivals first."""
        ends = self._ends.get(cls)
        if ends is None:
            return 0.0
        self._trim(ends, now)
        if len(ends) >= self.min_ends:
            return self.rate(cls, now)
        since = self._busy_since.get(cls)
        steady = since is not None and now - since >= self.min_busy_s
        return self.rate(cls, now) if steady else 0.0

    def total_rate(self, now: float) -> float:
        """Requests of all classes finished per second over the window."""
        return sum(self.rate(cls, now) for cls in list(self._ends))

    def retry_after(self, cls: str, queued: int, now: float, fallback_s: int = 5) -> int:
        """Seconds until the queue ahead should have drained: depth / rate, 1 to 300."""
        r = self.rate(cls, now)
        if r <= 0:
            return fallback_s
        return max(1, min(300, math.ceil(queued / r)))


class PrefillRates:
    """Prompt tokens per second each worker prefills, from streamed first tokens (EWMA)."""

    def __init__(self, initial: float = 4000.0, min_tokens: int = 256, alpha: float = 0.2):
        self.initial = initial
        self._min_tokens = min_tokens
        self._alpha = alpha
        self._rates: dict[str, float] = {}

    def observe(self, worker: str, prompt_tokens: int, seconds: float) -> None:
        if prompt_tokens < self._min_tokens or seconds <= 0:
            return  # short prompts measure queueing and overhead, not prefill speed
        sample = prompt_tokens / seconds
        old = self._rates.get(worker)
        self._rates[worker] = sample if old is None else old + self._alpha * (sample - old)

    def rate(self, worker: str) -> float:
        """The worker's prefill speed in tokens per second (``initial`` before any)."""
        return self._rates.get(worker, self.initial)

    def seconds(self, worker: str, prompt_tokens: int) -> float:
        return prompt_tokens / self.rate(worker)

    def fastest_seconds(self, prompt_tokens: int) -> float:
        """The prefill time on the fastest worker measured so far (``initial`` rate before
        any): an optimistic estimate, for deciding a request cannot make its target."""
        return prompt_tokens / max(self._rates.values(), default=self.initial)
