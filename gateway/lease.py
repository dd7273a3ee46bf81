"""One lease per request: everything a request holds, given back exactly once.

A request, once classified, may hold a place in its class queue, an admission on a worker
(the scheduler's slot, prefill tokens, its app's in-flight place), the worker's in-flight
count and a share of a coalesced embeddings call. All of it belongs to a :class:`Lease`,
entered with ``async with`` around the whole request (the response included); leaving it
gives everything back, whatever ended the request: the answer, an upstream error, the
client leaving, cancellation, shutdown. Forwarders (the proxy, the coalescer) only report
progress to the lease; they release nothing themselves.

Two signals reach a request from outside, each its own future rather than a swallowed
``CancelledError``:

- *the client went away* (:class:`ClientGone`): one watcher reads the ASGI ``receive``
  channel for ``http.disconnect``; every wait of the request races it;
- *the request was cut* (:class:`WorkerLost`): its worker was marked down, or the gateway's
  shutdown drain ran out. A request that has sent nothing to its client fails over (or gets
  503); a stream in progress ends with an error event.

Bookkeeping is synchronous (no ``await`` between taking and giving back), so a cancelled
task cannot leave it half done. :class:`LeaseBook` knows every open lease: ``/status``
counts them, and the worker pool and the shutdown cut them.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Awaitable
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.types import Receive

from hearthgate.gateway.errors import ClientGone, GatewayError
from hearthgate.gateway.upstream import UpstreamResponse
from hearthgate.policies.types import QueuedRequest

if TYPE_CHECKING:
    from hearthgate.gateway.admission import AdmissionController
    from hearthgate.gateway.ticket import Ticket
    from hearthgate.gateway.workers import WorkerPool, WorkerState

log = logging.getLogger("hearthgate.lease")

T = TypeVar("T")


class Phase(enum.StrEnum):
    NEW = "new"  # classified, holding nothing
    QUEUED = "queued"  # waiting in its class queue
    ADMITTED = "admitted"  # admitted to a worker, forwarding
    DONE = "done"  # everything given back


class WorkerLost(Exception):
    """The request was cut: its worker went down, or the gateway is shutting down.
    ``error`` is what the client sees if nothing was sent yet (or as the stream's last
    event); ``failover`` whether another worker may take the request."""

    def __init__(self, error: GatewayError, failover: bool) -> None:
        super().__init__(error.message)
        self.error = error
        self.failover = failover


class FirstByteTimeout(Exception):
    """The worker sent nothing within the class's first-byte limit."""


class LeaseBook:
    """Every open lease, for ``/status`` and for cutting a worker's or every request."""

    def __init__(self) -> None:
        self._open: set[Lease] = set()
        self.opened = 0  # leases ever entered (for tests and /status)
        self.released = 0  # leases given back

    def add(self, lease: Lease) -> None:
        self._open.add(lease)
        self.opened += 1

    def remove(self, lease: Lease) -> None:
        if lease in self._open:
            self._open.remove(lease)
            self.released += 1

    def counts(self) -> dict[str, int]:
        """Open leases by phase, plus the totals ever opened and released."""
        out = {p.value: 0 for p in Phase if p is not Phase.DONE}
        for lease in self._open:
            if lease.phase is not Phase.DONE:
                out[lease.phase.value] += 1
        out["open"] = len(self._open)
        out["opened_total"] = self.opened
        out["released_total"] = self.released
        return out

    def cut_worker(self, worker: str, error: GatewayError) -> int:
        """Cut every request admitted to ``worker`` (it went down); how many."""
        hit = [le for le in self._open if le.worker is not None and le.worker.name == worker]
        for lease in hit:
            lease.cut(WorkerLost(error, failover=True))
        return len(hit)

    def cut_all(self, error: GatewayError) -> int:
        """Cut every open request (the shutdown drain ran out); how many."""
        hit = list(self._open)
        for lease in hit:
            lease.cut(WorkerLost(error, failover=False))
        return len(hit)

    def __len__(self) -> int:
        return len(self._open)


class Lease:
    """What one request holds. Enter it with ``async with``; see the module docstring."""

    def __init__(
        self,
        book: LeaseBook,
        admission: AdmissionController,
        pool: WorkerPool,
        receive: Receive | None = None,
        body_bytes: int = 0,
        label: str | None = None,
    ) -> None:
        self._book = book
        self._label = label
        self._admission = admission
        self._pool = pool
        self._receive = receive
        self.body_bytes = body_bytes
        self.phase = Phase.NEW
        self.ticket: Ticket | None = None
        self.worker: WorkerState | None = None
        self.upstream: UpstreamResponse | None = None  # the answer being read, if any
        self._usage: tuple[int | None, int | None] = (None, None)
        self._handed = False  # the admission belongs to a coalesced call now
        self._gone: asyncio.Future[None] | None = None
        self._lost: asyncio.Future[WorkerLost] | None = None
        self._watcher: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ entering, leaving

    async def __aenter__(self) -> Lease:
        loop = asyncio.get_running_loop()
        self._gone = loop.create_future()
        self._lost = loop.create_future()
        if self._receive is not None:
            self._watcher = loop.create_task(self._watch(self._receive), name="client-watch")
        self._book.add(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        for fut in (self._gone, self._lost):
            if fut is not None and fut.done() and not fut.cancelled():
                fut.exception()  # retrieved: no "never retrieved" warning

    async def _watch(self, receive: Receive) -> None:
        with contextlib.suppress(Exception):
            while (await receive())["type"] != "http.disconnect":
                pass
        if self._gone is not None and not self._gone.done():
            self._gone.set_result(None)

    def release(self) -> None:
        """Give everything back (idempotent): the admission with the usage reported so far,
        the worker's in-flight count, the queue place; the lease leaves the book."""
        if self.phase is Phase.DONE:
            return
        self.end_attempt(*self._usage)
        self.phase = Phase.DONE
        self._book.remove(self)

    # ------------------------------------------------------------ the admission

    async def admit(self, req: QueuedRequest, eligible_healthy: bool = True) -> WorkerState:
        """Queue ``req`` and wait for its admission; the worker it goes to. Raises
        ClientGone, or the GatewayError that shed it."""
        if self.phase is not Phase.NEW:
            raise RuntimeError(f"lease is {self.phase}, not new")
        self.phase = Phase.QUEUED
        try:
            ticket = await self._admission.admit(
                req, self.wait_gone, eligible_healthy, self.body_bytes, self._label
            )
        finally:
            if self.phase is Phase.QUEUED:
                self.phase = Phase.NEW
        self.ticket = ticket
        self.worker = self._pool.state(ticket.worker)
        self._pool.acquire(self.worker)
        self.phase = Phase.ADMITTED
        if self._lost is not None and self._lost.done():  # cut while it was queued: reset
            self._lost = asyncio.get_running_loop().create_future()
        return self.worker

    def end_attempt(self, prompt_tokens: int | None = 0, output_tokens: int | None = 0) -> None:
        """Give back this attempt's admission (a failover tries again with a new one)."""
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None
        if self.ticket is not None:
            ticket, self.ticket = self.ticket, None
            ticket.finish(prompt_tokens, output_tokens)
        if self.worker is not None:
            worker, self.worker = self.worker, None
            if not self._handed:
                self._pool.release(worker)
        self._handed = False
        if self.phase is Phase.ADMITTED:
            self.phase = Phase.NEW
        self._usage = (None, None)
        if self._lost is not None and self._lost.done():
            self._lost.exception()
            self._lost = asyncio.get_running_loop().create_future()

    def queue_headers(self) -> dict[str, str]:
        """Response headers an app may show its user: the class the request ran in, how
        long it waited before a worker took it (failed-over attempts included) and how many
        requests were queued ahead of it when it arrived."""
        t = self.ticket
        if t is None:
            return {}
        waited_ms = max(0.0, t.admitted_at - t.request.arrival) * 1000
        return {
            "x-hearthgate-class": t.request.cls,
            "x-hearthgate-queued-ms": f"{waited_ms:.0f}",
            "x-hearthgate-queued-behind": str(t.queued_behind),
        }

    def hand_over(self) -> Ticket:
        """Hand this attempt's admission (its ticket and the worker's in-flight count) to
        a coalesced embeddings call, which gives it back exactly once when the call ends
        or the caller leaves before it is sent."""
        if self.ticket is None:
            raise RuntimeError("hand_over needs an admitted lease")
        ticket, self.ticket = self.ticket, None
        self._handed = True
        return ticket

    # ------------------------------------------------------------ progress reports

    def expect_stream(self) -> None:
        if self.ticket is not None:
            self.ticket.expect_stream()

    def expect_no_stream(self) -> None:
        if self.ticket is not None:
            self.ticket.expect_no_stream()

    def first_token(self, observed: bool = True) -> None:
        if self.ticket is not None:
            self.ticket.first_token(observed)

    def progress(self, output_tokens_so_far: int) -> None:
        if self.ticket is not None:
            self.ticket.progress(output_tokens_so_far)

    def usage(self, prompt_tokens: int | None, output_tokens: int | None) -> None:
        """The request's token counts as the worker reported them (or as streamed so far);
        charged when the admission is given back."""
        self._usage = (prompt_tokens, output_tokens)

    # ------------------------------------------------------------ signals

    async def wait_gone(self) -> None:
        """Completes when the client went away."""
        if self._gone is not None:
            await asyncio.shield(self._gone)

    def cut(self, lost: WorkerLost) -> None:
        """Cut the request: a pending wait raises ``lost``; a body being relayed breaks off
        with its error."""
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(lost)
        if self.upstream is not None:
            self.upstream.abort(lost)

    async def guard(self, aw: Awaitable[T], timeout_s: float | None = None) -> T:
        """Await ``aw`` unless the client goes away (ClientGone), the request is cut
        (WorkerLost) or ``timeout_s`` passes (FirstByteTimeout) first; ``aw`` is cancelled
        then."""
        task = asyncio.ensure_future(aw)
        waits: set[asyncio.Future[Any]] = {task}
        if self._gone is not None:
            waits.add(self._gone)
        if self._lost is not None:
            waits.add(self._lost)
        try:
            done, _ = await asyncio.wait(
                waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        except asyncio.CancelledError:
            task.cancel()
            _close_result(task)
            raise
        if task in done:
            return task.result()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        _close_result(task)
        if self._gone is not None and self._gone.done():
            raise ClientGone()
        if self._lost is not None and self._lost.done():
            raise self._lost.result()
        raise FirstByteTimeout()

    def __repr__(self) -> str:
        worker = None if self.worker is None else self.worker.name
        return f"Lease({self.phase}, worker={worker})"


def _close_result(task: asyncio.Future[Any]) -> None:
    """``task`` finished on its own just as it was given up (the answer arrived in the same
    instant the client left or the request was cancelled): close what it returned, an
    upstream answer nobody will read, so its connection goes back to the pool."""
    if task.done() and not task.cancelled() and task.exception() is None:
        close = getattr(task.result(), "close", None)
        if callable(close):
            close()
