"""Runs last in the session: stops the real embedding worker and checks what clients see."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.e2e.conftest import Workers

pytestmark = pytest.mark.e2e


def test_stopped_worker_gives_503_with_retry_after(workers: Workers, gateway_url: str) -> None:
    body = {"model": "minilm", "input": "hello"}
    assert httpx.post(gateway_url + "/v1/embeddings", json=body, timeout=60).status_code == 200
    workers.embed.stop()
    r = httpx.post(gateway_url + "/v1/embeddings", json=body, timeout=60)
    assert r.status_code == 503
    assert int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["code"] == "no_worker_available"
    # Chat on the other worker keeps working, and the gateway stays ready.
    chat = {"model": "tiny-llama", "prompt": "hi", "max_tokens": 2, "ignore_eos": True}
    assert httpx.post(gateway_url + "/v1/completions", json=chat, timeout=60).status_code == 200
    time.sleep(1.0)  # a health round later the worker is reported down
    status = httpx.get(gateway_url + "/status").json()
    assert {w["name"]: w["up"] for w in status["workers"]}["emb0"] is False
