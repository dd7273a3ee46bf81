"""Routing against real CPU vLLM workers: a general worker (core 0), a long-prefill worker
(core 1) and an embedding worker (sharing core 1, since this box has two), one gateway.

This module starts its own three workers (not the session fixtures of conftest.py) and
stops them when it ends. Its tests run in order and build on each other: the split, then
the long-prefill worker stopped and restarted, then the embedding worker stopped.

The long-prefill worker serves the model under another name (``tiny-llama-lp``), so every
request to it also checks that the gateway rewrites the logical name ``tiny-llama``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from hearthgate.deploy.vllm_worker import VllmWorker, start_all, stop_all
from tests.support import RUN_DIR, free_port, gateway, sse_events

pytestmark = pytest.mark.e2e

MODEL = "tiny-llama"
LONG_MIN_TOKENS = 400  # the gateway estimates characters / 4
SHORT = "What is for dinner tonight?"
LONG = " ".join(["The family calendar lists soccer practice, piano and dinner plans."] * 36)


@dataclass
class Rig:
    general: VllmWorker
    long: VllmWorker
    embed: VllmWorker
    url: str


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    gp, lp, ep = free_port(), free_port(), free_port()
    general = VllmWorker("gen", gp, 0, RUN_DIR / f"vllm-route-general-{gp}.log")
    long = VllmWorker("gen", lp, 1, RUN_DIR / f"vllm-route-long-{lp}.log")
    long.served_model_name = "tiny-llama-lp"
    # Two cores, three processes: the embedding worker shares the long-prefill worker's core,
    # so the general (interactive) worker keeps core 0 to itself.
    embed = VllmWorker("embed", ep, 1, RUN_DIR / f"vllm-route-embed-{ep}.log")
    workers = [general, long, embed]
    start_all(workers, timeout=420)
    settings = {
        "workers": [
            {"name": "general", "url": general.url, "models": [MODEL], "role": "general"},
            {
                "name": "long",
                "url": long.url,
                "models": [MODEL],
                "role": "long_prefill",
                "upstream_models": {MODEL: "tiny-llama-lp"},
                "limits": {"max_in_flight": 1},
            },
            {"name": "emb", "url": embed.url, "models": ["minilm"], "role": "embeddings"},
        ],
        "routing": {"long_prefill_min_tokens": LONG_MIN_TOKENS},
        "limits": {"max_body_bytes": 200_000},
        "health": {"interval_s": 0.5, "retry_after_s": 2},
    }
    try:
        with gateway(settings, name="e2e-routing") as url:
            yield Rig(general, long, embed, url)
    finally:
        stop_all(workers)


def completion(prompt: str, max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        **extra,
    }


def post(url: str, body: dict[str, Any], path: str = "/v1/completions") -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=180)


def successes(worker: VllmWorker) -> float:
    """The worker's own count of finished requests (vllm:request_success_total)."""
    text = httpx.get(worker.url + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total")
    )


def gateway_status(rig: Rig) -> dict[str, Any]:
    # A generous timeout: in CI three vLLM processes share two cores with the gateway, and
    # one clean-clone run saw a /status answer take more than httpx's default 5 s there.
    return httpx.get(rig.url + "/status", timeout=30).json()


def status(rig: Rig) -> dict[str, dict[str, Any]]:
    return {w["name"]: w for w in gateway_status(rig)["workers"]}


def wait_for(what: str, cond: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_long_prompts_go_to_the_long_prefill_worker_and_short_ones_to_the_general(
    rig: Rig,
) -> None:
    before = {"general": successes(rig.general), "long": successes(rig.long)}
    served_before = {n: w["served"] for n, w in status(rig).items()}
    for _ in range(3):
        r = post(rig.url, completion(SHORT))
        assert r.status_code == 200, r.text
        assert r.headers["x-hearthgate-worker"] == "general"
    for _ in range(2):
        r = post(rig.url, completion(LONG))
        assert r.status_code == 200, r.text
        assert r.headers["x-hearthgate-worker"] == "long"
        assert r.json()["model"] == MODEL  # the upstream's tiny-llama-lp, renamed back
    r = post(rig.url, completion(LONG, stream=True))
    assert r.status_code == 200 and r.headers["x-hearthgate-worker"] == "long"
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    assert {json.loads(e)["model"] for e in events[:-1]} == {MODEL}
    # Each worker's own counters agree with where the gateway says it sent them.
    assert successes(rig.general) - before["general"] == 3
    assert successes(rig.long) - before["long"] == 3
    served = {n: w["served"] - served_before[n] for n, w in status(rig).items()}
    assert served == {"general": 3, "long": 3, "emb": 0}
    # /metrics shows every worker's role, scraped gauges and the gateway's own counts.
    text = httpx.get(rig.url + "/metrics", timeout=10).text
    for name, role in (("general", "general"), ("long", "long_prefill"), ("emb", "embeddings")):
        assert f'hearthgate_worker_info{{role="{role}",worker="{name}"}} 1.0' in text
        assert f'hearthgate_in_flight{{worker="{name}"}}' in text
    assert 'hearthgate_worker_kv_usage{worker="long"}' in text
    assert 'hearthgate_worker_scraped_waiting{worker="general"}' in text


def test_requests_queued_for_a_stopped_worker_go_to_the_other(rig: Rig) -> None:
    # One long stream occupies the long-prefill worker (max_in_flight 1)...
    streaming = threading.Event()
    first: dict[str, Any] = {}

    def long_stream() -> None:
        # Long enough (about 15 s on a CPU worker) to still hold the worker while the
        # queued requests arrive, within the worker's 4096-token context.
        body = completion(LONG, max_tokens=3000, stream=True)
        with httpx.stream("POST", rig.url + "/v1/completions", json=body, timeout=180) as r:
            first["status"] = r.status_code
            first["worker"] = r.headers.get("x-hearthgate-worker")
            text = []
            for line in r.iter_lines():
                streaming.set()
                text.append(line)
            first["text"] = "\n".join(text)

    streamer = threading.Thread(target=long_stream)
    streamer.start()
    assert streaming.wait(60), "the long stream did not start"
    assert first["worker"] == "long"
    # ...so more long prompts queue at the gateway, waiting for it.
    results: list[httpx.Response] = []
    queued = [
        threading.Thread(target=lambda: results.append(post(rig.url, completion(LONG))))
        for _ in range(4)
    ]
    for t in queued:
        t.start()
    # On a loaded CPU box the busy worker's /health can time out so that the gateway marks
    # it down and sends the four to the general worker at once: no queue forms then, and
    # that path must show no error either.
    wait_for(
        "4 queued requests",
        lambda: gateway_status(rig)["queued"] >= 4 or len(results) == 4 or not streamer.is_alive(),
        60,
    )
    queued_behind = gateway_status(rig)["queued"] >= 4
    rig.long.stop()
    for t in queued:
        t.join(180)
    streamer.join(180)
    # None of the queued requests saw an error: they went to the general worker.
    assert [r.status_code for r in results] == [200] * 4, [r.text for r in results]
    placed = {r.headers["x-hearthgate-worker"] for r in results}
    assert placed == {"general"} if queued_behind else placed <= {"general", "long"}
    # The stream that was running on the stopped worker ended cleanly, whichever way.
    assert first["status"] == 200
    events = sse_events(first["text"])
    assert events[-1] == "[DONE]"
    for e in events[:-1]:
        obj = json.loads(e)
        assert "error" in obj or obj["choices"] is not None
    # Requests sent while it is down go to the general worker too.
    wait_for("long marked down", lambda: status(rig)["long"]["up"] is False, 10)
    for prompt in (LONG, SHORT):
        r = post(rig.url, completion(prompt))
        assert r.status_code == 200, r.text
        assert r.headers["x-hearthgate-worker"] == "general"


def test_a_restarted_worker_rejoins(rig: Rig) -> None:
    if rig.long.running:  # the previous test stops it; make this one stand on its own
        rig.long.stop()
        wait_for("long marked down", lambda: status(rig)["long"]["up"] is False, 10)
    rig.long.start()
    rig.long.wait_ready(timeout=300)
    wait_for("long back up", lambda: status(rig)["long"]["up"] is True, 10)
    r = post(rig.url, completion(LONG))
    assert r.status_code == 200, r.text
    assert r.headers["x-hearthgate-worker"] == "long"
    assert successes(rig.long) == 1  # a fresh process: this request is its first


def test_embeddings_worker_down_gives_503_while_chat_keeps_working(rig: Rig) -> None:
    body = {"model": "minilm", "input": ["pasta with tomato sauce"]}
    r = post(rig.url, body, "/v1/embeddings")
    assert r.status_code == 200, r.text
    assert r.headers["x-hearthgate-worker"] == "emb"
    assert len(r.json()["data"][0]["embedding"]) == 384
    rig.embed.stop()
    r = post(rig.url, body, "/v1/embeddings")
    assert r.status_code == 503
    assert int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["code"] == "no_worker_available"
    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": SHORT}],
        "max_tokens": 4,
        "ignore_eos": True,
    }
    r = post(rig.url, chat, "/v1/chat/completions")
    assert r.status_code == 200 and r.headers["x-hearthgate-worker"] == "general"
    r = post(rig.url, completion(LONG))
    assert r.status_code == 200 and r.headers["x-hearthgate-worker"] == "long"
    wait_for("emb marked down", lambda: status(rig)["emb"]["up"] is False, 10)
    assert httpx.get(rig.url + "/readyz", timeout=30).status_code == 200
