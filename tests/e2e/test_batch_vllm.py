"""The Batch API end to end: the official OpenAI SDK, a gateway process, real vLLM workers
and a real Redis server; the gateway killed with SIGKILL mid-batch, Redis stopped
mid-batch."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import OpenAI

from hearthgate.deploy.gateway_process import GatewayProcess
from hearthgate.deploy.redis_server import RedisServer
from tests.e2e.conftest import Workers
from tests.inprocess import until_sync
from tests.support import RUN_DIR

pytestmark = pytest.mark.e2e

FINAL = ("completed", "failed", "expired", "cancelled")


def settings(workers: Workers, redis_url: str, **batch: Any) -> dict[str, Any]:
    return {
        "workers": [
            {"name": "gen0", "url": workers.gen.url, "models": ["tiny-llama"]},
            {"name": "emb0", "url": workers.embed.url, "models": ["minilm"], "role": "embeddings"},
        ],
        "health": {"interval_s": 0.5, "retry_after_s": 1},
        "redis": {"url": redis_url},
        # A fixed runner name: the restarted gateway takes back its own claimed lines at once.
        "batch": {"runner_id": "e2e-runner", "claim_timeout_s": 15, **batch},
    }


@pytest.fixture
def gw_factory(workers: Workers) -> Iterator[list[GatewayProcess]]:
    made: list[GatewayProcess] = []
    yield made
    for g in made:
        g.stop()


def start(made: list[GatewayProcess], cfg: dict[str, Any], port: int | None = None) -> str:
    g = GatewayProcess(cfg, run_dir=RUN_DIR, name="batch-gateway", port=port)
    made.append(g)
    return g.start()


def chat_lines(n: int, max_tokens: int = 8, prefix: str = "c") -> list[dict[str, Any]]:
    return [
        {
            "custom_id": f"{prefix}{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "tiny-llama",
                "messages": [{"role": "user", "content": f"Write about the number {i}."}],
                "max_tokens": max_tokens,
                "temperature": 0,
            },
        }
        for i in range(n)
    ]


def embed_lines(n: int) -> list[dict[str, Any]]:
    return [
        {
            "custom_id": f"e{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "minilm", "input": f"note number {i} about the garden"},
        }
        for i in range(n)
    ]


def responses_lines(n: int) -> list[dict[str, Any]]:
    return [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/responses",
            "body": {
                "model": "tiny-llama",
                "input": f"Summarise note {i}.",
                "max_output_tokens": 6,
            },
        }
        for i in range(n)
    ]


def upload(client: OpenAI, lines: list[dict[str, Any]]) -> str:
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    return client.files.create(file=("input.jsonl", io.BytesIO(data)), purpose="batch").id


def wait_final(client: OpenAI, batch_id: str, timeout: float = 240) -> Any:
    state: dict[str, Any] = {}

    def done() -> bool:
        state["b"] = client.batches.retrieve(batch_id)
        return state["b"].status in FINAL

    until_sync(done, timeout=timeout, what=f"batch {batch_id} ended", every=0.5)
    return state["b"]


def read_jsonl(client: OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def test_sdk_batches_of_chat_and_embeddings_complete(
    workers: Workers, redis_url: str, gw_factory: list[GatewayProcess]
) -> None:
    url = start(gw_factory, settings(workers, redis_url))
    client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    # One batch has one endpoint (as OpenAI's): 200 chat, 100 embeddings and 20 Responses
    # API lines run as three batches at once.
    chats, embeds, answers = chat_lines(200), embed_lines(100), responses_lines(20)
    b_chat = client.batches.create(
        input_file_id=upload(client, chats),
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"job": "e2e-chat"},
    )
    b_emb = client.batches.create(
        input_file_id=upload(client, embeds), endpoint="/v1/embeddings", completion_window="24h"
    )
    b_resp = client.batches.create(
        input_file_id=upload(client, answers), endpoint="/v1/responses", completion_window="24h"
    )
    for b, lines in ((b_resp, answers), (b_chat, chats), (b_emb, embeds)):
        final = wait_final(client, b.id)
        assert final.status == "completed", final
        assert final.request_counts.total == len(lines)
        assert final.request_counts.completed == len(lines)
        assert final.request_counts.failed == 0
        out = read_jsonl(client, final.output_file_id)
        assert [o["custom_id"] for o in out] == [line["custom_id"] for line in lines]
        assert read_jsonl(client, final.error_file_id) == []
        for o in out:
            assert o["response"]["status_code"] == 200
            usage = o["response"]["body"]["usage"]
            assert usage.get("prompt_tokens", usage.get("input_tokens", 0)) > 0
    assert client.batches.retrieve(b_chat.id).metadata == {"job": "e2e-chat"}
    # Embeddings from the batch agree with a direct call to the worker.
    out = {o["custom_id"]: o for o in read_jsonl(client, final.output_file_id)}
    for line in embeds[:: len(embeds) // 5]:
        direct = httpx.post(
            workers.embed.url + "/v1/embeddings",
            json={"model": "minilm", "input": line["body"]["input"]},
            timeout=60,
        ).json()["data"][0]["embedding"]
        got = out[line["custom_id"]]["response"]["body"]["data"][0]["embedding"]
        assert cosine(direct, got) >= 0.9999


def test_sigkill_mid_batch_resumes_with_every_line_once(
    workers: Workers, redis_url: str, gw_factory: list[GatewayProcess]
) -> None:
    cfg = settings(workers, redis_url)
    url = start(gw_factory, cfg)
    client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    lines = chat_lines(300, max_tokens=24)
    batch = client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )

    def part_done() -> bool:
        counts = client.batches.retrieve(batch.id).request_counts
        return counts.completed >= 60

    until_sync(part_done, timeout=180, what="a fifth of the batch done", every=0.2)
    done_before = client.batches.retrieve(batch.id).request_counts.completed
    gw_factory[-1].kill()
    url = start(gw_factory, cfg)
    client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    final = wait_final(client, batch.id)
    assert final.status == "completed"
    assert done_before < 300, "the batch finished before the kill: nothing was tested"
    assert final.request_counts.completed == 300
    out = read_jsonl(client, final.output_file_id)
    ids = [o["custom_id"] for o in out]
    assert sorted(ids) == sorted(line["custom_id"] for line in lines)
    assert len(ids) == len(set(ids)) == 300


def test_redis_stopped_mid_batch_pauses_batches_not_chat(
    workers: Workers, fresh_redis: RedisServer, gw_factory: list[GatewayProcess]
) -> None:
    url = start(gw_factory, settings(workers, fresh_redis.url))
    client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    lines = chat_lines(200, max_tokens=24)
    batch = client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    until_sync(
        lambda: client.batches.retrieve(batch.id).request_counts.completed >= 20,
        timeout=180,
        what="some lines done",
        every=0.2,
    )
    fresh_redis.stop()
    until_sync(
        lambda: httpx.get(url + "/readyz", timeout=10).json().get("redis") == "down",
        timeout=30,
        what="the gateway noticed Redis is down",
    )
    ready = httpx.get(url + "/readyz", timeout=10)
    assert ready.status_code == 200
    status = httpx.get(url + "/status", timeout=10).json()
    assert status["batches"]["redis"] == "down"
    assert "hearthgate_redis_up 0.0" in httpx.get(url + "/metrics", timeout=10).text
    for i in range(5):  # live traffic is served while Redis is away
        r = httpx.post(
            url + "/v1/chat/completions",
            json={
                "model": "tiny-llama",
                "messages": [{"role": "user", "content": f"hello {i}"}],
                "max_tokens": 4,
            },
            timeout=60,
        )
        assert r.status_code == 200, r.text
    r = httpx.get(url + f"/v1/batches/{batch.id}", timeout=10)
    assert r.status_code == 503
    assert "retry-after" in r.headers
    fresh_redis.start()
    final = wait_final(client, batch.id)
    assert final.status == "completed"
    assert final.request_counts.completed == 200
    ids = [o["custom_id"] for o in read_jsonl(client, final.output_file_id)]
    assert sorted(ids) == sorted(line["custom_id"] for line in lines)
