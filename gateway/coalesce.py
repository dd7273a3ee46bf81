"""Embeddings coalescing: concurrent ``/v1/embeddings`` requests become one upstream call.

Requests for the same worker, class, model and parameters (every body key but ``input``
must be equal: ``encoding_format``, ``dimensions``, ``user``, ``truncate_prompt_tokens``...)
join one *batch*; the class's batching window (``policies.windows``) decides when it goes.
The batch is sent as one call whose ``input`` is every member's items in join order; the
answer is split back: each caller gets its own items, ``index`` counted from 0 again, and
its own ``usage``. A caller with several items keeps them together in one batch.

Only inputs vLLM's embeddings endpoint accepts as a text or token batch are merged: a string,
an array of strings, an array of token ids, an array of token-id arrays. Each caller's
input is checked before it is queued (a malformed one gets 400 alone, see :func:`mergeable`);
chat-style inputs (message objects) and the binary ``bytes`` encodings are forwarded alone,
unchanged. If a merged call still fails with 400 or 422, it is split in halves and each is
retried (down to single requests), so only the bad one fails. A caller that disconnects
before its batch is sent leaves the batch; after that, its part of the answer is dropped.

**Admission.** Each caller is admitted by the scheduler on its own before it joins a batch,
and holds its own ticket until the merged call returns. vLLM turns every item of a list
input into its own engine request, so one ticket per caller keeps the scheduler's accounting
true to what runs on the worker (in-flight counts, per-class caps, prefill tokens), keeps
fair sharing charging each app for its own tokens, and keeps shedding, queue timeouts and
disconnects per request. A batch therefore never holds more callers than the worker's budget
admits at once.

Each caller's share of the merged call's usage: ``gateway/embed_batch.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.responses import Response

from hearthgate.gateway.embed_batch import Item, Plan, split_answer
from hearthgate.gateway.errors import GatewayError, UpstreamFailed
from hearthgate.gateway.metrics import GatewayMetrics
from hearthgate.gateway.parse import ParsedRequest
from hearthgate.gateway.proxy import Result, openai_error_body, upstream_body
from hearthgate.gateway.settings import RequestClass, Settings
from hearthgate.gateway.upstream import UpstreamClient, WorkerUnreachable
from hearthgate.gateway.workers import WorkerState
from hearthgate.policies.windows import ArrivalGaps, BatchView, Load, WindowPolicy, decide

log = logging.getLogger("hearthgate.coalesce")

_RETRY_ALONE = (400, 422)


# ------------------------------------------------------------------ the coalescer


@dataclass(frozen=True, slots=True)
class Answer:
    """An upstream answer: status, body and its content type."""

    status: int
    content: bytes
    content_type: str = "application/json"
    prompt_tokens: int | None = None  # the caller's share, on a split answer


Upstream = Callable[[WorkerState, bytes], Awaitable[Answer]]
"""Post an embeddings body to a worker. Raises WorkerUnreachable when it could not be
delivered (nothing was computed), UpstreamFailed when the worker broke off or timed out."""


class TicketHooks(Protocol):
    """What the coalescer reports about a caller's admission (gateway.admission.Ticket)."""

    def expect_no_stream(self) -> None: ...

    def finish(self, prompt_tokens: int | None, output_tokens: int | None) -> None: ...


class Activity(Protocol):
    """What the window reacts to for one worker: requests admitted to it and not finished
    (callers waiting in a batch included), and whether interactive work is active."""

    def __call__(self, worker: str) -> tuple[int, bool]: ...


class PoolHooks(Protocol):
    def release(self, worker: WorkerState) -> None: ...

    def mark_down(self, worker: WorkerState, reason: str) -> None: ...


@dataclass(eq=False)
class _Part:
    plan: Plan
    worker: WorkerState
    ticket: TicketHooks
    cls: str
    arrival: float
    joined_at: float
    tokens: int
    future: asyncio.Future[Answer]
    priority: int | None = None
    sent: bool = False


@dataclass(eq=False)
class _Batch:
    key: tuple[str, str, str]
    worker: WorkerState
    policy: WindowPolicy
    opened_at: float
    parts: list[_Part] = field(default_factory=list)
    timer: asyncio.Handle | None = None

    @property
    def size(self) -> int:
        return sum(len(p.plan.items) for p in self.parts)

    @property
    def tokens(self) -> int:
        return sum(p.tokens for p in self.parts)

    def view(self) -> BatchView:
        return BatchView(
            opened_at=self.opened_at,
            oldest_arrival=min(p.arrival for p in self.parts),
            last_join=max(p.joined_at for p in self.parts),
            size=self.size,
            tokens=self.tokens,
        )


def window_policies(settings: Settings) -> dict[str, WindowPolicy]:
    """Each class's batching window, by class name."""
    return {name: window_policy(c) for name, c in settings.classes.items()}


def window_policy(c: RequestClass) -> WindowPolicy:
    """A class's settings as the pure window policy (milliseconds to seconds)."""
    w = c.batching_window()
    return WindowPolicy(
        min_wait_s=w.min_wait_ms / 1000,
        max_wait_s=w.max_wait_ms / 1000,
        max_batch_size=w.max_batch_size,
        max_batch_tokens=w.max_batch_tokens,
        ttft_s=None if c.ttft_ms is None else c.ttft_ms / 1000,
        ttft_margin_s=w.ttft_margin_ms / 1000,
    )


class Coalescer:
    """Gathers embeddings callers into batches and answers each from one upstream call."""

    def __init__(
        self,
        upstream: Upstream,
        pool: PoolHooks,
        policies: dict[str, WindowPolicy],
        activity: Activity,
        metrics: GatewayMetrics,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._upstream = upstream
        self._pool = pool
        self._policies = policies
        self._activity = activity
        self._metrics = metrics
        self._clock = clock
        self._open: dict[tuple[str, str, str], _Batch] = {}
        self._waiting: dict[str, int] = {}  # worker -> callers in open batches
        self._gaps: dict[str, ArrivalGaps] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------ caller side

    async def forward(
        self,
        p: Plan,
        worker: WorkerState,
        ticket: TicketHooks,
        cls: str,
        prompt_tokens: int,
        received_at: float,
        done: Callable[[Result], None],
        disconnected: Callable[[], Awaitable[object]] | None = None,
        priority: int | None = None,
    ) -> Response:
        """Answer one admitted caller (of class ``cls``, with a prompt estimate of
        ``prompt_tokens``) through a batch. The caller's admission (``ticket`` and one
        in-flight count on ``worker``, handed over by its lease) is given back exactly once:
        by the batch, or here if the caller leaves before the batch is sent. Raises
        WorkerUnreachable (nothing was computed; the caller may retry elsewhere) or a
        GatewayError. ``priority`` is sent to workers that schedule by priority."""
        now = self._clock()
        fut: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        part = _Part(p, worker, ticket, cls, received_at, now, prompt_tokens, fut, priority)
        self._join(part)
        watcher: asyncio.Future[object] | None = None
        try:
            waits: set[asyncio.Future[Any]] = {fut}
            if disconnected is not None:
                watcher = asyncio.ensure_future(disconnected())
                waits.add(watcher)
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            self._leave(part)
            raise
        finally:
            if watcher is not None and not watcher.done():
                watcher.cancel()
        if not fut.done():  # the client went away first
            self._leave(part)
            return Response(status_code=499)
        answer = fut.result()  # raises the batch's error
        result = Result(answer.status)
        if answer.status == 200:
            result.completed = True
            result.e2e_s = self._clock() - received_at
            result.prompt_tokens = answer.prompt_tokens
        done(result)
        return Response(
            content=answer.content,
            status_code=answer.status,
            headers={"x-hearthgate-worker": worker.name},
            media_type=answer.content_type,
        )

    def set_policies(self, policies: dict[str, WindowPolicy]) -> None:
        """Each class's batching window from now on (a settings reload); open batches
        close under the policy they opened with."""
        self._policies = policies

    def _leave(self, part: _Part) -> None:
        """The caller went away: leave the open batch (releasing its ticket) or, once sent,
        let the batch finish it and drop its answer."""
        if part.sent:
            return
        for key, batch in list(self._open.items()):
            if part in batch.parts:
                batch.parts.remove(part)
                self._waiting[part.worker.name] -= 1
                if not batch.parts:
                    if batch.timer is not None:
                        batch.timer.cancel()
                    del self._open[key]
                break
        part.sent = True  # never sent now
        self._pool.release(part.worker)
        part.ticket.finish(0, 0)

    # ------------------------------------------------------------ batching

    def _join(self, part: _Part) -> None:
        policy = self._policies.get(part.cls) or WindowPolicy()
        now = part.joined_at
        self._gaps.setdefault(part.cls, ArrivalGaps(cap_s=max(1.0, 10 * policy.max_wait_s)))
        self._gaps[part.cls].observe(now)
        key = (part.worker.name, part.cls, part.plan.params)
        batch = self._open.get(key)
        if batch is not None and not policy.fits(
            batch.size, batch.tokens, len(part.plan.items), part.tokens
        ):
            self._send(batch)
            batch = None
        if batch is None:
            batch = _Batch(key, part.worker, policy, now)
            self._open[key] = batch
        batch.parts.append(part)
        self._waiting[part.worker.name] = self._waiting.get(part.worker.name, 0) + 1
        self._schedule(batch)

    def _schedule(self, batch: _Batch) -> None:
        now = self._clock()
        admitted, interactive = self._activity(batch.worker.name)
        # Busy: admitted work on this worker besides the callers still gathering here.
        busy = admitted > self._waiting.get(batch.worker.name, 0)
        gap = self._gaps[batch.parts[0].cls].expected_gap(now)
        d = decide(batch.policy, batch.view(), Load(busy, interactive), gap, now)
        if batch.timer is not None:
            batch.timer.cancel()
        loop = asyncio.get_running_loop()
        if batch.policy.full(batch.size, batch.tokens):
            self._send(batch)
        elif d.due(now):
            # Not synchronously: callers woken in the same admission round join first.
            batch.timer = loop.call_soon(self._send, batch)
        else:
            batch.timer = loop.call_later(d.dispatch_at - now, self._send, batch)

    def _send(self, batch: _Batch) -> None:
        if self._open.get(batch.key) is not batch:
            return  # already sent (or emptied)
        del self._open[batch.key]
        if batch.timer is not None:
            batch.timer.cancel()
        self._waiting[batch.worker.name] -= len(batch.parts)
        now = self._clock()
        for p in batch.parts:
            p.sent = True
            self._metrics.coalesce_window.labels(self._metrics.class_label(p.cls)).observe(
                now - p.joined_at
            )
        task = asyncio.create_task(self._run(batch.worker, batch.parts), name="coalesced-call")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------ upstream side

    async def _run(self, worker: WorkerState, parts: list[_Part]) -> None:
        """One upstream call for ``parts``; every part's future gets its answer or error,
        and every ticket is finished and pool slot released exactly once."""
        model = self._metrics.model_label(parts[0].plan.parsed.model)
        self._metrics.coalesce_batch_size.labels(model).observe(len(parts))
        self._metrics.coalesce_upstream_calls.labels(model).inc()
        for p in parts:
            p.ticket.expect_no_stream()
        try:
            outcome = await self._call(worker, parts)
        except BaseException:  # cancelled (shutdown), or a bug: never leak a slot
            self._end(parts, UpstreamFailed("the embeddings call was interrupted"))
            raise
        if outcome is not None:
            self._end(parts, *outcome)
            return
        # Some member's input was refused: retry each half (bisecting down to single
        # requests), so only the bad one fails, in about 2 log2(n) calls for one bad input.
        log.info("merged embeddings call of %d requests refused; splitting it", len(parts))
        mid = len(parts) // 2
        await asyncio.gather(self._run(worker, parts[:mid]), self._run(worker, parts[mid:]))

    async def _call(
        self, worker: WorkerState, parts: list[_Part]
    ) -> tuple[BaseException | None, list[Answer], list[int]] | None:
        """Make the call: (error, answers, prompt tokens) per part, or None when the merged
        call was refused as a bad request and the parts should be retried apart."""
        try:
            answer = await self._upstream(worker, self._body(worker, parts))
        except WorkerUnreachable as exc:
            if exc.refused:
                self._pool.mark_down(worker, "refused an embeddings call")
            return exc, [], []
        except GatewayError as exc:
            return exc, [], []
        if answer.status in _RETRY_ALONE and len(parts) > 1:
            return None
        if answer.status != 200:
            model = parts[0].plan.parsed.model
            body = openai_error_body(answer.status, answer.content, "/v1/embeddings", model)
            return None, [Answer(answer.status, body, "application/json")] * len(parts), []
        logical = parts[0].plan.parsed.model
        try:
            shares = split_answer(answer.content, [p.plan.items for p in parts], logical)
        except (ValueError, KeyError, TypeError, AttributeError):
            return UpstreamFailed(f"worker {worker.name} answered malformed JSON"), [], []
        if len(parts) > 1:
            self._metrics.coalesce_saved.labels(self._metrics.model_label(logical)).inc(
                len(parts) - 1
            )
        answers = [Answer(200, s.body, answer.content_type, s.prompt_tokens) for s in shares]
        return None, answers, [s.prompt_tokens for s in shares]

    def _end(
        self,
        parts: list[_Part],
        error: BaseException | None,
        answers: Sequence[Answer] = (),
        tokens: Sequence[int] = (),
    ) -> None:
        for k, p in enumerate(parts):
            self._pool.release(p.worker)
            p.ticket.finish(tokens[k] if tokens else 0, 0)
            if p.future.done():
                continue  # the caller went away; its part is dropped
            if isinstance(error, WorkerUnreachable):
                p.future.set_exception(WorkerUnreachable(error.worker, error.refused))
            elif error is not None:
                p.future.set_exception(error)
            else:
                p.future.set_result(answers[k])

    @staticmethod
    def _body(worker: WorkerState, parts: list[_Part]) -> bytes:
        first = parts[0].plan.parsed
        merged: list[Item] = [i for p in parts for i in p.plan.items]
        body = {**first.body, "input": merged if len(parts) > 1 else first.body["input"]}
        parsed = ParsedRequest(first.endpoint, body, first.model, False, False, first.max_tokens)
        return upstream_body(parsed, worker, parts[0].priority)

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await t


def client_upstream(client: UpstreamClient, settings: Settings) -> Upstream:
    """The real upstream: POST ``/v1/embeddings`` on the worker through the gateway's
    client (its error mapping and timeouts)."""

    async def post(worker: WorkerState, body: bytes) -> Answer:
        resp = await client.post(
            worker.name,
            worker.spec.url + "/v1/embeddings",
            body,
            settings.upstream.read_timeout_s,
        )
        try:
            return Answer(resp.status, await resp.read(), resp.content_type)
        finally:
            resp.close()

    return post
