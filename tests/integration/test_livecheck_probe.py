"""The probing layer of `hearthgate check --live` against small fake vLLM servers on loopback.

Covers what the real vLLM 0.32 workers of tests/e2e/test_livecheck_vllm.py cannot show: a
vLLM that refuses a non-zero priority under fcfs, /server_info, and workers that answer
badly or not at all.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from aiohttp import web

from hearthgate.gateway.livecheck import live_check, probe_worker
from hearthgate.gateway.settings import Settings, Worker
from tests.support import free_port

Handler = Callable[[web.Request], Any]


@asynccontextmanager
async def fake_vllm(routes: Mapping[tuple[str, str], Handler]) -> AsyncIterator[str]:
    app = web.Application()
    for (method, path), handler in routes.items():
        app.router.add_route(method, path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def models(*names: str) -> Handler:
    async def handler(_: web.Request) -> web.Response:
        data = [{"id": n, "object": "model", "max_model_len": 2048} for n in names]
        return web.json_response({"object": "list", "data": data})

    return handler


async def refuse_priority(request: web.Request) -> web.Response:
    """vLLM's documented behaviour under fcfs: a non-zero priority is a 400."""
    body = await request.json()
    if body.get("priority", 0):
        msg = f"Got priority {body['priority']} but Priority scheduling is not enabled."
        return web.json_response({"error": {"message": msg, "code": 400}}, status=400)
    return web.json_response({"choices": [{"text": "x"}]})


async def probe(url: str, timeout_s: float = 10.0, **spec: Any) -> Any:
    w = Worker(**{"name": "w", "url": url, "models": ["m"], **spec})
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        return await probe_worker(session, w, 5)


async def test_priority_refused_under_fcfs_means_fcfs_and_the_role_is_still_probed() -> None:
    seen: list[dict[str, Any]] = []

    async def completions(request: web.Request) -> web.Response:
        seen.append(await request.json())
        return await refuse_priority(request)

    routes = {("GET", "/v1/models"): models("m"), ("POST", "/v1/completions"): completions}
    async with fake_vllm(routes) as url:
        facts = await probe(url)
    assert facts.policy == "fcfs" and facts.policy_source == "it refused a request with a priority"
    assert facts.generates is True
    assert [b.get("priority") for b in seen] == [5, None]
    assert all(b["model"] == "m" and b["max_tokens"] == 1 for b in seen)


async def test_a_remote_worker_that_accepts_priority_leaves_the_policy_unknown() -> None:
    async def completions(_: web.Request) -> web.Response:
        return web.json_response({"choices": [{"text": "x"}]})

    routes = {("GET", "/v1/models"): models("m"), ("POST", "/v1/completions"): completions}
    async with fake_vllm(routes) as url:
        facts = await probe(url)
    assert facts.generates is True and facts.policy is None
    assert "no /server_info" in facts.policy_source
    assert "accepted a request with a priority" in facts.policy_source


async def test_server_info_tells_the_policy_and_the_embeddings_probe_uses_the_alias() -> None:
    bodies: list[dict[str, Any]] = []

    async def info(request: web.Request) -> web.Response:
        assert request.query["config_format"] == "json"
        return web.json_response({"vllm_config": {"scheduler_config": {"policy": "priority"}}})

    async def embeddings(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        return web.json_response({"data": [{"embedding": [0.1]}]})

    routes = {
        ("GET", "/v1/models"): models("minilm-upstream"),
        ("GET", "/server_info"): info,
        ("POST", "/v1/embeddings"): embeddings,
    }
    async with fake_vllm(routes) as url:
        facts = await probe(
            url, role="embeddings", upstream_models={"m": "minilm-upstream"}, models=["m"]
        )
    assert (facts.policy, facts.policy_source) == ("priority", "/server_info")
    assert facts.embeds is True and facts.generates is None
    assert bodies == [{"model": "minilm-upstream", "input": "hearthgate live check", "priority": 5}]


async def test_bad_answers_make_the_worker_unreachable_with_the_reason() -> None:
    async def broken(_: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "engine dead"}}, status=500)

    async def garbage(_: web.Request) -> web.Response:
        return web.Response(text="<html>router login</html>")

    async with fake_vllm({("GET", "/v1/models"): broken}) as url:
        facts = await probe(url)
    assert facts.unreachable == "/v1/models answered HTTP 500: engine dead"
    async with fake_vllm({("GET", "/v1/models"): garbage}) as url:
        facts = await probe(url)
    assert facts.unreachable is not None and "JSONDecodeError" in facts.unreachable


async def test_a_worker_that_hangs_times_out_and_the_others_are_still_reported() -> None:
    release = asyncio.Event()

    async def hang(_: web.Request) -> web.Response:
        await release.wait()
        return web.json_response({})

    async def not_found(_: web.Request) -> web.Response:
        return web.json_response({"detail": "Not Found"}, status=404)

    slow_routes = {("GET", "/v1/models"): hang}
    ok_routes = {("GET", "/v1/models"): models("m"), ("POST", "/v1/completions"): not_found}
    async with fake_vllm(slow_routes) as slow, fake_vllm(ok_routes) as ok:
        s = Settings(
            workers=[
                {"name": "slow", "url": slow, "models": ["m"]},
                {"name": "emb", "url": ok, "models": ["m"]},
            ]
        )
        try:
            results = await live_check(s, timeout_s=0.5)
        finally:
            release.set()
    by_name = {w.name: (f, found) for w, f, found in results}
    assert by_name["slow"][0].unreachable == "no answer in time"
    facts, found = by_name["emb"]
    assert facts.generates is False and facts.probe_note == "HTTP 404: Not Found"
    assert [f.level for f in found] == ["error"]
    assert json.dumps([f.problem for f in found]).count("does not run a text generation") == 1
