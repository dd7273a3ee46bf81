"""The embeddings numbers of the report (inputs per second, upstream calls), the sampler's
coalescer counters, and the shipped embeddings-coalescing scenario and targets."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from aiohttp import web

from hearthgate.gateway.settings import Settings
from hearthgate.loadtests.bench import scenario_block
from hearthgate.loadtests.fakeserver import serve
from hearthgate.loadtests.launcher import Launcher
from hearthgate.loadtests.markdown import render
from hearthgate.loadtests.records import RequestRecord, Sample
from hearthgate.loadtests.repeats import merge_runs
from hearthgate.loadtests.report import (
    UPSTREAM_CALLS,
    counter_increase,
    embeddings_summary,
    server_summary,
    summarize,
)
from hearthgate.loadtests.runner import Endpoints, RunResult, run_workload
from hearthgate.loadtests.sampler import gateway_values
from hearthgate.loadtests.scenario import Scenario, load_scenario, validate_scenario
from hearthgate.loadtests.targets import load_targets
from hearthgate.loadtests.workload import plan

CALLS = UPSTREAM_CALLS + '{model="minilm"}'


def emb(
    i: int,
    *,
    scheduled: float,
    end: float | None,
    outcome: str = "ok",
    sent: bool = True,
    warmup_s: float = 10.0,
) -> RequestRecord:
    r = RequestRecord(
        id=f"e{i}",
        target="t",
        flow="embed/notes",
        klass="embed",
        app="notes",
        endpoint="embeddings",
        stream=False,
        warmup=scheduled < warmup_s,
        scheduled_s=scheduled,
        prompt_tokens_requested=20,
        output_tokens_requested=None,
        sent_s=scheduled if sent else None,
        end_s=end,
        chunk_s=[end] if end is not None and outcome == "ok" else [],
        status={"ok": 200, "rejected": 429, "failed": 500}[outcome],
    )
    r.outcome = outcome  # type: ignore[assignment]
    return r


def chat(i: int, scheduled: float) -> RequestRecord:
    return RequestRecord(
        id=f"c{i}",
        target="t",
        flow="chat/chatui",
        klass="chat",
        app="chatui",
        endpoint="chat",
        stream=True,
        warmup=False,
        scheduled_s=scheduled,
        prompt_tokens_requested=20,
        output_tokens_requested=2,
        sent_s=scheduled,
        end_s=scheduled + 0.12,
        chunk_s=[scheduled + 0.1, scheduled + 0.12],
        outcome="ok",
    )


# Steady window [10, 20): 10 s.
RECORDS = [
    emb(0, scheduled=9.0, end=10.5),  # warm-up request, completed inside: counts
    emb(1, scheduled=11.0, end=11.2),
    emb(2, scheduled=12.0, end=13.0),
    emb(3, scheduled=15.0, end=15.4, outcome="failed"),  # failed: not completed
    emb(4, scheduled=16.0, end=None, outcome="rejected"),
    emb(5, scheduled=19.5, end=20.5),  # completes after the window: not counted
    emb(6, scheduled=19.9, end=None, outcome="failed", sent=False),  # never left
    emb(7, scheduled=5.0, end=9.5),  # completed before the window
    chat(0, 12.0),  # not an embedding
]


def gw(t: float, values: dict[str, float]) -> Sample:
    return Sample("t", "gateway", t, values)


def test_vllm_alone_counts_one_call_per_request_sent() -> None:
    samples = [Sample("t", "embed_worker", 0.0, {"vllm:num_requests_running": 1.0})]
    e = embeddings_summary(RECORDS, samples, duration_s=20.0, warmup_s=10.0)
    # Completed inside [10, 20): e0, e1, e2 -> 3 inputs over 10 s.
    assert e["inputs_per_s"] == 0.3
    # Scheduled inside the window: e1..e6 -> 6.
    assert e["inputs_offered_per_s"] == 0.6
    assert e["requests_sent"] == 7 and e["inputs_sent"] == 7
    assert e["upstream_calls"] == 7 and e["upstream_calls_from"] == "requests_sent"
    assert e["inputs_per_call"] == 1.0
    # e2e over measured completed embeddings: e1 (0.2), e2 (1.0), e5 (1.0).
    assert e["e2e_p50_s"] == pytest.approx(1.0)


def test_gateway_counts_the_coalescer_counter_increase() -> None:
    samples = [
        # Before the run the counter has no series yet (nothing merged so far): 0.
        gw(0.0, {'hearthgate_queue_depth{class="embed"}': 0.0}),
        gw(5.0, {CALLS: 1.0}),
        gw(21.0, {CALLS: 2.0, UPSTREAM_CALLS + '{model="other"}': 1.0}),
        Sample("t", "worker", 21.0, {"vllm:num_requests_running": 0.0}),
    ]
    e = embeddings_summary(RECORDS, samples, duration_s=20.0, warmup_s=10.0)
    assert e["upstream_calls"] == 3 and e["upstream_calls_from"] == "gateway_metrics"
    assert e["inputs_per_call"] == pytest.approx(7 / 3, abs=0.01)
    assert e["inputs_per_s"] == 0.3  # the same records give the same throughput


def test_counter_increase_from_first_to_last_sample() -> None:
    samples = [gw(2.0, {CALLS: 10.0}), gw(1.0, {CALLS: 4.0}), gw(3.0, {CALLS: 25.0})]
    assert counter_increase(samples, "gateway", UPSTREAM_CALLS) == 21.0  # by time, not order
    assert counter_increase(samples, "worker", UPSTREAM_CALLS) is None
    assert counter_increase([gw(0.0, {})], "gateway", UPSTREAM_CALLS) is None
    # A gateway without the counter (no coalescer): unknown, not zero.
    e = embeddings_summary(RECORDS, [gw(0.0, {})], duration_s=20.0, warmup_s=10.0)
    assert e["upstream_calls"] is None and e["inputs_per_call"] is None


def test_no_embeddings_at_all() -> None:
    e = embeddings_summary([chat(0, 12.0)], [], duration_s=20.0, warmup_s=10.0)
    assert e["inputs_per_s"] == 0.0 and e["upstream_calls"] == 0
    assert e["inputs_per_call"] is None and e["e2e_p50_s"] is None


def test_server_summary_shows_labelled_counter_increase() -> None:
    out = server_summary([gw(0.0, {CALLS: 2.0}), gw(1.0, {CALLS: 9.0})])
    assert out["gateway"][CALLS]["increase"] == 7.0


def test_gateway_values_keep_the_coalescer_counters() -> None:
    text = """\
# TYPE hearthgate_queue_depth gauge
hearthgate_queue_depth{class="embed"} 3.0
# HELP hearthgate_coalesce_upstream_calls_total Upstream embeddings calls
# TYPE hearthgate_coalesce_upstream_calls counter
hearthgate_coalesce_upstream_calls_total{model="minilm"} 12.0
hearthgate_coalesce_upstream_calls_created{model="minilm"} 1.7e9
# TYPE hearthgate_coalesce_calls_saved counter
hearthgate_coalesce_calls_saved_total{model="minilm"} 30.0
# TYPE hearthgate_requests counter
hearthgate_requests_total{outcome="ok"} 10.0
"""
    assert gateway_values(text) == {
        'hearthgate_queue_depth{class="embed"}': 3.0,
        'hearthgate_coalesce_upstream_calls_total{model="minilm"}': 12.0,
        'hearthgate_coalesce_calls_saved_total{model="minilm"}': 30.0,
    }


def test_merge_repeats_takes_embedding_medians() -> None:
    def run(att: float, ips: float, calls: int) -> dict[str, Any]:
        return {
            "run": {
                "requests": 10,
                "warmup_requests": 0,
                "completed": 10,
                "rejected": 0,
                "failed": 0,
                "drain_s": 1.0,
                "send_lag_max_s": 0.01,
            },
            "interactive": {
                "classes": ["chat"],
                "attainment": att,
                "goodput_rps": 1.0,
                "background_output_tokens_per_s": 0.0,
            },
            "classes": {
                "chat": {
                    "requests": 10,
                    "completed": 10,
                    "rejected": 0,
                    "failed": 0,
                    "good": int(10 * att),
                    "attainment": att,
                    "slo": {},
                },
            },
            "embeddings": {
                "inputs_per_s": ips,
                "upstream_calls": calls,
                "upstream_calls_from": "gateway_metrics",
            },
        }

    m = merge_runs([run(0.5, 40.0, 100), run(0.9, 44.0, 300), run(0.7, 50.0, 200)])
    assert m["embeddings"] == {
        "inputs_per_s": 44.0,
        "upstream_calls": 200.0,
        "upstream_calls_from": "gateway_metrics",
    }


# ---------------------------------------------------------------- through the runner

SCENARIO: dict[str, Any] = {
    "name": "unit-embed",
    "seed": 5,
    "duration_s": 1.0,
    "warmup_s": 0.2,
    "apps": {"chatui": {"key": "key-c"}, "notes": {"key": "key-n"}},
    "classes": {
        "chat": {"slo": {"ttft_s": 0.5, "itl_s": 0.05}, "interactive": True},
        "embed": {"slo": {"ttft_s": 2.0}},
    },
    "flows": [
        {
            "class": "chat",
            "app": "chatui",
            "endpoint": "chat",
            "prompt_tokens": 10,
            "output_tokens": 4,
            "arrival": {"process": "constant", "rate": 5},
        },
        {
            "class": "embed",
            "app": "notes",
            "endpoint": "embeddings",
            "prompt_tokens": 8,
            "arrival": {"process": "constant", "rate": 30},
        },
    ],
}


def _scenario(with_embeddings: bool = True) -> Scenario:
    data = copy.deepcopy(SCENARIO)
    if not with_embeddings:
        data["flows"] = data["flows"][:1]
        del data["classes"]["embed"]
    return validate_scenario(data)


async def test_run_through_a_gateway_counts_upstream_calls_exactly() -> None:
    """A stand-in gateway /metrics whose counter is the fake worker's embeddings calls; the
    sampler's last scrape (after the last response) makes the increase exact."""
    sc = _scenario()
    reqs = plan(sc)
    async with serve() as (url, state):

        async def metrics(request: web.Request) -> web.Response:
            n = sum(x["path"] == "/v1/embeddings" for x in state.received)
            lines = ["# TYPE hearthgate_coalesce_upstream_calls counter"]
            if n:  # a labelled counter has no series before its first increment
                lines.append(f'{UPSTREAM_CALLS}{{model="minilm"}} {n}')
            return web.Response(text="\n".join(lines) + "\n")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = getattr(site._server, "sockets", [])[0].getsockname()[1]
        try:
            target = Endpoints("gw", url, gateway_metrics=f"http://127.0.0.1:{port}/metrics")
            result = await run_workload(sc, reqs, target, sample_interval_s=10.0)
        finally:
            await runner.cleanup()
    n_emb = sum(r.endpoint == "embeddings" for r in reqs)
    assert n_emb == 30
    # First scrape before any request, last one after the last response.
    assert [s.source for s in result.samples] == ["gateway", "gateway"]
    s = summarize(result, sc)
    e = s["embeddings"]
    assert e["upstream_calls"] == n_emb and e["upstream_calls_from"] == "gateway_metrics"
    assert e["requests_sent"] == n_emb and e["inputs_per_call"] == 1.0
    offered = sum(0.2 <= r.scheduled_s < 1.0 for r in reqs if r.endpoint == "embeddings")
    assert e["inputs_offered_per_s"] == pytest.approx(offered / 0.8, abs=0.01)
    assert 0 < e["inputs_per_s"] <= 30 / 0.8


def _result(name: str, sc: Scenario, samples: list[Sample]) -> RunResult:
    t = [chat(0, 0.3), emb(1, scheduled=0.4, end=0.5, warmup_s=0.2)]
    return RunResult(name, sc.name, t, samples, "now", sc.duration_s, sc.warmup_s)


def test_markdown_embeddings_table_only_with_an_embeddings_flow() -> None:
    sc = _scenario()
    summary = {
        "scenario": scenario_block(sc, plan(sc)),
        "targets": {
            "vllm": summarize(_result("vllm", sc, []), sc),
            "gateway": summarize(_result("gateway", sc, [gw(0.0, {}), gw(1.0, {CALLS: 1.0})]), sc),
        },
    }
    md = render(summary)
    assert "### Embeddings" in md
    table = md.split("### Embeddings", 1)[1].split("\n\n", 2)[1].splitlines()
    assert table[0].startswith("| target | embedding inputs/s | offered inputs/s | upstream")
    # vllm: 1 input completed in the 0.8 s window, 1 call; gateway: 1 call from its counter.
    assert table[2] == "| vllm | 1.25 | 1.25 | 1 | 1 | 100 | 100 | 100% |"
    assert table[3] == "| gateway | 1.25 | 1.25 | 1 | 1 | 100 | 100 | 100% |"

    plain = _scenario(with_embeddings=False)
    summary = {
        "scenario": scenario_block(plain, plan(plain)),
        "targets": {"vllm": summarize(_result("vllm", plain, []), plain)},
    }
    assert "embeddings" not in summary["targets"]["vllm"]
    assert "### Embeddings" not in render(summary)


# ---------------------------------------------------------------- shipped files


def test_shipped_embed_backlog_scenario() -> None:
    sc = load_scenario("embed-backlog")
    assert (sc.duration_s, sc.warmup_s) == (40, 5)
    by_endpoint = {f.endpoint: f for f in sc.flows}
    assert set(by_endpoint) == {"chat", "embeddings"}
    assert sc.classes[by_endpoint["chat"].klass].interactive
    assert by_endpoint["chat"].streams and not by_endpoint["embeddings"].streams
    # Bursts above one CPU MiniLM worker's ~44 inputs/s.
    arrival = by_endpoint["embeddings"].arrival
    assert arrival.process == "onoff" and arrival.rate > 44
    reqs = plan(sc)
    # Every embeddings request carries one string (one input each).
    assert all(
        isinstance(r.body(send_priority=False)["input"], str)
        for r in reqs
        if r.endpoint == "embeddings"
    )


def test_shipped_embed_targets() -> None:
    tf = load_targets("embed")
    assert [t.name for t in tf.targets] == ["vllm", "gateway", "gateway-nocoalesce"]
    assert (tf.gen_worker.core, tf.embed_worker.core) == (1, 0)
    assert (tf.gateway_core, tf.client_core) == (0, 0)
    sc = load_scenario("embed-backlog")
    key_envs = {a.key_env for a in sc.apps.values()}
    la = Launcher(tf, need_embed=True, log=lambda m: None)
    settings = {
        t.name: Settings.model_validate(
            la.gateway_settings(t, "http://127.0.0.1:18210", "http://127.0.0.1:18211")
        )
        for t in tf.targets
        if t.kind == "gateway"
    }
    for s in settings.values():
        assert key_envs <= {a.key_env for a in s.apps}
        assert [w.role for w in s.workers] == ["general", "embeddings"]
    on, off = settings["gateway"], settings["gateway-nocoalesce"]
    # The two gateways differ only in the embed class's window.
    assert on.model_dump(exclude={"classes"}) == off.model_dump(exclude={"classes"})
    assert {c: v for c, v in on.classes.items() if c != "embed"} == {
        c: v for c, v in off.classes.items() if c != "embed"
    }
    assert on.classes["embed"].model_dump(exclude={"window"}) == off.classes["embed"].model_dump(
        exclude={"window"}
    )
    window = on.classes["embed"].batching_window()
    assert window.max_batch_size == 64 and window.max_wait_ms > 0  # the default window
    assert on.classes["embed"].window is None
    assert off.classes["embed"].batching_window().max_batch_size == 1
