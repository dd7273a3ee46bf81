"""Embeddings coalescing through the real gateway process, in front of the instant upstream
(deterministic vectors per item and parameter set; calls counted at its /stats). The same
against real MiniLM is tests/e2e/test_coalesce_vllm.py."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import gateway, instant_upstream


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with instant_upstream(delay_ms=20) as url:  # each embeddings call takes 20 ms
        yield url


@pytest.fixture(scope="module")
def gw(upstream: str) -> Iterator[str]:
    settings = {
        "workers": [{"name": "emb0", "url": upstream, "models": ["m"], "role": "embeddings"}],
        "health": {"interval_s": 0.2},
    }
    with gateway(settings, name="coalesce-gateway") as url:
        yield url


def metric(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def calls(upstream: str) -> int:
    return int(httpx.get(upstream + "/stats").json()["embedding_calls"])


async def post_all(url: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        return await asyncio.gather(*(client.post(url + "/v1/embeddings", json=b) for b in bodies))


async def test_concurrent_requests_are_merged_and_answered_exactly(gw: str, upstream: str) -> None:
    bodies = [{"model": "m", "input": f"note number {i}"} for i in range(200)]
    direct = await post_all(upstream, bodies)
    before, m0 = calls(upstream), httpx.get(gw + "/metrics").text
    via = await post_all(gw, bodies)
    used = calls(upstream) - before
    assert all(r.status_code == 200 for r in via)
    for d, v in zip(direct, via, strict=True):
        dj, vj = d.json(), v.json()
        assert vj["data"] == dj["data"]  # same vector, index 0
        assert vj["usage"]["prompt_tokens"] >= 1
    assert used < 200
    m1 = httpx.get(gw + "/metrics").text
    name = "hearthgate_coalesce_upstream_calls_total"
    assert metric(m1, name) - metric(m0, name) == used
    saved = "hearthgate_coalesce_calls_saved_total"
    assert metric(m1, saved) - metric(m0, saved) == 200 - used
    # Usage adds up to what the upstream counted: 3 words + 2 per text.
    assert sum(r.json()["usage"]["prompt_tokens"] for r in via) == 200 * 5


async def test_mixed_parameters_are_never_merged(gw: str, upstream: str) -> None:
    variants: list[dict[str, Any]] = [
        {},
        {"encoding_format": "base64"},
        {"encoding_format": "float"},
        {"user": "alice"},
        {"user": "bob"},
        {"truncate_prompt_tokens": 3},
    ]
    bodies = [{"model": "m", "input": f"text {i}", **variants[i % 6]} for i in range(120)]
    bodies += [{"model": "m", "input": [[1, 2, 3], [4]]}, {"model": "m", "input": [5, 6]}]
    direct = await post_all(upstream, bodies)
    via = await post_all(gw, bodies)
    for d, v in zip(direct, via, strict=True):
        assert v.status_code == 200
        assert v.json()["data"] == d.json()["data"]  # the vector depends on the parameters


async def test_bad_inputs_fail_only_their_own_request(gw: str, upstream: str) -> None:
    good = [{"model": "m", "input": f"fine {i}"} for i in range(20)]
    bodies = [
        *good[:10],
        {"model": "m", "input": []},  # refused by the gateway
        {"model": "m", "input": ["a", 1]},  # refused by the gateway
        {"model": "m", "input": "BAD"},  # refused by the upstream, inside a merged call
        *good[10:],
    ]
    via = await post_all(gw, bodies)
    statuses = [r.status_code for r in via]
    assert statuses == [200] * 10 + [400, 400, 400] + [200] * 10
    for r in via[10:12]:
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and "'input'" in err["message"]
    assert via[12].json()["error"]["message"] == "bad input"
    direct = await post_all(upstream, good)
    ok = via[:10] + via[13:]
    assert [r.json()["data"] for r in ok] == [r.json()["data"] for r in direct]


def test_single_request_and_token_input(gw: str, upstream: str) -> None:
    body = {"model": "m", "input": [[101, 7592, 102], [101, 102]]}
    via = httpx.post(gw + "/v1/embeddings", json=body)
    direct = httpx.post(upstream + "/v1/embeddings", json=body)
    assert via.status_code == 200 and via.json()["data"] == direct.json()["data"]
    assert via.json()["usage"]["prompt_tokens"] == 5
    assert via.headers["x-hearthgate-worker"] == "emb0"


async def test_full_length_vectors_arrive_digit_for_digit() -> None:
    # 384 full-precision floats per vector, as MiniLM answers: the gateway copies each
    # vector's text from the merged answer, so a caller's bytes hold the very digits the
    # worker wrote, and parse to the same floats as a direct call's.
    with instant_upstream(delay_ms=20, args=["--dims", "384"]) as up:
        settings = {"workers": [{"name": "emb0", "url": up, "models": ["m"], "role": "embeddings"}]}
        with gateway(settings, name="coalesce-384") as gw:
            bodies = [{"model": "m", "input": f"a longer note, number {i}"} for i in range(60)]
            direct = await post_all(up, bodies)
            before = calls(up)
            via = await post_all(gw, bodies)
            assert calls(up) - before < 60  # merged
    for d, v in zip(direct, via, strict=True):
        assert v.status_code == 200
        vec = d.json()["data"][0]["embedding"]
        assert len(vec) == 384 and v.json()["data"][0]["embedding"] == vec
        raw = [re.search(rb'"embedding": ?(\[[^\]]*\])', r.content) for r in (d, v)]
        assert raw[0] is not None and raw[1] is not None
        assert raw[1].group(1) == raw[0].group(1)  # the same bytes
        assert json.loads(raw[1].group(1)) == vec
