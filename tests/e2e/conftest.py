"""Real vLLM CPU workers, started once per test session, and a gateway in front of them.

The generation worker runs on core 0 and the embedding worker on core 1 (VLLM_CPU.md: two
instances must be pinned to different cores). Both start in parallel (about a minute).

Tests that stop one of these shared workers are marked ``stops_shared_workers`` and run
after every other test of the session (``pytest_collection_modifyitems`` below), whatever
their file names.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

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
