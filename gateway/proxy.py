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
from typing import Any

import aiohttp
import anyio
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.errors import (
    GatewayError,
    NoWorkerAvailable,
    UpstreamFailed,
    sse_error_event,
)
from gateway.metrics import GatewayMetrics
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
# Failures that happen before the worker accepted the request: safe to retry elsewhere.
_CONNECT_ERRORS = (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, ConnectionError)


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


class Proxy:
    """Sends parsed requests to workers; owns nothing but references to shared parts."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        pool: WorkerPool,
        metrics: GatewayMetrics,
        settings: Settings,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._session = session
        self._pool = pool
        self._metrics = metrics
        self._settings = settings
        self._clock = clock
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            connect=settings.upstream.connect_timeout_s,
            sock_read=settings.upstream.read_timeout_s,
        )

    def _upstream_body(self, parsed: ParsedRequest, worker: WorkerState) -> bytes:
        body: dict[str, Any] = dict(parsed.body)
        if parsed.stream and not parsed.wants_usage:
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        if not worker.spec.priority_scheduling:
            # vLLM refuses a priority unless it runs --scheduling-policy priority.
            body.pop("priority", None)
        return json.dumps(body).encode()

    async def forward(self, route: str, parsed: ParsedRequest, received_at: float) -> Response:
        """Send ``parsed`` to a worker; retry once elsewhere if the connection fails."""
        tried: set[str] = set()
        last_error = "no worker is up for this model"
        for _ in range(2):
            worker = self._pool.pick(parsed.model, exclude=tried)
            if worker is None:
                break
            tried.add(worker.name)
            self._pool.acquire(worker)
            try:
                resp = await self._session.post(
                    worker.spec.url + _PATHS[parsed.endpoint],
                    data=self._upstream_body(parsed, worker),
                    headers=_JSON,
                    timeout=self._timeout,
                )
            except _CONNECT_ERRORS as exc:
                self._pool.release(worker)
                self._pool.mark_down(worker, f"{type(exc).__name__}: {exc}")
                last_error = f"worker {worker.name} is unreachable"
                continue
            except TimeoutError:
                self._pool.release(worker)
                raise UpstreamFailed(f"worker {worker.name} did not answer in time") from None
            except BaseException:
                self._pool.release(worker)
                raise
            return await self._respond(route, parsed, worker, resp, received_at)
        raise NoWorkerAvailable(
            f"{last_error}; try again shortly",
            retry_after_s=self._settings.health.retry_after_s,
        )

    async def _respond(
        self,
        route: str,
        parsed: ParsedRequest,
        worker: WorkerState,
        resp: aiohttp.ClientResponse,
        received_at: float,
    ) -> Response:
        headers = {"x-hearthgate-worker": worker.name}
        if resp.status != 200 or not parsed.stream:
            try:
                content = await resp.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise UpstreamFailed(
                    f"worker {worker.name} failed while answering: {type(exc).__name__}"
                ) from None
            finally:
                resp.release()
                self._pool.release(worker)
            if resp.status == 200:
                self._account_plain(route, parsed, content, received_at)
            self._metrics.count(route, parsed.model, resp.status)
            return Response(
                content=content,
                status_code=resp.status,
                headers=headers,
                media_type=resp.headers.get("Content-Type", "application/json"),
            )
        self._metrics.count(route, parsed.model, 200)
        return RelayResponse(
            self._relay(route, parsed, worker, resp, received_at),
            media_type="text/event-stream",
            headers={**headers, "Cache-Control": "no-cache"},
        )

    def _account_plain(
        self, route: str, parsed: ParsedRequest, content: bytes, received_at: float
    ) -> None:
        elapsed = self._clock() - received_at
        self._metrics.observe_e2e(route, parsed.model, elapsed)
        try:
            usage = json.loads(content).get("usage") or {}
        except (ValueError, AttributeError):
            return
        self._metrics.tokens(
            parsed.model,
            int(usage.get("prompt_tokens") or 0),
            int(usage.get("completion_tokens") or 0),
        )

    async def _relay(
        self,
        route: str,
        parsed: ParsedRequest,
        worker: WorkerState,
        resp: aiohttp.ClientResponse,
        received_at: float,
    ) -> AsyncIterator[bytes]:
        splitter = SseSplitter()
        obs = StreamObserver(strip_usage=not parsed.wants_usage)
        clock = self._clock
        finished = False
        try:
            try:
                async for chunk in resp.content.iter_any():
                    now = clock()
                    out = [e for e in splitter.feed(chunk) if obs.observe(e, now)]
                    if out:
                        yield out[0] if len(out) == 1 else b"".join(out)
                rest = splitter.rest()
                if rest.strip():
                    yield rest
                finished = True
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
            self._account_stream(route, parsed, obs, received_at, finished)

    def _account_stream(
        self,
        route: str,
        parsed: ParsedRequest,
        obs: StreamObserver,
        received_at: float,
        finished: bool,
    ) -> None:
        m = self._metrics
        if obs.first_token_at is not None:
            m.observe_ttft(route, parsed.model, obs.first_token_at - received_at)
            m.observe_gaps(route, parsed.model, obs.gaps)
        if finished:
            m.observe_e2e(route, parsed.model, self._clock() - received_at)
        if obs.usage is not None:
            m.tokens(
                parsed.model,
                int(obs.usage.get("prompt_tokens") or 0),
                int(obs.usage.get("completion_tokens") or 0),
            )
