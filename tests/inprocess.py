"""The request path in-process: a gateway with an injected upstream client that fails in
whatever way a test needs, and a hand-driven ASGI exchange whose client can disconnect at
any moment. Tests synchronise on observable state (``until``), never on fixed sleeps."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from hearthgate.gateway.core import Gateway
from hearthgate.gateway.errors import UpstreamFailed
from hearthgate.gateway.multipart import parse_form
from hearthgate.gateway.settings import Settings
from hearthgate.gateway.upstream import UpstreamResponse, WorkerUnreachable


async def until(cond: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    """Wait until ``cond()`` holds (checked at every turn of the event loop)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout} s")
        await asyncio.sleep(0.001)


def until_sync(
    cond: Callable[[], bool], timeout: float = 5.0, what: str = "condition", every: float = 0.05
) -> None:
    """``until`` for threads and processes: wait until ``cond()`` holds, checking it every
    ``every`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout} s")
        time.sleep(every)


class FakeResponse:
    """An upstream answer: ``chunks`` are sent one by one, each after its gate (if any)
    opens; ``fail`` then breaks the body off; ``hang`` keeps it open until aborted."""

    def __init__(
        self,
        status: int = 200,
        chunks: list[bytes] | None = None,
        fail: BaseException | None = None,
        hang: bool = False,
        content_type: str = "application/json",
    ) -> None:
        self.status = status
        self.content_type = content_type
        self._chunks = list(chunks or [])
        self._fail = fail
        self._hang = hang
        self.closed = False
        self.aborted: BaseException | None = None
        self.finished = False  # the body was read to its end
        self.sent = 0
        self._abort = asyncio.Event()

    async def _wait_abort(self) -> None:
        await self._abort.wait()
        assert self.aborted is not None
        raise self.aborted

    async def chunks(self) -> AsyncIterator[bytes]:
        for c in self._chunks:
            if self.aborted is not None:
                raise self.aborted
            self.sent += 1
            yield c
            await asyncio.sleep(0)
        if self._fail is not None:
            raise self._fail
        if self._hang:
            await self._wait_abort()
        self.finished = True

    async def read(self) -> bytes:
        if self._hang:
            await self._wait_abort()
        if self._fail is not None:
            raise self._fail
        self.finished = True
        return b"".join(self._chunks)

    def abort(self, exc: BaseException) -> None:
        self.aborted = exc
        self._abort.set()
        self.close()

    def close(self) -> None:
        self.closed = True


Handler = Callable[[str, str, dict[str, Any]], Awaitable[UpstreamResponse]]


@dataclass
class FakeUpstream:
    """An UpstreamClient: ``handler(worker, path, body)`` answers each POST; ``/health``
    answers 200 unless the worker is in ``down`` (refused); ``/metrics`` answers
    ``metrics_page``."""

    handler: Handler
    down: set[str] = field(default_factory=set)
    metrics_page: dict[str, bytes] = field(default_factory=dict)
    posts: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    responses: list[UpstreamResponse] = field(default_factory=list)

    async def post(
        self,
        worker: str,
        url: str,
        body: bytes,
        read_timeout_s: float | None,
        content_type: str = "application/json",
    ) -> UpstreamResponse:
        if worker in self.down:
            raise WorkerUnreachable(worker, refused=True)
        path = "/" + url.split("/", 3)[3]
        # A multipart upload is handed over parsed, as {"form": Form}.
        parsed = (
            json.loads(body)
            if content_type == "application/json"
            else {"form": parse_form(body, content_type)}
        )
        self.posts.append((worker, path, parsed))
        resp = await self.handler(worker, path, parsed)
        self.responses.append(resp)
        return resp

    async def get(self, worker: str, url: str, timeout_s: float) -> tuple[int, bytes]:
        if worker in self.down:
            raise WorkerUnreachable(worker, refused=True)
        if url.endswith("/metrics"):
            return 200, self.metrics_page.get(worker, b"")
        return 200, b""

    async def close(self) -> None:
        pass


def sse(*payloads: dict[str, Any] | str) -> list[bytes]:
    return [
        b"data: " + (p.encode() if isinstance(p, str) else json.dumps(p).encode()) + b"\n\n"
        for p in payloads
    ]


def token_chunks(n: int, usage: bool = True) -> list[bytes]:
    """A vLLM-like completions stream of ``n`` tokens, its usage chunk and [DONE]."""
    events: list[dict[str, Any] | str] = [
        {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": f"t{i} "}]}
        for i in range(n)
    ]
    if usage:
        events.append(
            {"id": "x", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}}
        )
    events.append("[DONE]")
    return sse(*events)


class Exchange:
    """One client request driven by hand through ``gateway.serve``."""

    def __init__(
        self, gw: Gateway, path: str, body: dict[str, Any] | bytes, headers: dict[str, str]
    ) -> None:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        hdrs = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        if not any(k == b"content-type" for k, _ in hdrs):
            hdrs.append((b"content-type", b"application/json"))
        self.scope: dict[str, Any] = {
            "type": "http",
            "method": "POST",
            "path": path,
            "headers": hdrs,
            "query_string": b"",
            "http_version": "1.1",
            "scheme": "http",
            "server": ("127.0.0.1", 8080),
            "client": ("127.0.0.1", 5000),
            "root_path": "",
        }
        self._raw = raw
        self._body_sent = False
        self._gone = asyncio.Event()
        self.messages: list[dict[str, Any]] = []
        self.task = asyncio.ensure_future(gw.serve(self.scope, self._receive, self._send))

    async def _receive(self) -> dict[str, Any]:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": self._raw, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict[str, Any]) -> None:
        if self._gone.is_set():
            raise OSError("client disconnected")
        self.messages.append(message)

    def disconnect(self) -> None:
        self._gone.set()

    @property
    def status(self) -> int | None:
        for m in self.messages:
            if m["type"] == "http.response.start":
                return int(m["status"])
        return None

    @property
    def headers(self) -> dict[str, str]:
        for m in self.messages:
            if m["type"] == "http.response.start":
                return {k.decode(): v.decode() for k, v in m["headers"]}
        return {}

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages if m["type"].endswith("body"))

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[str]:
        text = self.body.decode()
        return [ln[6:] for ln in text.split("\n") if ln.startswith("data: ")]

    async def done(self, timeout: float = 5.0) -> Exchange:
        await asyncio.wait_for(asyncio.shield(self.task), timeout)
        return self


def settings(**extra: Any) -> Settings:
    base: dict[str, Any] = {
        "workers": [{"name": "w0", "url": "http://w0", "models": ["m"]}],
        "health": {"interval_s": 60},
        "scheduler": {"tick_ms": 5},
    }
    base.update(extra)
    return Settings(**base)


def broken(msg: str = "broke") -> UpstreamFailed:
    return UpstreamFailed(msg)
