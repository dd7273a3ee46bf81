"""The in-process request the gateway makes for batch lines: one ASGI exchange in memory."""

from __future__ import annotations

import asyncio

from starlette.types import Receive, Scope, Send

from hearthgate.gateway.inprocess import OnBehalf, call


async def test_collects_the_answer_and_passes_who_it_is_for() -> None:
    seen: dict[str, object] = {}

    async def serve(scope: Scope, receive: Receive, send: Send, who: OnBehalf) -> None:
        seen["path"], seen["who"] = scope["path"], who
        seen["body"] = (await receive())["body"]
        await send({"type": "http.response.start", "status": 200, "headers": [(b"X-A", b"1")]})
        await send({"type": "http.response.body", "body": b"ab", "more_body": True})
        await send({"type": "http.response.body", "body": b"c"})

    answer = await call(
        serve, "/v1/completions", b"{}", OnBehalf("notes", "batch"), asyncio.Event()
    )
    assert (answer.status, answer.headers, answer.body) == (200, {"x-a": "1"}, b"abc")
    assert seen == {"path": "/v1/completions", "who": OnBehalf("notes", "batch"), "body": b"{}"}


async def test_setting_stop_is_the_client_leaving() -> None:
    stop = asyncio.Event()
    left = asyncio.Event()

    async def serve(scope: Scope, receive: Receive, send: Send, who: OnBehalf) -> None:
        await receive()  # the body
        assert (await receive())["type"] == "http.disconnect"  # waits for stop
        left.set()

    task = asyncio.create_task(call(serve, "/v1/completions", b"{}", OnBehalf("a", "b"), stop))
    await asyncio.sleep(0.01)
    assert not left.is_set()
    stop.set()
    answer = await asyncio.wait_for(task, 1)
    assert left.is_set() and answer.status == 0 and answer.body == b""
