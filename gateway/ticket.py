"""An admitted request's handle: the hooks the request path calls as the answer
progresses (first token, streamed tokens, finish), each feeding the admission controller's
scheduler, prefill-speed estimates and pacing. Released exactly once, whatever way the
request ends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hearthgate.policies.types import QueuedRequest

if TYPE_CHECKING:
    from hearthgate.gateway.admission import AdmissionController


@dataclass
class Ticket:
    """An admitted request: which worker it goes to, and the hooks that report progress."""

    request: QueuedRequest
    worker: str
    admitted_at: float
    _controller: AdmissionController
    _finished: bool = field(default=False)
    _first_token_seen: bool = field(default=False)
    _prefill_released: bool = field(default=False)
    _counted_answered: bool = field(default=False)  # left the class's unanswered count
    _last_token: tuple[float, int] | None = field(default=None)  # (time, tokens so far)
    queued_behind: int = 0  # requests queued ahead of it when it arrived (Scheduler.ahead)
    interactive: bool = False
    ttft_s: float | None = None  # an interactive class's first-token target (pacing)
    _streams: bool | None = field(default=None)  # None: not said yet
    _prefill_running: bool = field(default=False)  # counted by prefill pacing, not over yet
    _prefill_done: bool = field(default=False)  # _prefill_over ran

    def first_token(self, observed: bool = True) -> None:
        """The first token arrived (``observed``) or the prefill is estimated to be over:
        release the prefill budget (once). Observed first tokens also measure the worker's
        prefill speed, even after an early release."""
        c = self._controller
        now = self._now()
        if observed and not self._first_token_seen:
            self._first_token_seen = True
            self._answered()
            waited = now - self.admitted_at
            c.prefill_rates.observe(self.worker, self.request.prompt_tokens, waited)
            if self.ttft_s is not None:
                c.paced.observe_start(self.worker, now, waited, self.ttft_s)
        if observed or self._streams is False:
            self._prefill_over(now)
        if not self._prefill_released:
            self._prefill_released = True
            if c.scheduler.on_first_token(self.request.id, now):
                c.pump()

    def expect_no_stream(self) -> None:
        """The answer will not stream: release the prefill budget after the estimated
        prefill time (times the early-release fraction, as for streams, so the next prompt
        is already there when this prefill ends) instead of at a first token the gateway
        cannot see."""
        c = self._controller
        self._streams = False
        c.release_prefill_later(self, c.early_release if c.early_release is not None else 1.0)

    def expect_stream(self) -> None:
        """The answer streams: its first token releases the prefill budget, or the
        controller's early release (a fraction of the estimated prefill time), whichever
        comes first, so the next prompt reaches the worker before this prefill ends."""
        self._streams = True
        fraction = self._controller.early_release
        if fraction is not None:
            self._controller.release_prefill_later(self, fraction)

    def progress(self, output_tokens_so_far: int) -> None:
        """Tokens streamed so far; the gaps between them feed the worker's decode pacing."""
        c = self._controller
        now = self._now()
        last = self._last_token
        if output_tokens_so_far > 0:
            self._answered()
            self._prefill_over(now)
        if last is not None and output_tokens_so_far > last[1]:
            c.paced.observe_gap(
                self.worker, now, now - last[0], output_tokens_so_far - last[1], self.interactive
            )
        self._last_token = (now, output_tokens_so_far)
        c.scheduler.on_progress(self.request.id, output_tokens_so_far, now)

    def finish(self, prompt_tokens: int | None, output_tokens: int | None) -> None:
        """Release the slot and budgets (idempotent); correct the charge to actual counts."""
        if self._finished:
            return
        self._finished = True
        c = self._controller
        now = self._now()
        self._answered()
        self._prefill_over(now)
        c.scheduler.on_finish(self.request.id, prompt_tokens, output_tokens, now)
        c.drain.record(self.request.cls, now)
        c.pump()

    def _answered(self) -> None:
        """Its first token came, or it ended: no longer ahead of its class's next
        request (late shedding counts those still waiting in a worker)."""
        if not self._counted_answered:
            self._counted_answered = True
            self._controller.answered(self.request.cls)

    def _prefill_over(self, now: float) -> None:
        """The worker is done with this prompt's prefill (its first token streamed, the
        estimate for an answer that does not stream, or the end), as pacing counts it and as
        a flooding app's yield to lighter apps' first tokens does (``Scheduler.on_answered``)."""
        c = self._controller
        if self._prefill_running:
            self._prefill_running = False
            c.paced.prefill_ended(self.worker, now, not self.interactive)
        if not self._prefill_done:
            self._prefill_done = True
            # A first token changes what admission sees only through the flood limits.
            if c.scheduler.on_answered(self.request.id) and c.paced.flood is not None:
                c.pump()

    def _now(self) -> float:
        return self._controller.clock()
