"""An app's place in line while it waits: ``GET /v1/hearthgate/queue`` (the app's own
waiting requests, each with its X-Request-Id, roughly how many go before it and a wait
estimate), in-process with a FakeUpstream that holds chosen calls."""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

import httpx

from hearthgate.gateway.app import create_app
from hearthgate.gateway.upstream import UpstreamResponse
from tests.inprocess import FakeResponse, FakeUpstream, settings, until

KEYS = {"notes": "notes-key", "voice": "voice-key"}


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def answer() -> FakeResponse:
    body = {
        "id": "x",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    return FakeResponse(200, [json.dumps(body).encode()])


async def test_each_app_sees_its_own_waiting_requests_and_their_place() -> None:
    opened = asyncio.Event()
    running: list[str] = []

    async def handler(worker: str, path: str, body: dict[str, Any]) -> UpstreamResponse:
        running.append(body["messages"][0]["content"])
        if body["messages"][0]["content"] == "hold":
            await opened.wait()
        return answer()

    s = settings(
        workers=[
            {"name": "w0", "url": "http://w0", "models": ["m"], "limits": {"max_in_flight": 1}}
        ],
        apps=[
            {"name": "notes", "key_sha256": sha(KEYS["notes"]), "default_class": "rag"},
            {"name": "voice", "key_sha256": sha(KEYS["voice"]), "default_class": "chat"},
        ],
    )
    app = create_app(s, upstream=FakeUpstream(handler))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:

            def send(app_name: str, content: str, rid: str | None = None) -> asyncio.Task[Any]:
                headers = {"authorization": f"Bearer {KEYS[app_name]}"}
                if rid is not None:
                    headers["x-request-id"] = rid
                body = {"model": "m", "messages": [{"role": "user", "content": content}]}
                return asyncio.create_task(
                    http.post("/v1/chat/completions", json=body, headers=headers)
                )

            async def queue(app_name: str) -> dict[str, Any]:
                r = await http.get(
                    "/v1/hearthgate/queue",
                    headers={"authorization": f"Bearer {KEYS[app_name]}"},
                )
                assert r.status_code == 200, r.text
                return r.json()  # type: ignore[no-any-return]

            warm = await send("voice", "warm")  # one finished request: a drain rate exists
            assert warm.status_code == 200
            held = send("voice", "hold")
            await until(lambda: running[-1:] == ["hold"], what="the slot is taken")
            tasks = [send("notes", "n1", "notes-1")]
            await until(lambda: app.state.gateway.scheduler.queued_count == 1)
            tasks.append(send("notes", "n2", "notes-2"))
            await until(lambda: app.state.gateway.scheduler.queued_count == 2)
            tasks.append(send("voice", "v1", "voice-1"))
            await until(lambda: app.state.gateway.scheduler.queued_count == 3)

            notes = await queue("notes")
            assert notes["app"] == "notes"
            rows = notes["data"]
            assert [(r["request_id"], r["class"]) for r in rows] == [
                ("notes-1", "rag"),
                ("notes-2", "rag"),
            ]
            # the voice app's chat request goes first, then notes-1 before notes-2
            assert [r["ahead"] for r in rows] == [1, 2]
            assert all(r["waited_ms"] >= 0 for r in rows)
            assert all(r["estimated_wait_s"] > 0 for r in rows)
            voice = (await queue("voice"))["data"]
            assert [(r["request_id"], r["ahead"]) for r in voice] == [("voice-1", 0)]

            r = await http.get("/v1/hearthgate/queue")
            assert r.status_code == 401  # an app's key is needed, as on /v1/models
            opened.set()
            for t in [held, *tasks]:
                assert (await t).status_code == 200
            assert (await queue("notes"))["data"] == []
