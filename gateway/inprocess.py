"""Requests the gateway makes to itself (batch lines): one ASGI exchange in memory.

The request goes through the same ``serve`` as a client's (classes, fair shares,
admission, coalescing, failover), for the app and class in :class:`OnBehalf` instead of an
API key; setting the ``stop`` event acts as the client leaving.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.types import Message, Receive, Scope, Send


@dataclass(frozen=True)
class OnBehalf:
    """Who a request the gateway makes itself is for: the owning app and the class."""

    app: str
    cls: str


@dataclass(frozen=True)
class Answer:
    """What an in-process request got: status, headers (lower-case names) and body."""

    status: int
    headers: dict[str, str]
    body: bytes


Serve = Callable[[Scope, Receive, Send, OnBehalf], Awaitable[None]]


def _scope(route: str, body: bytes) -> Scope:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": route,
        "raw_path": route.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": None,
        "server": None,
    }


async def call(
    serve: Serve, route: str, body: bytes, on_behalf: OnBehalf, stop: asyncio.Event
) -> Answer:
    """POST ``body`` to ``route`` through ``serve`` and collect the whole answer."""
    sent_body = False

    async def receive() -> Message:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        await stop.wait()
        return {"type": "http.disconnect"}

    status = 0
    headers: dict[str, str] = {}
    chunks: list[bytes] = []

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            headers.update(
                (k.decode("latin-1").lower(), v.decode("latin-1"))
                for k, v in message.get("headers", [])
            )
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await serve(_scope(route, body), receive, send, on_behalf)
    return Answer(status, headers, b"".join(chunks))
