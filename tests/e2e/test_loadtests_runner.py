"""The load generator against a real CPU vLLM worker: a ~10 s mixed scenario whose report
must account for every request and agree with what vLLM reports in `usage`.

Uses the session fixtures `gen_worker_url` and `embed_worker_url` (tests/e2e/conftest.py).
While developing, `LOADTESTS_GEN_URL` (and optionally `LOADTESTS_EMBED_URL`) point the test
at workers that are already running instead.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from hearthgate.loadtests.cli import main
from hearthgate.loadtests.records import read_records, read_samples
from hearthgate.loadtests.scenario import validate_scenario
from hearthgate.loadtests.workload import plan

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def urls(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    gen = os.environ.get("LOADTESTS_GEN_URL")
    if gen:
        return gen, os.environ.get("LOADTESTS_EMBED_URL")
    return request.getfixturevalue("gen_worker_url"), request.getfixturevalue("embed_worker_url")


def scenario(with_embeddings: bool) -> dict[str, Any]:
    flows: list[dict[str, Any]] = [
        {
            "class": "chat",
            "app": "chatui",
            "endpoint": "chat",
            "prompt_tokens": {"dist": "uniform", "min": 30, "max": 60},
            "output_tokens": 24,
            "arrival": {"process": "poisson", "rate": 2},
        },
        {
            "class": "rag",
            "app": "notes",
            "endpoint": "completions",
            "prompt_tokens": {"dist": "uniform", "min": 600, "max": 900},
            "output_tokens": 16,
            "arrival": {"process": "gamma", "rate": 1, "burstiness": 0.5},
        },
        {
            "class": "batch",
            "app": "nightly",
            "endpoint": "completions",
            "stream": False,
            "prompt_tokens": 200,
            "output_tokens": 32,
            "arrival": {"process": "constant", "rate": 0.3},
        },
    ]
    if with_embeddings:
        flows.append(
            {
                "class": "embed",
                "app": "notes",
                "endpoint": "embeddings",
                "prompt_tokens": {"dist": "uniform", "min": 10, "max": 30},
                "arrival": {"process": "onoff", "rate": 6, "on_s": 2, "off_s": 2},
            }
        )
    return {
        "name": "e2e-mix",
        "seed": 5,
        "duration_s": 10,
        "warmup_s": 2,
        "prime_requests": 1,
        "request_timeout_s": 60,
        "apps": {"chatui": {}, "notes": {}, "nightly": {}},
        "classes": {
            "chat": {"slo": {"ttft_s": 2.0, "itl_s": 0.5}, "interactive": True},
            "rag": {"slo": {"ttft_s": 5.0}},
            "batch": {},
            **({"embed": {"slo": {"ttft_s": 5.0}}} if with_embeddings else {}),
        },
        "flows": flows,
    }


def test_report_accounts_for_every_request(urls: tuple[str, str | None], tmp_path: Path) -> None:
    gen, embed = urls
    data = scenario(with_embeddings=embed is not None)
    path = tmp_path / "e2e-mix.yaml"
    path.write_text(yaml.safe_dump(data))
    args = [
        "run",
        str(path),
        "--url",
        gen,
        "--name",
        "vllm",
        "--out",
        str(tmp_path),
        "--worker-metrics",
        f"{gen}/metrics",
        "--no-progress",
        "--no-plots",
    ]
    if embed:
        args += ["--embed-url", embed, "--embed-metrics", f"{embed}/metrics"]
    assert main(args) == 0

    summary = json.loads((tmp_path / "e2e-mix.summary.json").read_text())
    raw = tmp_path / "raw" / "e2e-mix"
    records = read_records(raw / "vllm.records.jsonl")
    planned = plan(validate_scenario(data))

    # Every planned request appears exactly once, with one outcome.
    assert sorted(r.id for r in records) == sorted(p.id for p in planned)
    t = summary["targets"]["vllm"]
    run = t["run"]
    assert run["requests"] + run["warmup_requests"] == len(planned)
    assert run["requests"] == run["completed"] + run["rejected"] + run["failed"]
    assert sum(c["requests"] for c in t["classes"].values()) == run["requests"]
    for name, cs in t["classes"].items():
        assert cs["requests"] == cs["completed"] + cs["rejected"] + cs["failed"], name
        assert cs["good"] <= cs["completed"]
        assert cs["attainment"] == pytest.approx(cs["good"] / cs["requests"], abs=1e-4)
    # A lightly loaded worker completes everything.
    assert run["failed"] == 0 and run["rejected"] == 0, run["top_errors"]

    # Open loop: requests leave on their schedule, not after earlier answers (the unit test
    # test_open_loop_does_not_wait_for_completions checks that exactly, on a fake clock).
    # Here only a coarse bound on the median: on this shared 2-core box a starved generator
    # sent requests up to 1.4-2.2 s late, median 0.3 s (CI, 2026-12-02; the bench warns).
    lags = sorted(r.sent_s - r.scheduled_s for r in records if r.sent_s is not None)
    assert lags[len(lags) // 2] < 1.0, lags[len(lags) // 2 :]

    by_id = {p.id: p for p in planned}
    for r in records:
        p = by_id[r.id]
        assert r.sent_s is not None and r.end_s is not None and r.end_s >= r.sent_s
        assert r.sent_s >= r.scheduled_s - 0.01  # never before its time
        assert r.prompt_tokens is not None
        # Calibration against /tokenize (single-token words) makes prompt lengths near exact.
        assert abs(r.prompt_tokens - p.prompt_tokens) <= max(3, 0.03 * p.prompt_tokens), r.id
        if r.endpoint == "embeddings":
            continue
        n_out = p.output_tokens
        assert n_out is not None
        assert r.output_tokens == n_out  # ignore_eos makes the length exact
        assert r.chunk_s == sorted(r.chunk_s)
        assert r.ttft_s is not None and r.ttft_s > 0
        if r.stream:
            # A CPU-starved API server can flush a whole stream in one chunk: then there is no
            # gap to measure and TPOT is undefined; otherwise it is a non-negative time.
            if len(r.chunk_s) >= 2:
                assert r.tpot_s is not None and r.tpot_s >= 0
            # At most one chunk per token; fewer when vLLM merges the deltas of a request whose
            # stream fell behind (a starved API server), which `usage` still counts right.
            assert 1 <= len(r.chunk_s) <= n_out

    chat = t["classes"]["chat"]
    assert chat["ttft_p50_s"] <= chat["ttft_p99_s"]
    assert chat["output_tokens_per_s"] > 0

    samples = read_samples(raw / "vllm.samples.jsonl")
    worker = [s for s in samples if s.source == "worker"]
    # Every 0.5 s over >= 10 s would be 20; a starved sampler on this shared box has taken
    # 9 (CI, 2026-12-02), so only a coarse bound: it sampled all along, not once or twice.
    assert len(worker) >= 5
    # Each sample carries the worker's own gauges as numbers. Whether one of them caught a
    # request running is chance on a fast worker: this light mix keeps it busy a fraction of
    # the time, and in CI on 2026-12-05 no sample of a run did (the matrix's raw scrapes show
    # the gauges following load: tens of requests running at home-mix x4).
    for s in worker:
        for key in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            assert math.isfinite(s.values[key]) and s.values[key] >= 0, (key, s.values)
    assert (tmp_path / "e2e-mix.md").exists()
