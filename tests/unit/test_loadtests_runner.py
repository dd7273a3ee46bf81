"""The open-loop runner, the client's timing and the sampler, against the in-process fake."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from hearthgate.loadtests.fakeserver import FakeConfig, serve
from hearthgate.loadtests.prompts import Calibration, EndpointCalibration
from hearthgate.loadtests.runner import Endpoints, run_workload
from hearthgate.loadtests.sampler import gateway_values, parse_prometheus, worker_values
from hearthgate.loadtests.scenario import Scenario, validate_scenario
from hearthgate.loadtests.workload import plan, priming_plan

SCENARIO: dict[str, Any] = {
    "name": "unit",
    "seed": 3,
    "duration_s": 1.0,
    "warmup_s": 0.2,
    "apps": {
        "a": {"key": "key-a"},
        "b": {"key": "key-b"},
        "c": {"key": "key-c"},
    },
    "classes": {
        "chat": {"slo": {"ttft_s": 0.5, "itl_s": 0.05}, "priority": -5, "interactive": True},
        "rag": {"priority": 5, "headers": {"X-Class": "rag"}},
        "embed": {},
    },
    "flows": [
        {
            "class": "chat",
            "app": "a",
            "endpoint": "chat",
            "prompt_tokens": 20,
            "output_tokens": 8,
            "arrival": {"process": "constant", "rate": 20},
        },
        {
            "class": "rag",
            "app": "b",
            "endpoint": "completions",
            "prompt_tokens": 50,
            "output_tokens": 4,
            "stream": False,
            "arrival": {"process": "constant", "rate": 5},
        },
        {
            "class": "embed",
            "app": "c",
            "endpoint": "embeddings",
            "prompt_tokens": 10,
            "arrival": {"process": "constant", "rate": 5},
        },
    ],
}


def scenario(**changes: Any) -> Scenario:
    data = copy.deepcopy(SCENARIO)
    data.update(changes)
    return validate_scenario(data)


def test_plan_is_deterministic_and_sorted() -> None:
    sc = scenario()
    a, b = plan(sc), plan(sc)
    assert a == b
    assert [r.scheduled_s for r in a] == sorted(r.scheduled_s for r in a)
    assert len([r for r in a if r.flow == "chat/a"]) == 19  # 0.05 .. 0.95
    assert all(r.warmup == (r.scheduled_s < 0.2) for r in a)
    other = plan(sc.with_overrides(seed=4))
    assert [r.prompt for r in other] != [r.prompt for r in a]


def test_prompt_length_follows_calibration() -> None:
    sc = scenario()
    cal = Calibration({"chat": EndpointCalibration(tokens_per_word=2.0, overhead_tokens=6)})
    chat = next(r for r in plan(sc, cal) if r.endpoint == "chat")
    assert len(chat.prompt.split()) == 7  # (20 - 6) / 2
    comp = next(r for r in plan(sc, cal) if r.endpoint == "completions")
    assert len(comp.prompt.split()) == 50  # default calibration: 1 token per word


def test_request_bodies() -> None:
    reqs = plan(scenario())
    chat = next(r for r in reqs if r.endpoint == "chat")
    body = chat.body(send_priority=False)
    assert body["messages"][0]["role"] == "user"
    assert body["max_tokens"] == 8 and body["ignore_eos"] is True and body["temperature"] == 0
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert "priority" not in body
    assert chat.body(send_priority=True)["priority"] == -5
    rag = next(r for r in reqs if r.endpoint == "completions")
    assert rag.body(send_priority=False)["stream"] is False
    assert "stream_options" not in rag.body(send_priority=False)
    emb = next(r for r in reqs if r.endpoint == "embeddings")
    assert emb.body(send_priority=True) == {"model": "minilm", "input": emb.prompt}


def test_priming_covers_every_flow_with_its_longest_shape() -> None:
    sc = scenario(prime_requests=2)
    prime = priming_plan(sc)
    assert len(prime) == 6
    assert {r.flow for r in prime} == {f.label for f in sc.flows}
    assert all(r.warmup for r in prime)


async def test_open_loop_does_not_wait_for_completions() -> None:
    # Every request takes 0.6 s to its first token; 19 chat requests arrive over 1 s.
    sc = scenario()
    async with serve(FakeConfig(ttft_s=0.6, token_delay_s=0.001)) as (url, state):
        result = await run_workload(sc, plan(sc), Endpoints("fake", url))
    lags = [r.send_lag_s for r in result.records]
    # The proof: many requests open at once (a closed loop would hold one). Waiting for
    # completions would also delay later sends by >= 0.6 s each; a loaded machine may delay
    # a send, never by that much.
    assert state.max_in_flight >= 10
    assert all(lag is not None and 0 <= lag < 0.6 for lag in lags)
    assert result.client_cpu_s is not None


async def test_records_of_a_clean_run() -> None:
    sc = scenario()
    reqs = plan(sc)
    async with serve(FakeConfig(ttft_s=0.05, token_delay_s=0.005)) as (url, state):
        result = await run_workload(
            sc, reqs, Endpoints("fake", url, send_priority=True, worker_metrics=url + "/metrics")
        )
    assert sorted(r.id for r in result.records) == sorted(r.id for r in reqs)
    by_id = {r.id: r for r in result.records}
    for req in reqs:
        rec = by_id[req.id]
        assert rec.outcome == "ok", rec.error
        assert rec.status == 200
        if req.endpoint == "chat":
            assert len(rec.chunk_s) == 8  # the role header is not a token
            assert rec.output_tokens == 8
            assert rec.prompt_tokens == 20 + 5  # fake: one per word + chat overhead
            assert rec.ttft_s is not None and 0.045 < rec.ttft_s < 2.0
            assert rec.tpot_s is not None and 0.004 < rec.tpot_s < 0.5
        elif req.endpoint == "completions":
            assert rec.chunk_s == [rec.end_s] and rec.output_tokens == 4
        else:
            assert rec.prompt_tokens == 12 and rec.output_tokens is None
    sent = {x["body"].get("messages", [{}])[0].get("content"): x for x in state.received}
    chat_req = next(r for r in reqs if r.endpoint == "chat")
    got = sent[chat_req.prompt]
    assert got["key"] == "key-a" and got["body"]["priority"] == -5
    assert any(
        x["path"] == "/v1/embeddings" and "priority" not in x["body"] for x in state.received
    )
    assert result.samples and result.samples[0].source == "worker"


async def test_rejections_failures_and_unreachable() -> None:
    sc = scenario().with_overrides(duration_s=0.5, warmup_s=0.1)
    cfg = FakeConfig(reject_keys=frozenset({"key-b", "key-c"}), fail_keys=frozenset({"key-a"}))
    async with serve(cfg) as (url, _):
        result = await run_workload(sc, plan(sc), Endpoints("fake", url))
    outcomes = {(r.klass, r.outcome) for r in result.records}
    assert outcomes == {("chat", "failed"), ("rag", "rejected"), ("embed", "rejected")}
    rag = next(r for r in result.records if r.klass == "rag")
    assert rag.status == 429 and rag.retry_after == "2" and "queue full" in (rag.error or "")
    chat = next(r for r in result.records if r.klass == "chat")
    assert chat.status == 500 and "boom" in (chat.error or "")

    short = sc.with_overrides(duration_s=0.3)
    down = await run_workload(short, plan(short), Endpoints("down", "http://127.0.0.1:9"))
    assert down.records and all(r.outcome == "failed" for r in down.records)
    assert all(r.status is None and r.error for r in down.records)


async def test_embeddings_go_to_embed_url() -> None:
    sc = scenario().with_overrides(duration_s=0.5, warmup_s=0.1)
    async with serve() as (gen, gen_state), serve() as (emb, emb_state):
        await run_workload(sc, plan(sc), Endpoints("split", gen, embed_url=emb))
    assert {x["path"] for x in emb_state.received} == {"/v1/embeddings"}
    assert "/v1/embeddings" not in {x["path"] for x in gen_state.received}


METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-llama"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny-llama"} 1.0
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="tiny-llama"} 7.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.25
# TYPE hearthgate_queue_depth gauge
hearthgate_queue_depth{class="chat"} 2.0
hearthgate_queue_depth{class="rag",note="a b}"} 5.0
# TYPE hearthgate_requests_total counter
hearthgate_requests_total{outcome="ok"} 10.0
# TYPE hearthgate_admitted_created gauge
hearthgate_admitted_created{app="chatui"} 1.7e9
garbage line
"""


def test_prometheus_parsing() -> None:
    types, samples = parse_prometheus(METRICS)
    assert types["vllm:num_requests_running"] == "gauge"
    assert len(samples) == 8
    assert worker_values(METRICS) == {
        "vllm:num_requests_running": 4.0,
        "vllm:num_preemptions_total": 7.0,
        "vllm:kv_cache_usage_perc": 0.25,
    }
    assert gateway_values(METRICS) == {
        'hearthgate_queue_depth{class="chat"}': 2.0,
        'hearthgate_queue_depth{class="rag",note="a b}"}': 5.0,
    }


@pytest.mark.parametrize("stream", [True, False])
async def test_usage_missing_falls_back_to_chunks(stream: bool) -> None:
    # A server that ignores include_usage: output tokens are counted from chunks.
    from hearthgate.loadtests.client import execute, new_record

    sc = scenario()
    req = next(r for r in plan(sc) if r.endpoint == "chat")
    body = req.body(send_priority=False)
    body.pop("stream_options")
    body["stream"] = stream
    import aiohttp

    async with serve() as (url, _), aiohttp.ClientSession() as session:
        rec = new_record(req, "t")
        rec.stream = stream
        await execute(session, rec, url=url + req.path, body=body, headers={}, timeout_s=5, t0=0.0)
    assert rec.outcome == "ok"
    if stream:
        assert rec.output_tokens is None and len(rec.chunk_s) == 8
        assert rec.tpot_s is not None
    else:
        assert rec.output_tokens == 8
