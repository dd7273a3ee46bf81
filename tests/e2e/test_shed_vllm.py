"""Late shedding of an embeddings flood in front of the real MiniLM worker (vLLM CPU), with
the built-in classes (the embed class's 2 s target and ``shed_late``): a flood of texts far
beyond what the worker answers in 2 s is split at arrival into answered requests and clean
429s (``target_unreachable``, ``Retry-After``), nothing else; every 429 is counted in the
metrics; a refused text sent again after its ``Retry-After`` is answered."""

from __future__ import annotations

import asyncio
import re
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import pytest

from tests.e2e.conftest import Workers, e2e_settings
from tests.support import gateway

pytestmark = pytest.mark.e2e

MODEL = "minilm"
FLOOD = 1500


@pytest.fixture(scope="module")
def shed_gateway(workers: Workers) -> Iterator[str]:
    with gateway(e2e_settings(workers), name="e2e-shed-gateway") as url:
        yield url


def shed_count(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    pattern = r'^hearthgate_rejected_total\{[^}]*reason="target_unreachable"[^}]*\} (\S+)$'
    return sum(float(v) for v in re.findall(pattern, text, re.M))


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: dict[str, Any]
    seconds: float


async def send(client: aiohttp.ClientSession, url: str, text: str) -> Answer:
    t0 = time.perf_counter()
    async with client.post(url + "/v1/embeddings", json={"model": MODEL, "input": text}) as r:
        body = await r.json(content_type=None)
        return Answer(r.status, dict(r.headers), body, time.perf_counter() - t0)


async def test_an_embeddings_flood_is_answered_or_told_when_to_come_back(
    shed_gateway: str,
) -> None:
    url = shed_gateway
    # aiohttp, not httpx: one httpx client sends a few dozen requests a second at this
    # concurrency, so the flood would reach the gateway as a trickle.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=FLOOD)) as client:
        # The drain rate is measured before anyone is refused (8 answers at least).
        warm = await asyncio.gather(*(send(client, url, f"warm {i}") for i in range(20)))
        assert [a.status for a in warm] == [200] * 20, [a.body for a in warm]
        before = shed_count(url)
        got = await asyncio.gather(
            *(send(client, url, f"note {i}: the garden and the library") for i in range(FLOOD))
        )
        ok = [a for a in got if a.status == 200]
        shed = [a for a in got if a.status == 429]
        assert len(ok) + len(shed) == FLOOD, sorted({a.status for a in got})
        assert ok and shed, (len(ok), len(shed))
        for a in ok:
            assert len(a.body["data"][0]["embedding"]) == 384
        for a in shed:
            err = a.body["error"]
            assert err["code"] == "target_unreachable", err
            assert "requests ahead of it" in err["message"]
            assert int(a.headers["Retry-After"]) >= 1
        assert shed_count(url) - before == len(shed)
        waits = [a.seconds for a in ok]
        print(
            f"\n{FLOOD} texts at once: {len(ok)} answered (p50 {statistics.median(waits):.2f} s,"
            f" max {max(waits):.2f} s), {len(shed)} refused with 429 (p50"
            f" {statistics.median(a.seconds for a in shed):.2f} s)"
        )
        # A client that honours Retry-After gets its answer on the next try.
        await asyncio.sleep(max(int(a.headers["Retry-After"]) for a in shed[:20]))
        again = await asyncio.gather(*(send(client, url, f"retry {i}") for i in range(20)))
        assert [a.status for a in again] == [200] * 20, [a.body for a in again]
