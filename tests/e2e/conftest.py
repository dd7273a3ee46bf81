"""Real vLLM CPU workers, started once per test session, and a gateway in front of them.

The generation worker runs on core 0 and the embedding worker on core 1 (VLLM_CPU.md: two
instances must be pinned to different cores). Both start in parallel (about a minute).

Tests that stop one of these shared workers are marked ``stops_shared_workers`` and run
after every other test of the session (``pytest_collection_modifyitems`` below), whatever
their file names.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from hearthgate.deploy.vllm_worker import VllmWorker, start_all, stop_all
from tests.support import RUN_DIR, free_port, gateway

STOPS_SHARED_WORKERS = "stops_shared_workers"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move the tests marked ``stops_shared_workers`` to the end of the session (a stable
    sort: every other test keeps its place, and so do the marked ones among themselves)."""
    items.sort(key=lambda item: item.get_closest_marker(STOPS_SHARED_WORKERS) is not None)


@dataclass
class Workers:
    gen: VllmWorker
    embed: VllmWorker


@pytest.fixture(scope="session")
def workers() -> Iterator[Workers]:
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    gp, ep = free_port(), free_port()
    gen = VllmWorker("gen", gp, 0, RUN_DIR / f"vllm-gen-{gp}.log")
    emb = VllmWorker("embed", ep, 1, RUN_DIR / f"vllm-embed-{ep}.log")
    start_all([gen, emb], timeout=300)
    try:
        yield Workers(gen, emb)
    finally:
        stop_all([gen, emb])


@pytest.fixture(scope="session")
def gen_worker_url(workers: Workers) -> str:
    return workers.gen.url


@pytest.fixture(scope="session")
def embed_worker_url(workers: Workers) -> str:
    return workers.embed.url


def lasting(worker_url: str, body: dict[str, Any], seconds: float, most: int = 8) -> dict[str, Any]:
    """``body`` with as many sequences (``n``, doubled each try, at most ``most``: the
    gateway takes 8) as it takes for the worker to spend at least ``seconds`` on it,
    measured by sending it straight to the worker. The speed of these boxes varies 2-20x
    between hours (an AVX-512 box writes 3,500 tokens of one sequence in well under a
    second), so a test that needs a request still running when something else happens
    sizes it here."""
    n = 1
    while True:
        sized = {**body, "n": n, "stream": False}
        # A worker's first request of a shape is slow (3.5 s here for what then takes
        # 0.4 s): warm this one up on a few tokens, untimed.
        warm = httpx.post(
            worker_url + "/v1/completions", json={**sized, "max_tokens": 8}, timeout=300
        )
        assert warm.status_code == 200, warm.text
        start = time.perf_counter()
        r = httpx.post(worker_url + "/v1/completions", json=sized, timeout=300)
        took = time.perf_counter() - start
        assert r.status_code == 200, r.text
        if took >= seconds or n >= most:
            print(f"\n{n} sequence(s) of {body.get('max_tokens')} tokens: {took:.1f} s direct")
            return {**body, "n": n}
        n = min(most, n * 2)


def e2e_settings(workers: Workers) -> dict[str, Any]:
    """The shared gateway's settings: both workers, the built-in classes and rules."""
    return {
        "workers": [
            {"name": "gen0", "url": workers.gen.url, "models": ["tiny-llama"]},
            {"name": "emb0", "url": workers.embed.url, "models": ["minilm"], "role": "embeddings"},
        ],
        "limits": {"max_body_bytes": 200_000},
        "health": {"interval_s": 0.5, "retry_after_s": 2},
    }


@pytest.fixture(scope="session")
def gateway_url(workers: Workers) -> Iterator[str]:
    with gateway(e2e_settings(workers), name="e2e-gateway") as url:
        yield url
