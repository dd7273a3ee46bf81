"""The priority the gateway sends a worker that schedules by priority: each class's own,
and within a class an app flooding the worker after every other app, so vLLM prefills a
light app's prompt before the flood's queue. In-process, with a FakeUpstream that holds
every call and records its body."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from hearthgate.gateway.core import Gateway
from hearthgate.gateway.upstream import UpstreamResponse
from tests.inprocess import Exchange, FakeResponse, FakeUpstream, settings, until

KEYS = {"scraper": "scraper-key", "chatui": "chatui-key", "notes": "notes-key"}
CLASSES = {
    "chat": {"priority": 1, "interactive": True, "ttft_ms": 500, "itl_ms": 50},
    "rag": {"priority": 2},
}


def _settings(priority_scheduling: bool) -> Any:
    return settings(
        workers=[
            {
                "name": "w0",
                "url": "http://w0",
                "models": ["m"],
                "priority_scheduling": priority_scheduling,
            }
        ],
        classes=CLASSES,
        rules=[],
        apps=[
            {
                "name": name,
                "key_sha256": hashlib.sha256(key.encode()).hexdigest(),
                "default_class": "rag" if name == "notes" else "chat",
            }
            for name, key in KEYS.items()
        ],
        scheduler={"tick_ms": 5, "pacing": {"app_min_cap": 3, "flood_prefill": None}},
    )


async def _sent_priorities(priority_scheduling: bool) -> dict[str, list[Any]]:
    """Four scraper requests, then one each from the chat UI and the notes app, all held
    by the worker; the priority each body carried, per app in order."""
    release = asyncio.Event()

    async def handler(worker: str, path: str, body: dict[str, Any]) -> UpstreamResponse:
        await release.wait()
        return FakeResponse(200, [b'{"id": "x", "choices": []}'])

    up = FakeUpstream(handler)
    gw = Gateway(_settings(priority_scheduling), upstream=up)
    await gw.start()
    exchanges = []
    try:
        for app in ["scraper"] * 4 + ["chatui", "notes"]:
            body = {"model": "m", "messages": [{"role": "user", "content": app}]}
            headers = {"authorization": f"Bearer {KEYS[app]}"}
            exchanges.append(Exchange(gw, "/v1/chat/completions", body, headers))
            n = len(exchanges)
            await until(lambda n=n: len(up.posts) == n, what=f"request {n} reaches the worker")
        release.set()
        for ex in exchanges:
            await ex.done()
            assert ex.status == 200
    finally:
        release.set()
        await gw.stop()
    sent: dict[str, list[Any]] = {}
    for _, _, body in up.posts:
        sent.setdefault(body["messages"][0]["content"], []).append(body.get("priority"))
    return sent


async def test_a_flooding_app_goes_after_the_other_apps_of_its_class() -> None:
    sent = await _sent_priorities(priority_scheduling=True)
    # chat 1 -> 2; from its third sequence on the worker the scraper floods it (app_min_cap)
    assert sent["scraper"] == [2, 2, 3, 3]
    assert sent["chatui"] == [2]
    assert sent["notes"] == [4]  # rag 2 -> 4: after the flood, class order is kept


async def test_no_priority_goes_to_a_worker_that_does_not_schedule_by_it() -> None:
    sent = await _sent_priorities(priority_scheduling=False)
    assert sent == {"scraper": [None] * 4, "chatui": [None], "notes": [None]}
