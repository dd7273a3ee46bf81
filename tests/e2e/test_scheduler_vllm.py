"""The scheduler in front of a real vLLM worker: interactive work overtakes a burst of long
prompts, full queues answer 429 with Retry-After, a disconnect while queued frees the place."""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Workers, lasting
from tests.support import gateway

pytestmark = pytest.mark.e2e

WORDS = (
    "kitchen",
    "garden",
    "school",
    "dinner",
    "weekend",
    "holiday",
    "bicycle",
    "library",
    "music",
    "window",
)


def long_prompt(i: int, words: int = 1000) -> str:
    """A long prompt that shares no prefix with any earlier one (vLLM caches prefixes)."""
    rng = random.Random()
    return " ".join(rng.choice(WORDS) for _ in range(words)) + f" {i}"


def settings(workers: Workers, **rag: Any) -> dict[str, Any]:
    return {
        "workers": [
            {
                "name": "gen0",
                "url": workers.gen.url,
                "models": ["tiny-llama"],
                "limits": {
                    "prefill_token_budget": 4096,
                    "interactive_reserved_prefill_tokens": 1024,
                    "max_in_flight_per_class": {"rag": rag.pop("in_flight", 2)},
                },
            }
        ],
        "classes": {
            "chat": {"priority": 1, "interactive": True, "ttft_ms": 800, "itl_ms": 80},
            "rag": {"priority": 2, "ttft_ms": 20000, **rag},
        },
        "rules": [{"min_prompt_tokens": 1500, "class": "rag"}],
        "health": {"interval_s": 0.5},
    }


@pytest.fixture(scope="module")
def sched_gateway(workers: Workers) -> Iterator[str]:
    with gateway(settings(workers), name="e2e-sched") as url:
        yield url


async def ttft(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], sent: asyncio.Event | None = None
) -> float:
    """Time to the first token; ``sent`` is set once the whole request is on the wire."""

    async def trace(event: str, info: dict[str, Any]) -> None:  # httpcore's trace hook
        if event == "http11.send_request_body.complete" and sent is not None:
            sent.set()

    t0 = time.perf_counter()
    async with client.stream(
        "POST", url + "/v1/completions", json=body, extensions={"trace": trace}
    ) as r:
        assert r.status_code == 200, await r.aread()
        first = None
        async for line in r.aiter_lines():
            if first is None and line.startswith("data: {"):
                first = time.perf_counter() - t0
    assert first is not None
    return first


async def burst_then_chat(url: str, via_gateway: bool = False, count: int = 10) -> float:
    """Chat's time to its first token when sent behind a burst of ``count`` long prompts."""
    async with httpx.AsyncClient(timeout=180, limits=httpx.Limits(max_connections=None)) as client:
        sent = [asyncio.Event() for _ in range(count)]
        opened = 0
        if via_gateway:  # requests the gateway has taken in so far (a counter: no race)
            opened = (await client.get(url + "/status")).json()["leases"]["opened_total"]
        longs = [
            asyncio.create_task(
                ttft(
                    client,
                    url,
                    {
                        "model": "tiny-llama",
                        "prompt": long_prompt(i),
                        "max_tokens": 16,
                        "ignore_eos": True,
                        "stream": True,
                    },
                    sent[i],
                )
            )
            for i in range(count)
        ]
        # The chat goes once the whole burst is on the wire and, through the gateway, taken
        # in there (each holds a lease), so that it arrives behind all of it.
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in sent)), 60)
        if via_gateway:
            deadline = time.monotonic() + 20
            while True:
                s = (await client.get(url + "/status")).json()
                if s["leases"]["opened_total"] - opened >= count:
                    break
                assert time.monotonic() < deadline, f"the burst did not reach the gateway: {s}"
                await asyncio.sleep(0.05)
        chat = {
            "model": "tiny-llama",
            "prompt": "What time is the dentist appointment?",
            "max_tokens": 16,
            "ignore_eos": True,
            "stream": True,
        }
        chat_ttft = await ttft(client, url, chat)
        await asyncio.gather(*longs)
        return chat_ttft


def test_chat_overtakes_a_burst_of_long_prompts(
    workers: Workers, sched_gateway: str, gen_worker_url: str
) -> None:
    # Warm the worker up on both shapes first (new shapes compile on first use).
    asyncio.run(burst_then_chat(gen_worker_url))
    # A burst that does not delay chat sent straight to the worker shows nothing: an AVX-512
    # box prefills ten long prompts in tens of milliseconds (CI, 2026-12-06: chat 36-59 ms
    # behind them, direct). The burst doubles until it delays chat direct by 0.5 s.
    count = 10
    direct = asyncio.run(burst_then_chat(gen_worker_url, count=count))
    while direct < 0.5 and count < 80:
        count *= 2
        direct = asyncio.run(burst_then_chat(gen_worker_url, count=count))
    # Up to two tries, each measuring both paths back to back: on this shared 2-core box a
    # starved gateway process has lost the ratio once in a while (CI, 2026-12-02: 1.6 s
    # through the gateway against 0.4 s direct, then a pass when rerun). A gateway that
    # does not put chat first fails both.
    tries = []
    for _ in range(2):
        direct = asyncio.run(burst_then_chat(gen_worker_url, count=count))
        via = asyncio.run(burst_then_chat(sched_gateway, via_gateway=True, count=count))
        tries.append((direct, via))
        print(
            f"\nchat TTFT behind {count} long prompts: direct {direct * 1000:.0f} ms, "
            f"through the gateway {via * 1000:.0f} ms"
        )
        if via < direct / 2:
            break
    assert via < direct / 2, (count, tries)


def test_full_queue_answers_429_with_retry_after(workers: Workers) -> None:
    with gateway(settings(workers, in_flight=1, max_queue=1), name="e2e-full") as url:

        async def flood() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=180) as client:
                body = {"model": "tiny-llama", "max_tokens": 4, "ignore_eos": True}
                return await asyncio.gather(
                    *(
                        client.post(
                            url + "/v1/completions", json={**body, "prompt": long_prompt(i)}
                        )
                        for i in range(5)
                    )
                )

        statuses = [r.status_code for r in asyncio.run(flood())]
        assert statuses.count(200) >= 2 and 429 in statuses, statuses
        rejected = next(r for r in asyncio.run(flood()) if r.status_code == 429)
        assert int(rejected.headers["retry-after"]) >= 1
        assert rejected.json()["error"]["code"] == "queue_full"


def test_disconnect_while_queued_frees_the_place(workers: Workers) -> None:
    # The first request holds RAG's one place while the test queues, cancels and looks:
    # sized to keep the worker busy for 3 s where it can (a fast box wrote 600 tokens
    # before the second request was seen queued).
    body = {"model": "tiny-llama", "max_tokens": 16, "ignore_eos": True}
    first = lasting(workers.gen.url, {**body, "prompt": long_prompt(1), "max_tokens": 1500}, 3.0)
    with gateway(settings(workers, in_flight=1, max_queue=1), name="e2e-queued") as url:

        async def scenario() -> dict[str, Any]:
            async with httpx.AsyncClient(timeout=180) as client:

                async def wait_for(what: str, ok: Callable[[dict[str, Any]], bool]) -> None:
                    deadline = time.monotonic() + 20  # a loaded 2-core box can be slow
                    while not ok((await client.get(url + "/status")).json()):
                        assert time.monotonic() < deadline, what
                        await asyncio.sleep(0.05)

                running = asyncio.create_task(client.post(url + "/v1/completions", json=first))
                await wait_for("first request admitted", lambda s: s["in_flight"] == 1)
                queued = asyncio.create_task(
                    client.post(url + "/v1/completions", json={**body, "prompt": long_prompt(2)})
                )
                await wait_for("second request queued", lambda s: s["queues"]["rag"]["depth"] == 1)
                queued.cancel()  # the client goes away while its request waits
                await wait_for("queue emptied", lambda s: s["queues"]["rag"]["depth"] == 0)
                status = (await client.get(url + "/status")).json()
                # The place is free again: a new request is queued, not refused.
                again = await client.post(
                    url + "/v1/completions", json={**body, "prompt": long_prompt(3)}
                )
                assert again.status_code == 200
                assert (await running).status_code == 200
                return status

        status = asyncio.run(scenario())
        assert status["queues"]["rag"]["depth"] == 0


def test_a_rag_flood_is_queued_until_its_line_stands_then_told_early(workers: Workers) -> None:
    """Long prompts arriving faster than the worker serves them one at a time (at least four
    times its measured pace: the box's speed varies 2-7x): with the drain
    rate already measured, the flood's first requests still wait in the gateway; only once
    the oldest has waited ``shed_after_wait_ms`` (2 s here; 15 s as shipped) are later
    arrivals that would miss the 1 s target told 429 ``target_unreachable`` with a
    Retry-After, at once, and with ``shed_queued`` so are the queued ones that would wait
    2 s again, then and there rather than after their wait. Nothing else happens to
    any request."""
    rag = {
        "in_flight": 1,
        "ttft_ms": 1000,
        "shed_late": True,
        "shed_after_wait_ms": 2000,
        "shed_queued": True,
    }
    with gateway(settings(workers, **rag), name="e2e-standing") as url:

        async def flood() -> list[tuple[float, float, httpx.Response]]:
            # Every request of the flood has its own connection from the start (httpx's
            # default pool of 100 would queue the rest in the client, not the gateway).
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
            async with httpx.AsyncClient(timeout=180, limits=limits) as client:
                body = {"model": "tiny-llama", "max_tokens": 8, "ignore_eos": True}
                took = []
                for i in range(8):  # one at a time: the class's drain rate is measured (8 ends)
                    start = time.perf_counter()
                    r = await client.post(
                        url + "/v1/completions", json={**body, "prompt": long_prompt(i, 1500)}
                    )
                    took.append(time.perf_counter() - start)
                    assert r.status_code == 200, r.text
                # At least 8 a second and at least four times as fast as the worker served
                # them one at a time (an AVX-512 box serves one in ~0.2 s), for 4 s or 64
                # requests: more connections at once load the client and the gateway.
                interval = min(0.125, statistics.median(took[4:]) / 4)
                count = min(64, max(32, math.ceil(4.0 / interval)))
                t0 = time.perf_counter()

                async def one(i: int) -> tuple[float, float, httpx.Response]:
                    await asyncio.sleep(i * interval)
                    sent = time.perf_counter() - t0
                    prompt = long_prompt(100 + i, 1500)
                    r = await client.post(url + "/v1/completions", json={**body, "prompt": prompt})
                    return sent, time.perf_counter() - t0, r

                return await asyncio.gather(*(one(i) for i in range(count)))

        got = asyncio.run(flood())
        ok = [sent for sent, _, r in got if r.status_code == 200]
        shed = [(sent, back, r) for sent, back, r in got if r.status_code == 429]
        assert len(ok) + len(shed) == len(got), sorted({r.status_code for _, _, r in got})
        assert ok and shed, (len(ok), len(shed))
        for _, _, r in shed:
            assert r.json()["error"]["code"] == "target_unreachable", r.text
            assert int(r.headers["retry-after"]) >= 1
        first_told = min(back for _, back, _ in shed)
        longest = max(back - sent for sent, back, _ in shed)
        backlog = sum(1 for sent, back, _ in shed if back - sent > 0.5)
        print(
            f"\n{len(got)} long prompts in at most 4 s: {len(ok)} answered, {len(shed)} told "
            f"429 from {first_told:.1f} s on ({backlog} of them from the queue), the longest told "
            f"after {longest:.1f} s"
        )
        # Nobody is refused before the line has stood 2 s (the first queued request was
        # sent at 0.125 s or sooner; 0.3 s of slack for the trip to a busy gateway)...
        assert first_told >= 1.7, first_told
        # ...and nobody told after a wait of its own longer than the line's 2 s and that
        # slack: the backlog is told when the line stands, not once its turn would come.
        assert longest < 2.0 + 1.5, longest
