"""Stops the real embedding worker of the session and checks what clients see.

Marked ``stops_shared_workers``: tests/e2e/conftest.py runs it after every other test of
the session, since the session's workers and gateway are shared."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.conftest import Workers
from tests.inprocess import until_sync

pytestmark = [pytest.mark.e2e, pytest.mark.stops_shared_workers]


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

    def emb0_up() -> object:
        status = httpx.get(gateway_url + "/status", timeout=10).json()
        return {w["name"]: w["up"] for w in status["workers"]}["emb0"]

    # A health round (every 0.5 s) later the worker is reported down.
    until_sync(lambda: emb0_up() is False, timeout=10, what="emb0 reported down")
