"""Fair-share counters and app token totals survive a gateway restart through Redis."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from hearthgate.gateway.app import create_app
from hearthgate.gateway.upstream import UpstreamResponse
from tests.inprocess import FakeResponse, FakeUpstream, settings


async def answer(worker: str, path: str, body: dict[str, Any]) -> UpstreamResponse:
    usage = {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150}
    payload = {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
        "usage": usage,
    }
    return FakeResponse(200, [json.dumps(payload).encode()])


def config(redis_url: str) -> Any:
    return settings(
        apps=[
            {"name": "heavy", "key_env": "HEAVY_KEY", "default_class": "chat"},
            {"name": "light", "key_env": "LIGHT_KEY", "default_class": "chat"},
        ],
        redis={"url": redis_url, "fairness_snapshot_s": 60},
    )


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEAVY_KEY", "heavy-key")
    monkeypatch.setenv("LIGHT_KEY", "light-key")


async def run_heavy(redis_url: str, n: int) -> dict[str, dict[str, float]]:
    app = create_app(config(redis_url), upstream=FakeUpstream(answer))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            for i in range(n):
                r = await http.post(
                    "/v1/chat/completions",
                    headers={"Authorization": "Bearer heavy-key"},
                    json={"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]},
                )
                assert r.status_code == 200, r.text
        snap: dict[str, dict[str, float]] = app.state.gateway.scheduler.fairness_snapshot()
    return snap  # the lifespan's end saved it to Redis


async def test_restart_keeps_heavy_app_behind_and_token_totals(redis_url: str) -> None:
    before = await run_heavy(redis_url, 6)
    assert before["chat"]["heavy"] > 0
    app = create_app(config(redis_url), upstream=FakeUpstream(answer))
    async with app.router.lifespan_context(app):
        after = app.state.gateway.scheduler.fairness_snapshot()
        assert after["chat"]["heavy"] == pytest.approx(before["chat"]["heavy"])
        assert after["chat"].get("light", 0.0) == 0.0
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            status = (await http.get("/status")).json()
    lifetime = status["batches"]["app_tokens_lifetime"]
    assert lifetime["heavy"] == {"prompt": 600, "completion": 300}


async def test_without_redis_a_restart_starts_fresh(redis_url: str) -> None:
    """The control: the counters above came from Redis, not from anything else."""
    await run_heavy(redis_url, 3)
    cfg = settings(apps=[{"name": "heavy", "key_env": "HEAVY_KEY", "default_class": "chat"}])
    app = create_app(cfg, upstream=FakeUpstream(answer))
    async with app.router.lifespan_context(app):
        assert app.state.gateway.scheduler.fairness_snapshot()["chat"].get("heavy", 0.0) == 0.0
