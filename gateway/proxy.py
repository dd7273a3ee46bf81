"""Forwarding one request to a worker and relaying the answer back.

Streaming answers are relayed event by event as they arrive. The upstream request always
asks for the usage chunk so the gateway can count tokens; the client sees it only if it asked.
When the client goes away, the upstream response is closed, which makes vLLM abort the request.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import anyio
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.errors import GatewayError, UpstreamFailed, sse_error_event
from gateway.parse import ParsedRequest
from gateway.settings import Settings
from gateway.sse import SseSplitter, StreamObserver
from gateway.workers import WorkerPool, WorkerState

log = logging.getLogger("hearthgate.proxy")

_PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}
_JSON = {"Content-Type": "application/json"}
# A worker that answers with one of these before the client got any byte failed as a
# whole (vLLM: its engine died, e.g. while shutting down): the request is retried on
# another worker, and the answer passed on only when none is left.
_RETRY_STATUS = frozenset({500, 502, 503, 504})
# Failures that happen before the worker accepted the request: safe to retry elsewhere.
# Nothing listens there: the worker is down.
_REFUSED = (aiohttp.ClientConnectorError, ConnectionRefusedError)
# A pooled connection the worker had already closed (keep-alive race): try again.
# A worker that does not accept the connection in time has not seen the request either.
_DROPPED = (
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientOSError,
    ConnectionResetError,
    aiohttp.ConnectionTimeoutError,
)


def model_swap(parsed: ParsedRequest, worker: WorkerState) -> tuple[bytes, bytes] | None:
    """(upstream, logical) JSON-encoded model names when ``worker`` serves the requested
    logical model under another name; None when the names agree."""
    upstream = worker.spec.upstream_models.get(parsed.model)
    if upstream is None or upstream == parsed.model:
        return None
    return json.dumps(upstream).encode(), json.dumps(parsed.model).encode()


def swap_model(data: bytes, swap: tuple[bytes, bytes]) -> bytes:
    """``data`` with the upstream's ``"model"`` value replaced by the logical name."""
    upstream, logical = swap
    for sep in (b'"model":', b'"model": '):
        data = data.replace(sep + upstream, sep + logical)
    return data


class RelayResponse(StreamingResponse):
    """A streaming response that notices a client disconnect even while upstream is silent.

    Starlette only notices a disconnect at the next write on newer ASGI servers; during a
    long prefill there is nothing to write, and vLLM would keep computing for nobody. This
    listens for ``http.disconnect`` alongside the relay and always closes the body iterator,
    so its ``finally`` (which closes the upstream request) runs at once.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:

                async def relay() -> None:
                    with contextlib.suppress(OSError):  # the client went away mid-write
                        await self.stream_response(send)
                    tg.cancel_scope.cancel()

                tg.start_soon(relay)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


class TicketHooks(Protocol):
    """What the proxy reports about an admitted request (see gateway.admission.Ticket)."""

    def first_token(self, observed: bool = True) -> None: ...

    def expect_no_stream(self) -> None: ...

    def expect_stream(self) -> None: ...

    def progress(self, output_tokens_so_far: int) -> None: ...

    def finish(self, prompt_tokens: int | None, output_tokens: int | None) -> None: ...


class WorkerUnreachable(Exception):
    """The worker refused or dropped the connection before answering; safe to retry.
    ``refused``: nothing listens (the worker is marked down); else the connection dropped."""

    def __init__(self, worker: str, refused: bool, answer: Response | None = None) -> None:
        super().__init__(worker)
        self.worker = worker
        self.refused = refused
        self.answer = answer  # the worker's own error answer, for when no retry is left


@dataclass
class Result:
    """How one forwarded request went, for metrics and SLO accounting."""

    status: int
    ttft_s: float | None = None
    gaps: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    e2e_s: float | None = None
    completed: bool = False


class Proxy:
    """Sends parsed requests to workers; owns nothing but references to shared parts."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        pool: WorkerPool,
        settings: Settings,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._session = session
        self._pool = pool
        self._settings = settings
        self._clock = clock
        # sock_connect, not connect: waiting for a pooled connection is not a failure.
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=settings.upstream.connect_timeout_s,
            sock_read=settings.upstream.read_timeout_s,
        )

    @staticmethod
    def upstream_body(parsed: ParsedRequest, worker: WorkerState, priority: int | None) -> bytes:
        body: dict[str, Any] = dict(parsed.body)
        body["model"] = worker.spec.upstream_model(parsed.model)
        if parsed.stream and not parsed.wants_usage:
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        if worker.spec.priority_scheduling and priority is not None:
            body["priority"] = priority  # vLLM: lower runs first
        else:
            # The gateway orders the work; vLLM's priority only applies where it is enabled.
            body.pop("priority", None)
        return json.dumps(body).encode()

    async def forward(
        self,
        route: str,
        parsed: ParsedRequest,
        worker: WorkerState,
        ticket: TicketHooks,
        received_at: float,
        done: Callable[[Result], None],
        priority: int | None = None,
    ) -> Response:
        """Send ``parsed`` to ``worker``; ``ticket`` hears progress and the finish (exactly
        once), ``done`` the result. Raises WorkerUnreachable before anything was sent back."""
        self._pool.acquire(worker)
        if parsed.stream:
            ticket.expect_stream()
        else:
            ticket.expect_no_stream()
        try:
            resp = await self._session.post(
                worker.spec.url + _PATHS[parsed.endpoint],
                data=self.upstream_body(parsed, worker, priority),
                headers=_JSON,
                timeout=self._timeout,
            )
        except _REFUSED as exc:
            self._pool.release(worker)
            ticket.finish(0, 0)
            self._pool.mark_down(worker, f"{type(exc).__name__}: {exc}")
            raise WorkerUnreachable(worker.name, refused=True) from None
        except _DROPPED as exc:
            self._pool.release(worker)
            ticket.finish(0, 0)
            log.info("worker %s dropped the connection before answering: %r", worker.name, exc)
            self._pool.note_dropped(worker)
            raise WorkerUnreachable(worker.name, refused=False) from None
        except BaseException as exc:
            self._pool.release(worker)
            ticket.finish(0, 0)
            if isinstance(exc, TimeoutError):
                raise UpstreamFailed(f"worker {worker.name} did not answer in time") from None
            raise
        self._pool.note_answered(worker)
        headers = {"x-hearthgate-worker": worker.name}
        if resp.status != 200 or not parsed.stream:
            result = Result(resp.status)
            try:
                content = await resp.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise UpstreamFailed(
                    f"worker {worker.name} failed while answering: {type(exc).__name__}"
                ) from None
            finally:
                resp.release()
                self._pool.release(worker)
                if resp.status in _RETRY_STATUS:
                    ticket.finish(0, 0)
                elif resp.status == 200:
                    self._read_usage(content, result)
                    result.completed = True
                    result.e2e_s = self._clock() - received_at
                if resp.status not in _RETRY_STATUS:
                    ticket.finish(result.prompt_tokens or 0, result.completion_tokens or 0)
                    done(result)
            swap = model_swap(parsed, worker)
            if swap is not None:
                content = swap_model(content, swap)
            answer = Response(
                content=content,
                status_code=resp.status,
                headers=headers,
                media_type=resp.headers.get("Content-Type", "application/json"),
            )
            if resp.status in _RETRY_STATUS:
                log.info("worker %s answered %d; retrying elsewhere", worker.name, resp.status)
                raise WorkerUnreachable(worker.name, refused=False, answer=answer)
            return answer
        return RelayResponse(
            self._relay(parsed, worker, ticket, resp, received_at, done),
            media_type="text/event-stream",
            headers={**headers, "Cache-Control": "no-cache"},
        )

    @staticmethod
    def _read_usage(content: bytes, result: Result) -> None:
        try:
            usage = json.loads(content).get("usage") or {}
        except (ValueError, AttributeError):
            return
        result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        result.completion_tokens = int(usage.get("completion_tokens") or 0)

    async def _relay(
        self,
        parsed: ParsedRequest,
        worker: WorkerState,
        ticket: TicketHooks,
        resp: aiohttp.ClientResponse,
        received_at: float,
        done: Callable[[Result], None],
    ) -> AsyncIterator[bytes]:
        splitter = SseSplitter()
        obs = StreamObserver(strip_usage=not parsed.wants_usage)
        clock = self._clock
        result = Result(200)
        swap = model_swap(parsed, worker)
        try:
            try:
                async for chunk in resp.content.iter_any():
                    now = clock()
                    seen = obs.token_events
                    out = [e for e in splitter.feed(chunk) if obs.observe(e, now)]
                    if obs.token_events != seen:
                        if not seen:
                            ticket.first_token()
                        ticket.progress(obs.token_events)
                    if out:
                        if swap is not None:
                            out = [swap_model(e, swap) for e in out]
                        yield out[0] if len(out) == 1 else b"".join(out)
                rest = splitter.rest()
                if rest.strip():
                    yield rest
                result.completed = obs.error is None
            except (aiohttp.ClientError, TimeoutError) as exc:
                err: GatewayError = UpstreamFailed(
                    f"worker {worker.name} failed mid-stream: {type(exc).__name__}"
                )
                log.warning("stream from %s broke: %r", worker.name, exc)
                yield sse_error_event(err)
                yield b"data: [DONE]\n\n"
        finally:
            # Bookkeeping first and synchronous, so it happens exactly once on every path.
            resp.close()
            self._pool.release(worker)
            usage = obs.usage or {}
            result.prompt_tokens = usage.get("prompt_tokens")
            result.completion_tokens = usage.get("completion_tokens")
            if result.completion_tokens is None and obs.token_events:
                result.completion_tokens = obs.token_events  # cut short: what was streamed
            ticket.finish(result.prompt_tokens, result.completion_tokens)
            if obs.first_token_at is not None:
                result.ttft_s = obs.first_token_at - received_at
            result.gaps = obs.gaps
            if result.completed:
                result.e2e_s = clock() - received_at
            done(result)
