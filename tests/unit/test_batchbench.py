"""The pure parts of `hearthgate bench batch` (loadtests/batchbench/): the batch's lines,
the rates, the aggregation over rounds, the report, and the polling loop on a fake client."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from hearthgate.gateway.batches.lines import check_batch, split_lines
from hearthgate.loadtests.batchbench.client import submit_and_poll
from hearthgate.loadtests.batchbench.lines import (
    batch_line,
    plan_lines,
    shape_from,
    split_counts,
    to_jsonl,
)
from hearthgate.loadtests.batchbench.rates import aggregate, done_at, lines_per_s, rate_in_window
from hearthgate.loadtests.batchbench.report import render
from hearthgate.loadtests.batchbench.rig import ORDER
from hearthgate.loadtests.prompts import Calibration
from hearthgate.loadtests.scenario import load_scenario

MODELS = ["tiny-llama", "minilm"]
BODY_LIMIT = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def home_mix() -> Any:
    return load_scenario("home-mix")


def test_split_counts() -> None:
    assert split_counts(5000, 0.2) == (1000, 4000)
    assert split_counts(300, 0.2) == (60, 240)
    assert split_counts(7, 0.0) == (0, 7)
    assert split_counts(7, 1.0) == (7, 0)
    with pytest.raises(ValueError):
        split_counts(0, 0.2)
    with pytest.raises(ValueError):
        split_counts(10, 1.5)


def test_shape_follows_the_scenarios_rag_and_embeddings_flows(home_mix: Any) -> None:
    shape = shape_from(home_mix, lines=100)
    assert shape.summary_prompt.upper() == 2000  # home-mix's RAG flow: uniform 1500-2000
    assert shape.embed_prompt.upper() == 64
    assert shape.endpoints() == ["/v1/chat/completions", "/v1/embeddings"]
    assert shape_from(home_mix, lines=5, summary_fraction=0).endpoints() == ["/v1/embeddings"]


def test_lines_counts_split_and_shapes(home_mix: Any) -> None:
    shape = shape_from(home_mix, lines=50, summary_fraction=0.2)
    lines = plan_lines(shape, home_mix, Calibration(), "r1-C")
    summaries, embeds = lines["/v1/chat/completions"], lines["/v1/embeddings"]
    assert (len(summaries), len(embeds)) == (10, 40)
    ids = [r.id for r in summaries + embeds]
    assert len(set(ids)) == 50
    for r in summaries:
        assert 1500 <= r.prompt_tokens <= 2000
        # default calibration: one word per token
        assert len(r.prompt.split()) == r.prompt_tokens
        body = batch_line(r)["body"]
        assert body["max_tokens"] == 32
        assert body["temperature"] == 0
        assert body["ignore_eos"] is True
        assert body["stream"] is False
        assert body["model"] == "tiny-llama"
    for r in embeds:
        assert 16 <= r.prompt_tokens <= 64
        assert batch_line(r)["body"] == {"model": "minilm", "input": r.prompt}


def test_each_measurement_has_its_own_words_and_the_same_lengths(home_mix: Any) -> None:
    shape = shape_from(home_mix, lines=20)
    a = plan_lines(shape, home_mix, Calibration(), "r1-C")
    b = plan_lines(shape, home_mix, Calibration(), "r1-D")
    again = plan_lines(shape, home_mix, Calibration(), "r1-C")
    for ep in a:
        assert [r.prompt_tokens for r in a[ep]] == [r.prompt_tokens for r in b[ep]]
        assert all(x.prompt != y.prompt for x, y in zip(a[ep], b[ep], strict=True))
        assert [r.prompt for r in a[ep]] == [r.prompt for r in again[ep]]


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_jsonl_is_accepted_by_the_gateways_batch_checks(home_mix: Any, endpoint: str) -> None:
    shape = shape_from(home_mix, lines=30, summary_fraction=0.3, summary_endpoint=endpoint)
    lines = plan_lines(shape, home_mix, Calibration(), "check")
    assert set(lines) == {
        f"/v1/{'chat/completions' if endpoint == 'chat' else 'completions'}",
        "/v1/embeddings",
    }
    for route, reqs in lines.items():
        data = to_jsonl(reqs)
        text_lines, trailing = split_lines(data, 100 * 1024 * 1024, 50_000)
        assert trailing
        checked = check_batch(text_lines, route, MODELS, BODY_LIMIT)
        assert [c.custom_id for c in checked] == [r.id for r in reqs]
        assert all(json.loads(line)["url"] == route for line in text_lines)


def test_lines_per_s() -> None:
    assert lines_per_s(300, 10.0, 40.0) == 10.0
    assert lines_per_s(300, 10.0, None) is None
    assert lines_per_s(300, 10.0, 10.0) is None


def test_done_at_interpolates_between_polls() -> None:
    polls = [(0.0, 0), (1.0, 10), (2.0, 30)]
    assert done_at(polls, -1.0) == 0
    assert done_at(polls, 0.5) == 5
    assert done_at(polls, 1.5) == 20
    assert done_at(polls, 9.0) == 30
    assert done_at([], 1.0) == 0


def test_rate_in_window_counts_only_while_the_batch_runs() -> None:
    polls = [(0.0, 0), (10.0, 100), (20.0, 200), (30.0, 300)]
    rate, cov = rate_in_window(polls, 5.0, 25.0)
    assert rate == pytest.approx(10.0)
    assert cov == 1.0
    # ended at 15 inside the window [5, 25]: counted to 15, half the window covered
    rate, cov = rate_in_window(polls, 5.0, 25.0, ended=15.0)
    assert rate == pytest.approx(10.0)
    assert cov == pytest.approx(0.5)
    assert rate_in_window(polls, 5.0, 25.0, ended=4.0) == (None, 0.0)


def _round(a: float, b: float, c: float, d: float, e: float) -> dict[str, Any]:
    return {
        "A": {"attainment": a},
        "B": {"attainment": b, "lines_per_s": e},
        "C": {"lines_per_s": c},
        "D": {"lines_per_s": d},
    }


def test_aggregate_medians_delta_ratio_and_targets() -> None:
    rounds = [
        _round(0.99, 0.985, 18.0, 20.0, 12.0),
        _round(0.97, 0.975, 19.0, 19.0, 14.0),
        _round(1.00, 0.99, 17.0, 21.0, 10.0),
    ]
    got = aggregate(rounds)
    assert got["A"]["median"] == pytest.approx(0.99)
    assert got["A"]["runs"] == [0.99, 0.97, 1.0]
    assert got["B"]["median"] == pytest.approx(0.985)
    assert got["C"]["median"] == 18.0
    assert got["D"]["median"] == 20.0
    assert got["E"]["median"] == 12.0
    assert got["B_minus_A"]["median"] == pytest.approx(-0.005)
    assert got["B_minus_A"]["runs"] == pytest.approx([-0.005, 0.005, -0.01])
    assert got["C_over_D"]["median"] == pytest.approx(0.9)
    assert got["C_over_D"]["runs"] == pytest.approx([0.9, 1.0, 17 / 21])
    assert got["E_over_C"]["median"] == pytest.approx(12 / 18)
    assert got["targets"] == {
        "attainment_within_1_point": True,
        "throughput_ratio_at_least_0.9": True,
    }


def test_aggregate_misses_and_failed_measurements() -> None:
    rounds = [_round(0.99, 0.95, 10.0, 20.0, 5.0), {"A": {"attainment": 0.98}, "C": {}}]
    got = aggregate(rounds)
    assert got["A"]["median"] == pytest.approx(0.985)
    assert got["B"]["runs"] == [0.95, None]
    assert got["B_minus_A"]["runs"][1] is None
    assert got["targets"] == {
        "attainment_within_1_point": False,
        "throughput_ratio_at_least_0.9": False,
    }
    empty = aggregate([{}])
    assert empty["targets"] == {
        "attainment_within_1_point": None,
        "throughput_ratio_at_least_0.9": None,
    }


def test_render_shows_the_results(home_mix: Any) -> None:
    rounds = [{"round": 1, **_round(0.99, 0.985, 18.0, 20.0, 12.0)}]
    shape = shape_from(home_mix, lines=300)
    summary = {
        "tag": "batch-small",
        "command": "hearthgate bench batch --lines 300",
        "wall_s": 123.0,
        "config": {
            "batch": shape.describe(),
            "endpoints": shape.endpoints(),
            "repeat": 1,
            "order": list(ORDER),
            "concurrency": 64,
            "poll_interval_s": 0.5,
            "batch_lead_s": 5.0,
        },
        "layout": [{"what": "gateway", "core": 0}],
        "vllm": {"gen": {"command": ["python", "-m", "vllm"], "env": "X=1"}},
        "gateway": {"settings": {"redis": {"url": "redis://x"}}},
        "rounds": rounds,
        "results": aggregate(rounds),
        "notes": ["a note"],
    }
    md = render(summary)
    assert "98.5%" in md and "-0.5" in md and "0.90" in md
    assert "| 1 | 99.0% | 98.5% | 18.0 |" in md
    assert "300 lines, 60 summaries" in md
    assert "- a note" in md


class FakeClient:
    """Batches that finish after a number of polls each, counting lines as they go."""

    def __init__(self, polls_to_finish: dict[str, int], sizes: dict[str, int]) -> None:
        self.left = dict(polls_to_finish)
        self.sizes = sizes
        self.created: list[str] = []
        self.seen = {ep: 0 for ep in polls_to_finish}

    async def create(self, file_id: str, endpoint: str) -> dict[str, Any]:
        self.created.append(endpoint)
        return {"id": f"batch-{endpoint}", "status": "validating"}

    async def get(self, bid: str) -> dict[str, Any]:
        ep = bid.removeprefix("batch-")
        self.seen[ep] += 1
        total = self.left[ep]
        done = min(self.seen[ep], total) * self.sizes[ep] // total
        status = "completed" if self.seen[ep] >= total else "in_progress"
        return {
            "id": bid,
            "status": status,
            "request_counts": {"total": self.sizes[ep], "completed": done, "failed": 0},
        }


def test_submit_and_poll_until_the_last_batch_completes() -> None:
    now = [0.0]

    def clock() -> float:
        now[0] += 0.25  # every clock read moves time on
        return now[0]

    fake = FakeClient({"chat": 2, "emb": 4}, {"chat": 10, "emb": 40})
    files = {"chat": ("f1", 10), "emb": ("f2", 40)}
    run = asyncio.run(
        submit_and_poll(fake, files, interval_s=0.0, clock=clock)  # type: ignore[arg-type]
    )
    assert fake.created == ["chat", "emb"]
    assert run.finished and run.all_completed()
    assert run.lines == 50
    assert run.polls[-1][1] == 50
    assert [d for _, d in run.polls_by["chat"]] == [5, 10, 10, 10]
    assert [d for _, d in run.polls_by["emb"]] == [10, 20, 30, 40]
    assert run.ended_s["chat"] < run.ended_s["emb"] == run.end_s
    per = run.per_batch()
    assert per["emb"]["completed"] == 40 and per["emb"]["status"] == "completed"
    assert lines_per_s(run.lines, run.created_s, run.end_s) == pytest.approx(
        50 / (run.ended_s["emb"] - run.created_s)
    )
