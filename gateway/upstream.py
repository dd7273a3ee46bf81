"""The gateway's HTTP client towards the workers, behind one small interface.

Everything the request path and the worker pool send to a worker goes through an
:class:`UpstreamClient`. The real one wraps an aiohttp session; tests hand in one that fails
in any way they need (refused, dropped mid-body, hung, garbage). Transport failures are
mapped to the gateway's own errors here, in one place, for the proxy, the coalescer and the
health checks alike:

- :class:`WorkerUnreachable` (``refused``: nothing listens; else the connection dropped
  before an answer): the worker saw nothing to compute, the request may go elsewhere;
- :class:`gateway.errors.UpstreamFailed`: the worker accepted the request and then broke
  off or timed out.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

import aiohttp

from hearthgate.gateway.errors import UpstreamFailed


class WorkerUnreachable(Exception):
    """The worker refused or dropped the connection before answering; safe to retry.
    ``refused``: nothing listens (the worker is marked down); else the connection dropped.
    ``answer``: the worker's own error answer (status, body, content type), for when no
    retry is left."""

    def __init__(
        self, worker: str, refused: bool, answer: tuple[int, bytes, str] | None = None
    ) -> None:
        super().__init__(worker)
        self.worker = worker
        self.refused = refused
        self.answer = answer


class UpstreamResponse(Protocol):
    """A worker's answer whose headers have arrived."""

    status: int
    content_type: str

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; raises UpstreamFailed if it breaks off."""
        ...

    async def read(self) -> bytes:
        """The whole body; raises UpstreamFailed if it breaks off."""
        ...

    def abort(self, exc: BaseException) -> None:
        """Make a pending or later read raise ``exc``, and drop the connection (so vLLM
        aborts the request). Synchronous: safe from any callback."""
        ...

    def close(self) -> None:
        """Drop the connection if the body was not read to the end (vLLM aborts the
        request); give it back to the pool otherwise. Idempotent."""
        ...


class UpstreamClient(Protocol):
    """Sends requests to workers."""

    async def post(
        self,
        worker: str,
        url: str,
        body: bytes,
        read_timeout_s: float | None,
        content_type: str = "application/json",
    ) -> UpstreamResponse:
        """POST ``body`` (JSON unless ``content_type`` says otherwise); return once the
        answer's headers arrived. Raises WorkerUnreachable or UpstreamFailed."""
        ...

    async def get(self, worker: str, url: str, timeout_s: float) -> tuple[int, bytes]:
        """GET ``url``: (status, body). Raises WorkerUnreachable or UpstreamFailed."""
        ...

    async def close(self) -> None: ...


# ------------------------------------------------------------------ aiohttp

# Nothing listens there: the worker is down.
_REFUSED = (aiohttp.ClientConnectorError, ConnectionRefusedError)
# A pooled connection the worker had already closed (keep-alive race), or a worker that did
# not accept the connection in time: it has not seen the request either.
_DROPPED = (
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientOSError,
    ConnectionResetError,
    aiohttp.ConnectionTimeoutError,
)
_BROKEN = (aiohttp.ClientError, TimeoutError, OSError, ValueError)


def map_before_answer(worker: str, exc: BaseException) -> Exception:
    """The gateway's error for a failure before the worker's headers arrived."""
    if isinstance(exc, _REFUSED):
        return WorkerUnreachable(worker, refused=True)
    if isinstance(exc, _DROPPED):
        return WorkerUnreachable(worker, refused=False)
    if isinstance(exc, TimeoutError):
        return UpstreamFailed(f"worker {worker} did not answer in time")
    return UpstreamFailed(f"worker {worker} failed: {type(exc).__name__}")


def map_mid_body(worker: str, exc: BaseException) -> UpstreamFailed:
    """The gateway's error for a body that broke off after the headers."""
    if isinstance(exc, UpstreamFailed):
        return exc
    return UpstreamFailed(f"worker {worker} failed while answering: {type(exc).__name__}")


class _UnpooledAfterServerError(aiohttp.ClientResponse):
    """A connection that brought a server error (5xx) is never pooled again. uvicorn
    (vLLM's server) closes it right after a 500 that an exception raised out of the app,
    with no `Connection: close` header: pooled, it would be handed to the next request and
    drop it, and two drops in a row mark a healthy worker down (WorkerPool.note_dropped)."""

    async def start(self, connection: aiohttp.connector.Connection) -> aiohttp.ClientResponse:
        protocol = connection.protocol
        resp = await super().start(connection)
        if resp.status >= 500 and protocol is not None:
            if connection.protocol is None:  # a short body already read: back in the pool
                protocol.close()
            else:
                protocol.force_close()  # closed when released
        return resp


class _AiohttpResponse:
    def __init__(self, worker: str, resp: aiohttp.ClientResponse) -> None:
        self._worker = worker
        self._resp = resp
        self.status = resp.status
        self.content_type = resp.headers.get("Content-Type", "application/json")
        self._done = False

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.content.iter_any():
                yield chunk
            self._done = True
        except _BROKEN as exc:
            raise map_mid_body(self._worker, exc) from None

    async def read(self) -> bytes:
        try:
            data = await self._resp.read()
        except _BROKEN as exc:
            raise map_mid_body(self._worker, exc) from None
        self._done = True
        return data

    def abort(self, exc: BaseException) -> None:
        self._resp.content.set_exception(exc)
        self._resp.close()

    def close(self) -> None:
        if self._done:
            self._resp.release()
        else:
            self._resp.close()


class AiohttpUpstream:
    """The real client: one aiohttp session with the gateway's pool and timeouts."""

    def __init__(self, max_connections: int, keepalive_s: float, connect_timeout_s: float):
        self._connector_args = (max_connections, keepalive_s)
        self._connect_timeout_s = connect_timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            limit, keepalive = self._connector_args
            connector = aiohttp.TCPConnector(limit=limit, keepalive_timeout=keepalive)
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                response_class=_UnpooledAfterServerError,
            )
        return self._session

    async def post(
        self,
        worker: str,
        url: str,
        body: bytes,
        read_timeout_s: float | None,
        content_type: str = "application/json",
    ) -> UpstreamResponse:
        # sock_connect, not connect: waiting for a pooled connection is not a failure.
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self._connect_timeout_s, sock_read=read_timeout_s
        )
        try:
            resp = await self._get_session().post(
                url, data=body, headers={"Content-Type": content_type}, timeout=timeout
            )
        except _BROKEN as exc:
            raise map_before_answer(worker, exc) from None
        return _AiohttpResponse(worker, resp)

    async def get(self, worker: str, url: str, timeout_s: float) -> tuple[int, bytes]:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self._get_session().get(url, timeout=timeout) as resp:
                return resp.status, await resp.read()
        except _BROKEN as exc:
            raise map_before_answer(worker, exc) from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
