"""Embeddings coalescing in front of the real MiniLM worker (vLLM CPU): many concurrent
single-input requests through the gateway give the same vectors as direct calls, with fewer
upstream calls; different parameters are never merged; a bad input fails only its own
request; base64 works."""

from __future__ import annotations

import asyncio
import base64
import math
import random
import re
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Workers, e2e_settings
from tests.support import gateway

pytestmark = pytest.mark.e2e

MODEL = "minilm"


@pytest.fixture(scope="module")
def gateway_url(workers: Workers) -> Iterator[str]:
    """The shared settings with an embed class that has no target: this module sends up to
    500 texts at once, more than MiniLM answers within the built-in 2 s, and checks every
    answer (late shedding in front of the same worker: test_shed_vllm.py)."""
    settings = e2e_settings(workers)
    settings["classes"] = {"chat": {"priority": 1, "interactive": True}, "embed": {"priority": 3}}
    with gateway(settings, name="e2e-coalesce-gateway") as url:
        yield url


WORDS = [
    "pasta",
    "tomato",
    "garden",
    "invoice",
    "school",
    "bicycle",
    "holiday",
    "dentist",
    "recipe",
    "birthday",
    "train",
    "library",
    "laundry",
    "grandma",
    "piano",
    "football",
    "weather",
    "kitchen",
    "insurance",
    "passport",
    "garage",
]


def texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"note {i}: " + " ".join(rng.choices(WORDS, k=rng.randint(3, 12))) for i in range(n)]


def vector(item: dict[str, Any]) -> list[float]:
    emb = item["embedding"]
    if isinstance(emb, str):  # base64 of little-endian float32 (vLLM's default)
        raw = base64.b64decode(emb)
        return list(struct.unpack(f"<{len(raw) // 4}f", raw))
    return [float(x) for x in emb]


def cosine(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


async def post_all(url: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(timeout=240, limits=limits) as client:
        return await asyncio.gather(*(client.post(url + "/v1/embeddings", json=b) for b in bodies))


def assert_same_vectors(direct: list[httpx.Response], via: list[httpx.Response]) -> None:
    for d, v in zip(direct, via, strict=True):
        assert d.status_code == 200, d.text
        assert v.status_code == 200, v.text
        dd, vd = d.json()["data"], v.json()["data"]
        assert [x["index"] for x in vd] == list(range(len(dd)))
        for a, b in zip(dd, vd, strict=True):
            assert cosine(vector(a), vector(b)) >= 0.9999


async def test_500_concurrent_single_inputs_match_direct_calls_with_fewer_upstream_calls(
    gateway_url: str, embed_worker_url: str
) -> None:
    bodies = [{"model": MODEL, "input": t} for t in texts(500, seed=6)]
    direct = await post_all(embed_worker_url, bodies)
    calls = "hearthgate_coalesce_upstream_calls_total"
    saved = "hearthgate_coalesce_calls_saved_total"
    calls0, saved0 = metric(gateway_url, calls), metric(gateway_url, saved)
    via = await post_all(gateway_url, bodies)
    used = metric(gateway_url, calls) - calls0
    assert_same_vectors(direct, via)
    assert 1 <= used < 500, used
    assert metric(gateway_url, saved) - saved0 == 500 - used
    # Per-request usage is apportioned from each call's total; the totals agree exactly.
    total_direct = sum(r.json()["usage"]["prompt_tokens"] for r in direct)
    assert sum(r.json()["usage"]["prompt_tokens"] for r in via) == total_direct
    print(f"\n500 requests -> {used:.0f} upstream calls")


async def test_mixed_parameters_are_never_merged(gateway_url: str, embed_worker_url: str) -> None:
    variants: list[dict[str, Any]] = [
        {},
        {"encoding_format": "base64"},
        {"truncate_prompt_tokens": 3},  # a different vector for the same text
        {"user": "someone"},
        {"encoding_format": "float", "truncate_prompt_tokens": 5},
    ]
    bodies = [
        {"model": MODEL, "input": t, **variants[i % len(variants)]}
        for i, t in enumerate(texts(100, seed=7))
    ]
    direct = await post_all(embed_worker_url, bodies)
    via = await post_all(gateway_url, bodies)
    assert_same_vectors(direct, via)
    for b, v in zip(bodies, via, strict=True):
        emb = v.json()["data"][0]["embedding"]
        assert isinstance(emb, str) == (b.get("encoding_format") == "base64")
    # Truncation matters, so a merge across it would have shown above.
    short, full = via[2].json()["data"][0], via[0].json()["data"][0]
    assert cosine(vector(short), vector(full)) < 0.999


async def test_one_malformed_input_fails_only_its_own_request(
    gateway_url: str, embed_worker_url: str
) -> None:
    good = [{"model": MODEL, "input": t} for t in texts(30, seed=8)]
    too_long = {"model": MODEL, "input": "word " * 600}  # over MiniLM's 256 tokens: vLLM 400
    bad = [
        {"model": MODEL, "input": []},  # refused by the gateway
        {"model": MODEL, "input": ["text", 17]},  # refused by the gateway
        too_long,  # refused by the worker, inside a merged call: split and retried alone
    ]
    via = await post_all(gateway_url, good[:15] + bad + good[15:])
    statuses = [r.status_code for r in via]
    assert statuses == [200] * 15 + [400] * 3 + [200] * 15, statuses
    for r in via[15:18]:
        err = r.json()["error"]
        assert err["message"] and "type" in err
    assert "maximum context length" in via[17].json()["error"]["message"]
    direct = await post_all(embed_worker_url, good)
    assert_same_vectors(direct, via[:15] + via[18:])


async def test_base64_and_token_inputs_work(gateway_url: str, embed_worker_url: str) -> None:
    bodies: list[dict[str, Any]] = [
        {"model": MODEL, "input": t, "encoding_format": "base64"} for t in texts(40, seed=9)
    ]
    bodies += [
        {"model": MODEL, "input": [101, 7592, 2088, 102]},
        {"model": MODEL, "input": [[101, 7592, 102], [101, 2088, 102]]},
        {"model": MODEL, "input": ["two texts", "in one request"]},
    ]
    direct = await post_all(embed_worker_url, bodies)
    via = await post_all(gateway_url, bodies)
    assert_same_vectors(direct, via)
    # Token-id inputs: usage is exact (vLLM adds no special tokens to them).
    assert via[40].json()["usage"]["prompt_tokens"] == 4
    assert via[41].json()["usage"]["prompt_tokens"] == 6
