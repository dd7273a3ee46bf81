"""The admission controller: the one async wrapper around the pure scheduler.

A request is enqueued and waits (cancellably) until the scheduler admits it to a worker.
Every event that can free capacity (a first token, a finish, a worker snapshot change, the
ticker) re-runs ``admit``. Queue timeouts are enforced by one ticker task, not a timer per
request. What was admitted is released exactly once through its :class:`Ticket`, whatever
way the request ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from hearthgate.gateway.errors import (
    ClientGone,
    GatewayError,
    NoWorkerAvailable,
    RateLimited,
    class_gone,
)
from hearthgate.gateway.ticket import Ticket
from hearthgate.gateway.worker_pacing import WorkerPacing
from hearthgate.policies.budgets import upstream_priority
from hearthgate.policies.counts import count_down
from hearthgate.policies.estimators import DrainRate, PrefillRates
from hearthgate.policies.pacing import PacingRule, PacingState
from hearthgate.policies.prefill_pacing import background_behind
from hearthgate.policies.scheduler import Scheduler
from hearthgate.policies.types import QueuedRequest, Rejection, WorkerSnapshot

log = logging.getLogger("hearthgate.admission")


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The running event loop, or None where the controller is driven by ``tick()`` alone
    (tests on a fake clock): timers that would pump or release on time are then skipped."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class AdmissionController:
    """Queues requests in the scheduler and wakes each one when it is admitted."""

    def __init__(
        self,
        scheduler: Scheduler,
        snapshots: Callable[[], Sequence[WorkerSnapshot]],
        clock: Callable[[], float] = time.monotonic,
        tick_s: float = 0.05,
        on_admit: Callable[[QueuedRequest, float], None] | None = None,
        on_reject: Callable[[QueuedRequest, str], None] | None = None,
        early_release: float | None = None,
        pacing: PacingRule | None = None,
        app_queue_caps: dict[str, int] | None = None,
        max_queued_bytes: int | None = None,
        retry_after_s: int = 2,
        app_pacing_floor: int | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.clock = clock
        self.drain = DrainRate()
        self._snapshots = snapshots
        self._tick_s = tick_s
        self._waiters: dict[str, asyncio.Future[str]] = {}
        self._requests: dict[str, QueuedRequest] = {}
        self._task: asyncio.Task[None] | None = None
        self._on_admit = on_admit
        self._on_reject = on_reject
        self.prefill_rates = PrefillRates()
        self.early_release = early_release
        self._releases: list[tuple[float, int, Ticket]] = []  # heap of estimated prefill ends
        self._seq = itertools.count()
        # A pump timed for when a worker's prefill debt is paid (at most one pending).
        self._opens: asyncio.TimerHandle | None = None
        self.paced = WorkerPacing(pacing, app_pacing_floor, self.prefill_rates)
        # Per-app caps on queued requests, and a cap on the bytes queued bodies hold.
        self._app_caps = dict(app_queue_caps or {})
        self._max_queued_bytes = max_queued_bytes
        self._queued_by_app: dict[str, int] = {}
        self._bytes: dict[str, int] = {}  # request id -> body bytes while queued
        self._labels: dict[str, str] = {}  # request id -> the client's X-Request-Id
        self.queued_bytes = 0
        # Admitted requests whose first token (whole answer, when not streamed) has not
        # come, by class: the part of a class's line that waits in the workers (shedding).
        self._unanswered: dict[str, int] = {}
        self._retry_after_s = retry_after_s
        self._closing: GatewayError | None = None

    # -------------------------------------------------------------------- waiting

    async def admit(
        self,
        req: QueuedRequest,
        disconnected: Callable[[], Awaitable[object]] | None = None,
        eligible_healthy: bool = True,
        body_bytes: int = 0,
        label: str | None = None,
    ) -> Ticket:
        """Queue ``req`` and wait until it is admitted.

        Raises RateLimited (class queue full, the app's queue cap, the queued-bytes cap,
        or the queue timeout), NoWorkerAvailable (no healthy worker serves the request, now
        or while it waits; the gateway is shutting down) or ClientGone. ``disconnected``
        makes an awaitable that completes when the client goes away; if it does first, the
        request leaves the queue without a trace. ``body_bytes``: what its body holds in
        memory while it waits. ``label``: the client's own name for the request (its
        X-Request-Id), shown by ``queue_of`` while it waits.
        """
        now = self.clock()
        if self._closing is not None:
            self._reject(req, "shutdown")
            raise self._closing
        if not eligible_healthy:
            self._reject(req, "no_worker")
            raise self._no_worker()
        cap = self._app_caps.get(req.tenant)
        if cap is not None and self._queued_by_app.get(req.tenant, 0) >= cap:
            self._reject(req, "app_queue_full")
            raise RateLimited(
                f"app {req.tenant} already has {cap} requests queued; retry later",
                retry_after_s=self.drain.retry_after(req.cls, cap, now),
                code="app_queue_full",
            )
        limit = self._max_queued_bytes
        if limit is not None and self.queued_bytes + body_bytes > limit and self._bytes:
            self._reject(req, "queue_bytes_full")
            raise RateLimited(
                f"the gateway holds {self.queued_bytes} bytes of queued requests (limit "
                f"{limit}); retry later",
                retry_after_s=self.drain.retry_after(req.cls, len(self._bytes), now),
                code="queue_bytes_full",
            )
        if not self.scheduler.has_class(req.cls):  # removed by a reload since it arrived
            self._reject(req, "class_removed")
            raise class_gone(req.cls, self._retry_after_s)
        rejection = self.scheduler.enqueue(
            req,
            now,
            self.drain.measured_rate(req.cls, now),
            self.prefill_rates.fastest_seconds(req.prompt_tokens),
            self._unanswered.get(req.cls, 0),
        )
        if rejection is not None:
            self._reject(req, rejection.reason)
            raise self._shed(rejection, now)
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiters[req.id] = fut
        self._requests[req.id] = req
        self._queued_by_app[req.tenant] = self._queued_by_app.get(req.tenant, 0) + 1
        self._bytes[req.id] = body_bytes
        self.queued_bytes += body_bytes
        if label is not None:
            self._labels[req.id] = label
        behind = self.scheduler.ahead(req.id) or 0
        self.pump()
        watcher: asyncio.Future[object] | None = None
        try:
            if not fut.done():
                waits: set[asyncio.Future[Any]] = {fut}
                if disconnected is not None:
                    watcher = asyncio.ensure_future(disconnected())
                    waits.add(watcher)
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if not fut.done():
                raise ClientGone()
            worker = fut.result()  # raises the rejection set by the ticker
        except BaseException:
            self._forget(req.id)
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                # Admitted in the same instant the waiter went away: give the slot back.
                self.scheduler.on_finish(req.id, 0, 0, self.clock())
                self.pump()
            elif self.scheduler.cancel(req.id, self.clock()):
                self.pump()
            raise
        finally:
            if watcher is not None and not watcher.done():
                watcher.cancel()
        self._forget(req.id)
        admitted_at = self.clock()
        if self._on_admit is not None:
            self._on_admit(req, admitted_at - req.arrival)
        interactive = self.scheduler.is_interactive(req.cls)
        self._unanswered[req.cls] = self._unanswered.get(req.cls, 0) + 1
        return Ticket(
            req,
            worker,
            admitted_at,
            self,
            queued_behind=behind,
            interactive=interactive,
            ttft_s=self.scheduler.ttft_target(req.cls) if interactive else None,
            _prefill_running=self.paced.prefill_started(worker, not interactive),
        )

    def _shed(self, rejection: Rejection, now: float) -> RateLimited:
        if rejection.retry_after_s is not None:
            return RateLimited(
                f"the {rejection.cls} line would keep this request past its first-token "
                f"target ({rejection.ahead} requests ahead of it); retry in "
                f"{math.ceil(rejection.retry_after_s)} s",
                retry_after_s=min(300, math.ceil(rejection.retry_after_s)),
                code=rejection.reason,
            )
        return RateLimited(
            f"the {rejection.cls} queue is full ({rejection.queued} requests, "
            f"{rejection.queued_tokens} tokens); retry later",
            retry_after_s=self.drain.retry_after(rejection.cls, rejection.queued, now),
            code=rejection.reason,
        )

    def _reject(self, req: QueuedRequest, reason: str) -> None:
        if self._on_reject is not None:
            self._on_reject(req, reason)

    def _no_worker(self) -> NoWorkerAvailable:
        return NoWorkerAvailable(
            "no worker that serves this model is reachable; try again shortly",
            retry_after_s=self._retry_after_s,
        )

    def queue_of(self, app: str) -> list[dict[str, Any]]:
        """The app's requests waiting now, oldest first: class, wait so far, roughly how
        many requests go before each (``Scheduler.ahead``) and a wait estimate from how
        fast requests finished lately (None before any finished)."""
        now = self.clock()
        rate = self.drain.total_rate(now)
        out: list[dict[str, Any]] = []
        mine = sorted(
            (r for r in self._requests.values() if r.tenant == app),
            key=lambda r: (r.arrival, r.id),
        )
        for r in mine:
            ahead = self.scheduler.ahead(r.id)
            if ahead is None:
                continue  # admitted this instant
            out.append(
                {
                    "request_id": self._labels.get(r.id),
                    "class": r.cls,
                    "waited_ms": round(max(0.0, now - r.arrival) * 1000),
                    "ahead": ahead,
                    "estimated_wait_s": round((ahead + 1) / rate, 1) if rate > 0 else None,
                }
            )
        return out

    @property
    def waiting(self) -> int:
        """Requests waiting for admission."""
        return len(self._waiters)

    def close(self, error: GatewayError) -> None:
        """The gateway is shutting down: fail every waiting request with ``error`` (and
        every later one)."""
        self._closing = error
        now = self.clock()
        for req_id in list(self._waiters):
            req = self._requests[req_id]
            if self.scheduler.cancel(req_id, now):
                self._fail(req, error, "shutdown")

    def _forget(self, req_id: str) -> None:
        self._waiters.pop(req_id, None)
        req = self._requests.pop(req_id, None)
        if req is not None:
            left = self._queued_by_app.get(req.tenant, 1) - 1
            if left > 0:
                self._queued_by_app[req.tenant] = left
            else:
                self._queued_by_app.pop(req.tenant, None)
        self.queued_bytes -= self._bytes.pop(req_id, 0)
        self._labels.pop(req_id, None)

    def reconfigure(
        self,
        *,
        early_release: float | None,
        pacing: PacingRule | None,
        app_queue_caps: dict[str, int],
        max_queued_bytes: int | None,
        retry_after_s: int,
        app_pacing_floor: int | None = None,
    ) -> None:
        """New settings (a reload): later decisions use them; queued requests stay. A new
        pacing rule restarts the pacers (from the rule's max cap)."""
        self.early_release = early_release
        self.paced.reconfigure(pacing, app_pacing_floor)
        self._app_caps = dict(app_queue_caps)
        self._max_queued_bytes = max_queued_bytes
        self._retry_after_s = retry_after_s
        self.pump()

    # -------------------------------------------------------------------- pacing

    def pacing_state(self) -> dict[str, PacingState]:
        """Per paced worker: its caps, the last interval's mean token gap, its duty."""
        return self.paced.state()

    @property
    def flood_at(self) -> int | None:
        """Interactive sequences that make an app a flood on a worker (None: no per-app
        pacing, no app is a flood)."""
        return self.paced.flood_threshold

    def upstream_priority(self, req: QueuedRequest, worker: str) -> int:
        """The priority to send ``worker`` with ``req`` (admitted there) where it schedules
        by priority: the class's, after every other app's within it while ``req``'s app
        floods the worker (vLLM then prefills a light app's prompt before the flood's queue)."""
        at = self.paced.flood_threshold
        floods = False
        if at is not None:
            usage = self.scheduler.worker_usage().get(worker)
            floods = usage is not None and usage.interactive_by_app.get(req.tenant, 0) >= at
        return upstream_priority(req.priority, floods)

    def _background_behind(self, now: float) -> bool:
        """Whether a background class's oldest queued request has waited past its share
        of its first-token target (only asked when the prefill duty watches for it)."""
        if not self.paced.watches_backlog:
            return False
        classes = self.scheduler.classes
        targets = {
            n: c.ttft_s for n, c in classes.items() if not c.interactive and c.ttft_s is not None
        }
        oldest = {n: st.oldest_arrival for n, st in self.scheduler.queue_stats().items()}
        return background_behind(oldest, targets, now)

    def snapshots(self, now: float | None = None) -> list[WorkerSnapshot]:
        """The pool's worker snapshots with each paced worker's pacing caps and every
        worker's flood limit."""
        snaps = self._snapshots()
        if not self.paced.active and self.paced.flood is None:
            return list(snaps)
        return self.paced.apply(snaps, self.clock() if now is None else now)

    # -------------------------------------------------------------------- pumping

    def pump(self) -> None:
        """Admit whatever fits now and wake those waiters."""
        now = self.clock()
        for cls in self.scheduler.class_names():  # busy periods, for the drain rates
            self.drain.busy(cls, now, self.scheduler.active(cls))
        if not self._waiters:
            return
        paced = self.paced.active
        for adm in self.scheduler.admit(now, self.snapshots(now)):
            if paced and not self.scheduler.is_interactive(adm.request.cls):
                self.paced.charge(adm.worker, now, adm.request.prompt_tokens)
            fut = self._waiters.get(adm.request.id)
            if fut is not None and not fut.done():
                fut.set_result(adm.worker)
            else:  # nobody waits for it any more
                self.scheduler.on_finish(adm.request.id, 0, 0, self.clock())
        if paced and self._waiters:
            self._pump_when_prefill_opens(now)

    def _pump_when_prefill_opens(self, now: float) -> None:
        """Pump again when a worker's prefill debt will be paid, not at the next tick: a
        background prompt waiting on the duty would otherwise wait up to a tick longer."""
        wait = self.paced.prefill_opens_in(now)
        if wait is None or not math.isfinite(wait):
            return
        loop = _running_loop()
        if loop is None:
            return
        due = loop.time() + wait
        if self._opens is not None:
            if self._opens.when() <= due:
                return
            self._opens.cancel()
        self._opens = loop.call_at(due, self._prefill_opened)

    def _prefill_opened(self) -> None:
        self._opens = None
        self.pump()

    def _fail(self, req: QueuedRequest, exc: GatewayError, reason: str) -> None:
        fut = self._waiters.get(req.id)
        self._reject(req, reason)
        if fut is not None and not fut.done():
            fut.set_exception(exc)

    def answered(self, cls: str) -> None:
        """An admitted request of ``cls`` saw its first token, or ended without one (once
        per ticket)."""
        count_down(self._unanswered, cls)

    def unanswered(self, cls: str) -> int:
        """Admitted requests of ``cls`` still waiting for their first token."""
        return self._unanswered.get(cls, 0)

    def release_prefill_later(self, ticket: Ticket, fraction: float = 1.0) -> None:
        when = ticket.admitted_at + fraction * self.prefill_rates.seconds(
            ticket.worker, ticket.request.prompt_tokens
        )
        heapq.heappush(self._releases, (when, next(self._seq), ticket))
        # On time, not at the next tick: a 50 ms tick left the worker without a next prompt
        # for up to 50 ms after each prefill (batches of long prompts ran ~30% slower).
        loop = _running_loop()
        if loop is None:
            return
        loop.call_later(max(0.0, when - self.clock()), self._release_due)

    def _release_due(self) -> None:
        now = self.clock()
        while self._releases and self._releases[0][0] <= now:
            heapq.heappop(self._releases)[2].first_token(observed=False)

    def tick(self) -> None:
        """Release estimated prefills, expire queued requests past their class's queue
        timeout, fail those that no healthy worker can serve, admit what fits."""
        now = self.clock()
        if self.paced.active:
            self.paced.update(now, self.scheduler.worker_usage(), self._background_behind(now))
        self._release_due()
        # A standing line's backlog is told now, not after minutes in the queue.
        trimmed = self.scheduler.trim(
            now, lambda cls: self.drain.measured_rate(cls, now), self._unanswered
        )
        for req, rejection in trimmed:
            self._fail(req, self._shed(rejection, now), rejection.reason)
        for req in self.scheduler.expire(now):
            depth = self.scheduler.queue_stats()[req.cls].depth
            self._fail(
                req,
                RateLimited(
                    f"waited {now - req.arrival:.1f} s in the {req.cls} queue, past its "
                    "queue timeout; retry later",
                    retry_after_s=self.drain.retry_after(req.cls, depth, now),
                    code="queue_timeout",
                ),
                "queue_timeout",
            )
        snaps = self._snapshots() if self._waiters else ()
        healthy = {s.name for s in snaps if s.healthy}
        if len(healthy) < len(snaps):  # the walk below runs only while a worker is down
            # A request none of whose workers is healthy fails now with 503, not at its
            # queue timeout: other models' workers may be up, its own are not.
            for req_id in list(self._waiters):
                req = self._requests[req_id]
                workers = req.workers
                servable = bool(healthy) if workers is None else bool(workers & healthy)
                if not servable and self.scheduler.cancel(req_id, now):
                    self._fail(req, self._no_worker(), "no_worker")
        self.pump()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._tick_s)
            try:
                self.tick()
            except Exception:  # the ticker must survive anything
                log.exception("admission tick failed")

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="admission-ticker")

    async def stop(self) -> None:
        if self._opens is not None:
            self._opens.cancel()
            self._opens = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
