"""Forwarding one admitted request to its worker and relaying the answer back.

Streaming answers are relayed event by event as they arrive. The upstream request always
asks for the usage chunk so the gateway can count tokens; the client sees it only if it
asked. The proxy reports progress to the request's :class:`gateway.lease.Lease` and releases
nothing itself: leaving the lease closes the upstream answer (so vLLM aborts a request whose
client went away) and gives the admission back.

A streamed answer is returned to the client only once its first event arrived: until then
nothing was sent, so a worker that hangs (the class's first-byte limit), goes down (the
lease is cut) or fails can still be left for another worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from hearthgate.gateway.endpoints.spec import count
from hearthgate.gateway.errors import GatewayError, UpstreamFailed
from hearthgate.gateway.lease import Lease, WorkerLost
from hearthgate.gateway.multipart import Form, encode_form
from hearthgate.gateway.parse import ParsedRequest
from hearthgate.gateway.settings import Settings
from hearthgate.gateway.sse import SseSplitter, StreamObserver
from hearthgate.gateway.stored import AnswerHomes
from hearthgate.gateway.upstream import UpstreamClient, UpstreamResponse, WorkerUnreachable
from hearthgate.gateway.workers import WorkerPool, WorkerState

log = logging.getLogger("hearthgate.proxy")

# A worker that answers with one of these before the client got any byte failed as a
# whole (vLLM: its engine died, e.g. while shutting down): the request is retried on
# another worker, and the answer passed on only when none is left.
RETRY_STATUS = frozenset({500, 502, 503, 504})


def model_swap(model: str, worker: WorkerState) -> tuple[bytes, bytes] | None:
    """(upstream, logical) JSON-encoded model names when ``worker`` serves the logical
    ``model`` under another name; None when the names agree."""
    upstream = worker.spec.upstream_models.get(model)
    if upstream is None or upstream == model:
        return None
    return json.dumps(upstream).encode(), json.dumps(model).encode()


def swap_model(data: bytes, swap: tuple[bytes, bytes]) -> bytes:
    """``data`` with the upstream's ``"model"`` value replaced by the logical name."""
    upstream, logical = swap
    for sep in (b'"model":', b'"model": '):
        data = data.replace(sep + upstream, sep + logical)
    return data


def upstream_form(parsed: ParsedRequest, worker: WorkerState) -> tuple[bytes, str]:
    """A multipart upload as sent to ``worker`` (its model name, the usage chunk asked for
    when streamed) and its content type."""
    assert parsed.form is not None
    fields = {**parsed.form.fields, "model": worker.spec.upstream_model(parsed.model)}
    if parsed.stream and parsed.spec.ask_usage:
        fields["stream_include_usage"] = "true"
    return encode_form(Form(fields, parsed.form.files))


def upstream_body(parsed: ParsedRequest, worker: WorkerState, priority: int | None) -> bytes:
    """The JSON body sent to ``worker``: its model name, the usage chunk asked for, vLLM's
    priority where the worker schedules by it."""
    body: dict[str, Any] = dict(parsed.body)
    body["model"] = worker.spec.upstream_model(parsed.model)
    if parsed.stream and parsed.spec.ask_usage and not parsed.wants_usage:
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    if worker.spec.priority_scheduling and priority is not None:
        body["priority"] = priority  # vLLM: lower runs first
    else:
        # The gateway orders the work; vLLM's priority only applies where it is enabled.
        body.pop("priority", None)
    return json.dumps(body).encode()


def read_answer(
    content: bytes, keys: tuple[str, str | None] = ("prompt_tokens", "completion_tokens")
) -> tuple[int | None, int | None, str | None]:
    """(prompt, output) tokens of a JSON answer's ``usage`` under the endpoint's ``keys``
    (None where absent or odd), and the answer's ``id``."""
    try:
        answer = json.loads(content)
    except (ValueError, RecursionError):
        return None, None, None
    if not isinstance(answer, dict):
        return None, None, None
    ident = answer.get("id") if isinstance(answer.get("id"), str) else None
    usage = answer.get("usage")
    if not isinstance(usage, dict):
        return None, None, ident
    prompt, output = keys
    return count(usage.get(prompt)), None if output is None else count(usage.get(output)), ident


class RelayResponse(StreamingResponse):
    """A streaming response that ends as soon as the client goes away, even while upstream
    is silent (during a long prefill there is nothing to write that would notice). The
    lease's watcher is the one reader of the ASGI ``receive`` channel; ``gone`` waits on
    it."""

    def __init__(
        self, content: AsyncIterator[bytes], gone: Callable[[], Awaitable[None]], **kw: Any
    ) -> None:
        super().__init__(content, **kw)
        self._gone = gone

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:

                async def relay() -> None:
                    with contextlib.suppress(OSError):  # the client went away mid-write
                        await self.stream_response(send)
                    tg.cancel_scope.cancel()

                tg.start_soon(relay)
                await self._gone()
                tg.cancel_scope.cancel()
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


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


class AnswerBroke(Exception):
    """The worker's answer broke off before anything was sent to the client: the request
    may go to another worker."""

    def __init__(self, worker: str, error: UpstreamFailed) -> None:
        super().__init__(error.message)
        self.worker = worker
        self.error = error


def openai_error_body(status: int, content: bytes, path: str, model: str) -> bytes:
    """A worker's error answer in OpenAI's shape: passed on as it is when it already is
    (vLLM's own errors), else wrapped (a framework's ``{"detail": ...}``, plain text)."""
    try:
        answer = json.loads(content)
    except (ValueError, RecursionError):
        answer = None
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        return content
    detail = answer.get("detail") if isinstance(answer, dict) else None
    if status == 404 and detail == "Not Found":
        message = f"the model '{model}' does not serve {path}"
        code = "unsupported_endpoint"
    else:
        text = detail if isinstance(detail, str) else content.decode("utf-8", "replace")
        message = f"the worker answered {status}: {text[:500]}"
        code = "upstream_error"
    kind = "invalid_request_error" if 400 <= status < 500 else "upstream_error"
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return json.dumps(body).encode()


class Proxy:
    """Sends parsed requests to workers; owns nothing but references to shared parts."""

    def __init__(
        self,
        client: UpstreamClient,
        pool: WorkerPool,
        settings: Settings,
        clock: Callable[[], float] = time.perf_counter,
        homes: AnswerHomes | None = None,
    ) -> None:
        self._client = client
        self._pool = pool
        self._settings = settings
        self._clock = clock
        self.homes = homes if homes is not None else AnswerHomes()

    async def forward(
        self,
        lease: Lease,
        parsed: ParsedRequest,
        received_at: float,
        done: Callable[[Result], None],
        priority: int | None = None,
        first_byte_s: float | None = None,
    ) -> Response:
        """Send ``parsed`` to the lease's worker. ``done`` hears the result once. Raises
        (nothing sent to the client yet): WorkerUnreachable, WorkerLost and
        FirstByteTimeout (the caller may fail over), ClientGone, UpstreamFailed."""
        worker = lease.worker
        assert worker is not None, "forward needs an admitted lease"
        if parsed.stream:
            lease.expect_stream()
        else:
            lease.expect_no_stream()
        deadline = None if first_byte_s is None else self._clock() + first_byte_s
        if parsed.form is not None:
            body, ctype = await asyncio.to_thread(upstream_form, parsed, worker)
        else:
            body, ctype = upstream_body(parsed, worker, priority), "application/json"
        try:
            resp = await lease.guard(
                self._client.post(
                    worker.name,
                    worker.spec.url + parsed.upstream_path,
                    body,
                    self._settings.upstream.read_timeout_s,
                    ctype,
                ),
                first_byte_s,
            )
        except WorkerUnreachable as exc:
            if exc.refused:
                self._pool.mark_down(worker, "refused the connection")
            else:
                log.info("worker %s dropped the connection before answering", worker.name)
                self._pool.note_dropped(worker)
            raise
        self._pool.note_answered(worker)
        lease.upstream = resp
        headers = {"x-hearthgate-worker": worker.name, **lease.queue_headers()}
        try:
            if resp.status != 200 or not parsed.stream:
                content = await lease.guard(resp.read(), self._left(deadline))
                return self._answer(
                    lease, parsed, worker, resp, content, headers, received_at, done
                )
            chunks = resp.chunks()
            first = await lease.guard(anext(chunks, b""), self._left(deadline))
        except UpstreamFailed as exc:  # broke off before the client got anything
            raise AnswerBroke(worker.name, exc) from None
        if parsed.spec.audio_out:
            return RelayResponse(
                self._relay_audio(lease, worker, resp, first, chunks, received_at, done),
                lease.wait_gone,
                media_type=resp.content_type,
                headers=headers,
            )
        return RelayResponse(
            self._relay(lease, parsed, worker, resp, first, chunks, received_at, done),
            lease.wait_gone,
            media_type="text/event-stream",
            headers={**headers, "Cache-Control": "no-cache"},
        )

    def _left(self, deadline: float | None) -> float | None:
        return None if deadline is None else max(0.0, deadline - self._clock())

    def _answer(
        self,
        lease: Lease,
        parsed: ParsedRequest,
        worker: WorkerState,
        resp: UpstreamResponse,
        content: bytes,
        headers: dict[str, str],
        received_at: float,
        done: Callable[[Result], None],
    ) -> Response:
        if resp.status in RETRY_STATUS:
            log.info("worker %s answered %d; retrying elsewhere", worker.name, resp.status)
            lease.usage(0, 0)
            raise WorkerUnreachable(
                worker.name, refused=False, answer=(resp.status, content, resp.content_type)
            )
        result = Result(resp.status)
        if resp.status == 200:
            prompt, output, ident = read_answer(content, parsed.spec.usage_keys)
            result.prompt_tokens, result.completion_tokens = prompt, output
            if ident is not None and parsed.spec.stores_answers:
                self.homes.remember(ident, worker.name)
            result.completed = True
            result.e2e_s = self._clock() - received_at
            lease.usage(result.prompt_tokens, result.completion_tokens)
        else:
            lease.usage(0, 0)  # refused by the worker: nothing was computed
            path = parsed.path or parsed.spec.path
            content = openai_error_body(resp.status, content, path, parsed.model)
        done(result)
        swap = model_swap(parsed.model, worker)
        if swap is not None:
            content = swap_model(content, swap)
        return Response(
            content=content,
            status_code=resp.status,
            headers=headers,
            media_type=resp.content_type,
        )

    async def _relay_audio(
        self,
        lease: Lease,
        worker: WorkerState,
        resp: UpstreamResponse,
        first: bytes,
        chunks: AsyncIterator[bytes],
        received_at: float,
        done: Callable[[Result], None],
    ) -> AsyncIterator[bytes]:
        """Relay audio bytes as they arrive. The first byte is the first "token" (time to
        first audio); pieces of audio are no tokens, so no gaps are kept."""
        result = Result(200)
        if first:
            lease.first_token()
            result.ttft_s = self._clock() - received_at
        try:
            try:
                if first:
                    yield first
                async for chunk in chunks:
                    if result.ttft_s is None and chunk:
                        lease.first_token()
                        result.ttft_s = self._clock() - received_at
                    yield chunk
                result.completed = True
            except (UpstreamFailed, WorkerLost) as exc:
                err: GatewayError = exc if isinstance(exc, UpstreamFailed) else exc.error
                # Audio has no error event: the client sees the body end short.
                log.warning("audio from %s broke: %s", worker.name, err.message)
        finally:
            lease.usage(None, None)
            resp.close()
            if result.completed:
                result.e2e_s = self._clock() - received_at
            done(result)

    async def _relay(
        self,
        lease: Lease,
        parsed: ParsedRequest,
        worker: WorkerState,
        resp: UpstreamResponse,
        first: bytes,
        chunks: AsyncIterator[bytes],
        received_at: float,
        done: Callable[[Result], None],
    ) -> AsyncIterator[bytes]:
        splitter = SseSplitter()
        spec = parsed.spec
        assert spec.reader is not None, "only streaming endpoints stream"
        obs = StreamObserver(spec.reader(), strip_usage=spec.ask_usage and not parsed.wants_usage)
        clock = self._clock
        result = Result(200)
        swap = model_swap(parsed.model, worker)

        def relayed(chunk: bytes) -> bytes:
            now = clock()
            seen = obs.token_events
            out = [e for e in splitter.feed(chunk) if obs.observe(e, now)]
            if obs.token_events != seen:
                if not seen:
                    lease.first_token()
                lease.progress(obs.token_events)
            if swap is not None:
                out = [swap_model(e, swap) for e in out]
            return out[0] if len(out) == 1 else b"".join(out)

        try:
            try:
                data = relayed(first)
                if data:
                    yield data
                async for chunk in chunks:
                    data = relayed(chunk)
                    if data:
                        yield data
                rest = splitter.rest()
                if rest.strip():
                    yield rest
                result.completed = obs.error is None
            except (UpstreamFailed, WorkerLost) as exc:
                err: GatewayError = exc if isinstance(exc, UpstreamFailed) else exc.error
                log.warning("stream from %s broke: %s", worker.name, err.message)
                yield spec.stream_error(err)
        finally:
            # Bookkeeping first and synchronous; the lease gives everything back.
            result.prompt_tokens = obs.prompt_tokens
            result.completion_tokens = obs.completion_tokens
            if obs.ident is not None and spec.stores_answers:
                self.homes.remember(obs.ident, worker.name)
            if result.completion_tokens is None and obs.token_events:
                result.completion_tokens = obs.token_events  # cut short: what was streamed
            lease.usage(result.prompt_tokens, result.completion_tokens)
            resp.close()
            if obs.first_token_at is not None:
                result.ttft_s = obs.first_token_at - received_at
            result.gaps = obs.gaps
            if result.completed:
                result.e2e_s = clock() - received_at
            done(result)
