"""Fuzz (issue 11), the small fixed-seed run: a few hundred generated requests per endpoint
through the gateway to the real vLLM workers. No 5xx made by the gateway itself, every 4xx
in OpenAI's error shape, every stream well-formed, nothing hangs.

The big run is a command: ``hearthgate bench fuzz --start --per-endpoint 10000 --seed 1``
(see ``loadtests/results/fuzz.md``).
"""

from __future__ import annotations

import pytest

from hearthgate.loadtests.fuzz import FuzzConfig, render_markdown, run

pytestmark = pytest.mark.e2e

PER_ENDPOINT = 300
SEED = 11
# tests/e2e/conftest.py: limits.max_body_bytes of the gateway, no API keys. No `seed`: the
# session's workers run vLLM's default flags (chunked prefill), and vLLM 0.32 on CPU kills its
# engine on a seeded request whose prefill is split, which would fail every later e2e test.
CONFIG = FuzzConfig(body_limit=200_000, send_seed=False)


@pytest.mark.parametrize(
    ("endpoint", "count"),
    [
        ("chat", PER_ENDPOINT),
        ("completions", PER_ENDPOINT),
        ("embeddings", PER_ENDPOINT),
        # Fewer: the same relay and checks as chat, in other shapes (issue 55).
        ("responses", PER_ENDPOINT // 2),
        ("messages", PER_ENDPOINT // 2),
    ],
)
def test_fuzz_endpoint(gateway_url: str, endpoint: str, count: int) -> None:
    tally = run(
        gateway_url,
        count,
        SEED,
        CONFIG,
        endpoints=[endpoint],
        concurrency=4,
        timeout_s=60.0,
    )
    assert tally.sent[endpoint] == count
    if tally.failed:
        report = render_markdown(tally, {"test": f"{endpoint}, seed {SEED}"}, SEED)
        pytest.fail(report[report.index("## Failures") :][:6000])
    # the run reached the worker, not only the gateway's own checks
    relayed = sum(n for (_, s, o), n in tally.counts.items() if o == "worker" and s == "200")
    assert relayed > count // 20
