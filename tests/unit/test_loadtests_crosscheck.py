"""The crosscheck tool: the runner sends vLLM's workload (prompts and send times) as given."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import pytest

from hearthgate.loadtests import crosscheck
from hearthgate.loadtests.fakeserver import FakeConfig, serve_in_thread

ROWS: list[dict[str, Any]] = [
    {"prompt": "alpha beta gamma", "prompt_len": 3, "output_len": 5, "t": 0.05},
    {"prompt": "delta epsilon", "prompt_len": 2, "output_len": 4, "t": 0.1},
    {"prompt": "zeta eta theta iota", "prompt_len": 4, "output_len": 6, "t": 0.3},
]


def args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    crosscheck.add_args(parser)
    return parser.parse_args(["--url", "http://127.0.0.1:1", *extra])


def test_vllm_args_pin_the_workload() -> None:
    argv = crosscheck.vllm_args(args("--rate", "3", "--num-prompts", "50"), 1007)

    def value(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert value("--dataset-name") == "random"
    assert value("--random-range-ratio") == "0" and value("--random-prefix-len") == "0"
    assert value("--burstiness") == "1" and value("--request-rate") == "3.0"
    assert value("--num-prompts") == "50" and value("--seed") == "1007"
    assert "--ignore-eos" in argv and value("--temperature") == "0"


def test_planned_requests_keep_prompt_length_and_time() -> None:
    reqs = crosscheck.planned_requests(ROWS, "tiny-llama")
    assert [r.prompt for r in reqs] == [r["prompt"] for r in ROWS]
    assert [r.scheduled_s for r in reqs] == [0.05, 0.1, 0.3]
    body = reqs[2].body(send_priority=False)
    assert body["prompt"] == "zeta eta theta iota" and body["max_tokens"] == 6
    assert body["ignore_eos"] is True and body["stream"] is True
    assert body["temperature"] == 0 and body["model"] == "tiny-llama"


def test_send_lags_are_relative_to_the_least_late() -> None:
    lags = crosscheck.send_lags([100.5, 100.62, 101.0], [0.5, 0.6, 0.9])
    assert lags == pytest.approx([0.0, 0.02, 0.1])


def test_server_delta() -> None:
    before = {
        "vllm:time_to_first_token_seconds_sum": 1.0,
        "vllm:time_to_first_token_seconds_count": 10,
        "vllm:prefix_cache_hits_total": 0,
        "vllm:prefix_cache_queries_total": 1000,
    }
    after = {
        "vllm:time_to_first_token_seconds_sum": 4.0,
        "vllm:time_to_first_token_seconds_count": 110,
        "vllm:prefix_cache_hits_total": 128,
        "vllm:prefix_cache_queries_total": 3000,
    }
    got = crosscheck.server_delta(before, after)
    assert got == {"server_mean_ttft_ms": 30.0, "prefix_cache_hit_rate": 0.064}
    assert crosscheck.server_delta({}, {}) == {
        "server_mean_ttft_ms": None,
        "prefix_cache_hit_rate": None,
    }


def test_run_ours_sends_the_vllm_workload(monkeypatch: pytest.MonkeyPatch) -> None:
    seeds: list[int] = []

    def fake_workload(a: argparse.Namespace, seed: int, workdir: Path) -> list[dict[str, Any]]:
        seeds.append(seed)
        return ROWS

    monkeypatch.setattr(crosscheck, "vllm_workload", fake_workload)
    with serve_in_thread(FakeConfig(ttft_s=0.03, token_delay_s=0.002)) as (url, state):
        started = time.perf_counter()  # the fake stamps arrivals with perf_counter too
        got = crosscheck.run_ours(args("--url", url, "--num-prompts", "3"), 1004, Path("."))
    assert seeds == [1004]
    assert [x["body"]["prompt"] for x in state.received] == [r["prompt"] for r in ROWS]
    assert [x["body"]["max_tokens"] for x in state.received] == [5, 4, 6]
    # Send times 0, 0.05 and 0.25 s after the start: none can go early, a busy box may make
    # any late (so the gaps between them may shrink; the last one's offset may not).
    offsets = [t - started for t in state.arrivals]
    assert 0.25 <= offsets[-1] < 1.5
    assert offsets == sorted(offsets)
    assert got["completed"] == 3 and got["requests"] == 3 and got["seed"] == 1004
    assert got["median_ttft_ms"] is not None and 25 < got["median_ttft_ms"] < 1000
    assert got["server_mean_ttft_ms"] is None  # the fake has no TTFT histogram


def test_render_lists_every_run() -> None:
    rounds = [
        {
            "hearthgate": {"seed": 1000, "median_ttft_ms": 30.0, "median_tpot_ms": 4.0},
            "vllm": {"seed": 1001, "median_ttft_ms": 31.0, "median_tpot_ms": 4.1},
        }
    ]
    a = args("--rounds", "1")
    md = crosscheck.render(crosscheck.compare(rounds, a.tolerance), a)
    assert "the two agree" in md
    assert "| 1 | hearthgate | 1000 | 30.0 | 4.00 |" in md
    assert "| 1 | vllm | 1001 | 31.0 | 4.10 |" in md


@pytest.mark.parametrize(("env", "expected"), [("0", False), ("1", True)])
def test_vllm_bench_session_trust_env(
    monkeypatch: pytest.MonkeyPatch, env: str, expected: bool
) -> None:
    """vLLM's benchmark makes its session with trust_env=True (netrc and proxy look-ups in a
    thread pool inside its TTFT clock); the crosscheck turns that off unless asked."""
    import asyncio
    import sys
    import types

    import aiohttp

    seen: list[bool] = []

    def main(_: argparse.Namespace) -> None:
        async def go() -> None:
            session = aiohttp.ClientSession(trust_env=True)  # as vllm/benchmarks/serve.py
            seen.append(session.trust_env)
            await session.close()

        asyncio.run(go())

    serve = types.ModuleType("vllm.benchmarks.serve")
    serve.add_cli_args = lambda parser: None  # type: ignore[attr-defined]
    serve.main = main  # type: ignore[attr-defined]
    argparse_utils = types.ModuleType("vllm.utils.argparse_utils")
    argparse_utils.FlexibleArgumentParser = argparse.ArgumentParser  # type: ignore[attr-defined]
    for name, module in {
        "vllm": types.ModuleType("vllm"),
        "vllm.benchmarks": types.ModuleType("vllm.benchmarks"),
        "vllm.benchmarks.serve": serve,
        "vllm.utils": types.ModuleType("vllm.utils"),
        "vllm.utils.argparse_utils": argparse_utils,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(aiohttp, "ClientSession", aiohttp.ClientSession)  # restored after
    monkeypatch.setattr(sys, "argv", ["-c"])
    monkeypatch.setenv("HEARTHGATE_VLLM_TRUST_ENV", env)
    exec(crosscheck._VLLM_BENCH, {"__name__": "__main__"})
    assert seen == [expected]
