"""Percentile, fairness, attainment and gauge-summary math on hand-computed cases."""

from __future__ import annotations

from typing import Any

import pytest

from hearthgate.loadtests import bench
from hearthgate.loadtests.bench import failures_line
from hearthgate.loadtests.client import queued_seconds
from hearthgate.loadtests.records import RequestRecord, Sample, classify_status
from hearthgate.loadtests.repeats import merge_gauges, merge_runs
from hearthgate.loadtests.report import (
    class_summary,
    fairness,
    meets_slo,
    steady_gauges,
    window_tokens,
)
from hearthgate.loadtests.runner import Endpoints, RunResult
from hearthgate.loadtests.scenario import Slo, load_scenario
from hearthgate.loadtests.stats import jain_index, max_min_fair, percentile
from hearthgate.loadtests.sweep import point_stats


def test_percentile_linear_interpolation() -> None:
    xs = [4.0, 1.0, 3.0, 2.0]
    assert percentile(xs, 0) == 1.0
    assert percentile(xs, 100) == 4.0
    assert percentile(xs, 50) == 2.5  # rank 1.5 between 2 and 3
    assert percentile(xs, 90) == pytest.approx(3.7)  # rank 2.7
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile(xs, 101)


def test_jain_index() -> None:
    assert jain_index([1, 1, 1, 1]) == 1.0
    assert jain_index([1, 0, 0, 0]) == 0.25
    assert jain_index([3, 1]) == pytest.approx(16 / (2 * 10))
    assert jain_index([0, 0]) == 1.0
    assert jain_index([]) is None


def test_max_min_fair() -> None:
    # capacity 10: the small demand (2) is met, the other two split the rest equally.
    assert max_min_fair(10, {"a": 2, "b": 100, "c": 100}) == pytest.approx({"a": 2, "b": 4, "c": 4})
    # weights 2:1 between two heavy apps.
    assert max_min_fair(9, {"a": 100, "b": 100}, {"a": 2}) == pytest.approx({"a": 6, "b": 3})
    # enough for everyone.
    assert max_min_fair(50, {"a": 5, "b": 7}) == pytest.approx({"a": 5, "b": 7})
    assert max_min_fair(5, {"a": 0, "b": 10}) == pytest.approx({"a": 0, "b": 5})


def test_classify_status() -> None:
    assert classify_status(200, None) == "ok"
    assert classify_status(429, "HTTP 429") == "rejected"
    assert classify_status(503, "HTTP 503") == "rejected"
    assert classify_status(500, "HTTP 500") == "failed"
    assert classify_status(200, "stream ended without [DONE]") == "failed"
    assert classify_status(None, "ClientConnectorError") == "failed"


def rec(
    i: int,
    *,
    sent: float = 10.0,
    chunks: list[float] | None = None,
    outcome: str = "ok",
    out: int | None = None,
    warmup: bool = False,
    app: str = "a",
    prompt: int = 100,
    stream: bool = True,
) -> RequestRecord:
    chunks = chunks if chunks is not None else []
    r = RequestRecord(
        id=f"r{i}",
        target="t",
        flow="chat/a",
        klass="chat",
        app=app,
        endpoint="chat",
        stream=stream,
        warmup=warmup,
        scheduled_s=sent,
        prompt_tokens_requested=prompt,
        output_tokens_requested=out if out is not None else len(chunks),
        sent_s=sent,
        end_s=(chunks[-1] if chunks else sent + 0.01),
        chunk_s=chunks,
        prompt_tokens=prompt if outcome == "ok" else None,
        output_tokens=(out if out is not None else len(chunks)) if outcome == "ok" else None,
        status={"ok": 200, "rejected": 429, "failed": 500}[outcome],
        error=None if outcome == "ok" else "x",
    )
    r.outcome = outcome  # type: ignore[assignment]
    return r


SLO = Slo(ttft_s=0.5, itl_s=0.05)


def test_timings_of_one_record() -> None:
    r = rec(0, sent=10.0, chunks=[10.2, 10.22, 10.26, 10.30])
    assert r.ttft_s == pytest.approx(0.2)
    assert r.gaps_s == pytest.approx([0.02, 0.04, 0.04])
    assert r.tpot_s == pytest.approx(0.1 / 3)
    assert r.max_gap_s == pytest.approx(0.04)
    assert r.e2e_s == pytest.approx(0.3)


def test_meets_slo_each_way() -> None:
    assert meets_slo(rec(0, chunks=[10.2, 10.22, 10.24]), SLO)
    assert not meets_slo(rec(1, chunks=[10.6, 10.62, 10.64]), SLO)  # TTFT 600 ms
    assert not meets_slo(rec(2, chunks=[10.2, 10.3, 10.4]), SLO)  # TPOT 100 ms
    assert not meets_slo(rec(3, outcome="rejected"), SLO)
    assert not meets_slo(rec(4, outcome="failed"), SLO)
    # Mean gap within target but one long stall: good by TPOT, a miss by max_gap.
    stall = rec(5, chunks=[10.1, 10.11, 10.12, 10.13, 10.14, 10.15, 10.16, 10.17, 10.18, 10.38])
    assert meets_slo(stall, SLO)
    assert not meets_slo(stall, Slo(ttft_s=0.5, itl_s=0.05, itl_stat="max_gap"))
    assert meets_slo(rec(6, chunks=[10.9]), Slo())  # no targets: completing is enough


def test_class_summary_counts_and_attainment() -> None:
    recs = [
        rec(0, chunks=[10.1, 10.12, 10.14]),  # good, TTFT 0.1
        rec(1, chunks=[10.3, 10.32, 10.34]),  # good, TTFT 0.3
        rec(2, chunks=[10.7, 10.72, 10.74]),  # completed, TTFT miss (0.7)
        rec(3, chunks=[10.2, 10.4, 10.6]),  # completed, TPOT miss (0.2)
        rec(7, chunks=[10.6, 10.8, 11.0]),  # completed, both missed
        rec(4, outcome="rejected"),
        rec(5, outcome="failed"),
        rec(6, chunks=[5.1, 5.2], sent=5.0, warmup=True),  # warm-up: not measured
    ]
    s = class_summary(recs, SLO, duration_s=20, warmup_s=6)
    assert (s["requests"], s["completed"], s["rejected"], s["failed"]) == (7, 5, 1, 1)
    assert s["requests"] == s["completed"] + s["rejected"] + s["failed"]
    assert s["good"] == 2
    assert (s["missed_ttft"], s["missed_itl"]) == (2, 2)  # the last completed one both ways
    assert s["attainment"] == pytest.approx(2 / 7, abs=1e-4)
    assert s["goodput_rps"] == pytest.approx(2 / 14, abs=1e-4)
    # TTFT over completed measured: 0.1, 0.2, 0.3, 0.6, 0.7 -> p50 = 0.3, p99 rank 3.96.
    assert s["ttft_p50_s"] == pytest.approx(0.3)
    assert s["ttft_p99_s"] == pytest.approx(0.6 + 0.96 * 0.1, abs=1e-4)
    # Output tokens inside [6, 20): 5 completed x 3 chunks; the warm-up one is outside.
    assert s["output_tokens_per_s"] == pytest.approx(15 / 14, abs=0.01)
    assert s["input_tokens_per_s"] == pytest.approx(500 / 14, abs=0.01)


def test_gateway_queue_splits_the_first_token_time() -> None:
    """Records that carry the gateway's queue wait report it, and the first token's time
    without it; records without the header (vLLM alone) leave both None."""
    waited = [rec(i, chunks=[10.0 + t, 10.02 + t]) for i, t in enumerate([0.1, 0.3, 0.5])]
    for r, q in zip(waited, [0.0, 0.2, 0.45], strict=True):
        r.queued_s = q
    s = class_summary(waited, SLO, duration_s=20, warmup_s=0)
    assert s["gateway_queue_p50_s"] == pytest.approx(0.2)
    assert s["worker_ttft_p50_s"] == pytest.approx(0.1)  # 0.1, 0.1, 0.05
    assert s["worker_ttft_p99_s"] == pytest.approx(0.1)
    plain = class_summary([rec(9, chunks=[10.1, 10.12])], SLO, duration_s=20, warmup_s=0)
    assert plain["gateway_queue_p50_s"] is None and plain["worker_ttft_p50_s"] is None


def test_queued_header_parsing() -> None:
    assert queued_seconds("250") == pytest.approx(0.25)
    assert queued_seconds("0") == 0.0
    assert queued_seconds(None) is None
    assert queued_seconds("soon") is None
    assert queued_seconds("-5") is None
    assert queued_seconds("nan") is None


def test_empty_class() -> None:
    s = class_summary([], SLO, duration_s=10, warmup_s=0)
    assert s["requests"] == 0 and s["attainment"] is None and s["ttft_p50_s"] is None


def test_window_tokens_spreads_usage_over_chunks() -> None:
    # usage says 6 tokens over 3 chunks: 2 per chunk; 2 chunks fall in the window.
    r = rec(0, chunks=[1.0, 2.0, 3.0], out=6, prompt=50)
    assert window_tokens([r], 1.5, 10) == (0.0, 4.0)
    assert window_tokens([r], 0, 10) == (50.0, 6.0)
    # A non-streamed response counts at its end.
    ns = rec(1, chunks=[4.0], out=128, stream=False)
    assert window_tokens([ns], 0, 10) == (100.0, 128.0)


def test_fairness_flooding_app_is_not_unfair() -> None:
    quiet = [rec(i, app="quiet", chunks=[10.0 + i, 10.5 + i], prompt=10) for i in range(5)]
    loud = [rec(100 + i, app="loud", chunks=[10.0, 10.1], prompt=10) for i in range(30)]
    loud += [rec(200 + i, app="loud", outcome="rejected", prompt=1000) for i in range(30)]
    f = fairness(quiet + loud, {"quiet": 1.0, "loud": 1.0}, duration_s=100, warmup_s=0)
    # quiet asked for little and got all of it; loud got the rest: max-min fair.
    assert f["jain_maxmin"] == pytest.approx(1.0)
    assert f["jain_service"] < 0.9
    assert f["apps"]["quiet"]["share"] + f["apps"]["loud"]["share"] == pytest.approx(1.0)


def _class_run(att: float, good: int, n: int, ttft: float) -> dict[str, Any]:
    return {
        "requests": n,
        "completed": n,
        "rejected": 0,
        "failed": 0,
        "good": good,
        "missed_ttft": n - good,
        "attainment": att,
        "ttft_p50_s": ttft,
        "ttft_p99_s": 2 * ttft,
        "slo": {},
    }


def test_merge_repeats_pools_counts_and_takes_medians() -> None:
    runs = [
        {
            "run": {
                "requests": 10,
                "warmup_requests": 1,
                "completed": 10,
                "rejected": 0,
                "failed": 0,
                "drain_s": d,
                "send_lag_max_s": 0.01,
            },
            "interactive": {
                "classes": ["chat"],
                "attainment": a,
                "goodput_rps": 1.0,
                "background_output_tokens_per_s": 5.0,
            },
            "classes": {"chat": _class_run(a, g, 10, t)},
        }
        for a, g, t, d in [(0.5, 5, 0.1, 1.0), (0.9, 9, 0.3, 2.0), (0.7, 7, 0.2, 3.0)]
    ]
    m = merge_runs(runs)
    chat = m["classes"]["chat"]
    assert chat["requests"] == 30 and chat["good"] == 21
    assert chat["missed_ttft"] == 9  # summed over the runs, as the counts are
    assert chat["attainment"] == pytest.approx(0.7)
    assert chat["attainment_runs"] == [0.5, 0.9, 0.7]
    assert (chat["attainment_min"], chat["attainment_max"]) == (0.5, 0.9)
    assert chat["ttft_p50_s"] == pytest.approx(0.2)
    assert chat["ttft_p99_s_runs"] == [0.2, 0.6, 0.4]  # each run's, beside the median
    assert m["run"]["requests"] == 30 and m["run"]["drain_s"] == 2.0
    assert m["repeats"] == 3
    assert m["interactive"]["attainment"] == pytest.approx(0.7)


def test_sweep_capacity_and_recommendation() -> None:
    from hearthgate.loadtests.sweep import capacity, recommend

    def pts(*atts: float | None) -> list[dict[str, Any]]:
        return [
            {"rate_scale": r, "interactive_attainment": a, "goodput_rps": 10 * r}
            for r, a in zip([0.5, 1.0, 1.5, 2.0], atts, strict=False)
        ]

    # Capacity stops at the first rate below the bar, even if a later one recovers (noise).
    assert capacity(pts(1.0, 0.95, 0.8, 0.92), 0.9) == 1.0
    assert capacity(pts(0.5, 1.0), 0.9) is None
    assert capacity(pts(0.99, 0.98, 0.97, 0.96), 0.9) == 2.0
    targets: dict[str, dict[str, Any]] = {
        "a": {"capacity_rate_scale": 1.0, "points": pts(1.0, 0.95)},
        "b": {"capacity_rate_scale": 1.5, "points": pts(1.0, 1.0, 0.91)},
        "c": {"capacity_rate_scale": None, "points": pts(0.2)},
    }
    assert recommend(targets) == "b"


def test_crosscheck_agreement() -> None:
    from hearthgate.loadtests.crosscheck import compare

    rounds = [
        {
            "hearthgate": {"median_ttft_ms": 100.0, "median_tpot_ms": 5.0},
            "vllm": {"median_ttft_ms": 95.0, "median_tpot_ms": 5.2},
        },
        {
            "hearthgate": {"median_ttft_ms": 110.0, "median_tpot_ms": 5.1},
            "vllm": {"median_ttft_ms": 105.0, "median_tpot_ms": 5.0},
        },
    ]
    out = compare(rounds, 0.10)
    assert out["median_ttft_ms"]["hearthgate"] == 105.0
    assert out["median_ttft_ms"]["relative_difference"] == pytest.approx(0.05)
    assert out["agree"] is True
    assert compare(rounds, 0.01)["agree"] is False


def test_apps_sharing_a_class_get_their_own_numbers_merged_over_runs() -> None:
    from dataclasses import replace as _replace

    from hearthgate.loadtests.bench import scenario_block
    from hearthgate.loadtests.markdown import render
    from hearthgate.loadtests.repeats import merge_runs
    from hearthgate.loadtests.report import summarize
    from hearthgate.loadtests.runner import RunResult
    from hearthgate.loadtests.scenario import load_scenario
    from hearthgate.loadtests.workload import plan

    sc = load_scenario("loadtests/scenarios/noisy-neighbour.yaml")
    light = [
        _replace(rec(i, chunks=[10.1, 10.11]), flow="chat/chatui", app="chatui") for i in (1, 2)
    ]
    heavy = [
        _replace(rec(i, chunks=[11.0, 11.01]), flow="chat/scraper", app="scraper")
        for i in (3, 4, 5)
    ]
    result = RunResult("t", sc.name, light + heavy, [], "now", 60.0, 0.0)
    s = summarize(result, sc)
    assert set(s["flows"]) == {"chat/chatui", "chat/scraper"}
    assert s["flows"]["chat/chatui"]["requests"] == 2
    assert s["flows"]["chat/chatui"]["ttft_p99_s"] == pytest.approx(0.1)
    assert s["flows"]["chat/scraper"]["attainment"] == 0.0  # 1 s to the first token
    merged = merge_runs([s, s])
    assert merged["flows"]["chat/chatui"]["requests"] == 4
    md = render({"scenario": scenario_block(sc, plan(sc)), "targets": {"a": merged, "b": s}})
    assert "### Per app, in classes several apps share" in md
    assert "| chat/chatui | TTFT p99 (ms) | 100 | 100 |" in md
    # One app per class: no per-flow block.
    solo = RunResult("t", sc.name, light, [], "now", 60.0, 0.0)
    assert "flows" not in summarize(solo, sc)


def test_failures_line_names_flows_and_the_first_error() -> None:
    ok = rec(0, chunks=[10.1, 10.12])
    shed = rec(1, outcome="rejected")
    broken = [rec(i, outcome="failed", app=a) for i, a in [(2, "b"), (3, "a"), (4, "b")]]
    for r in broken:
        r.flow = f"chat/{r.app}"
    assert failures_line("gw", [ok, shed]) is None  # shed requests are not failures
    assert failures_line("gw", [ok, shed, *broken]) == (
        "bench: gw: 3 requests failed (chat/a 1, chat/b 2), e.g. r2: x"
    )


def _gw(t: float, values: dict[str, float], source: str = "gateway") -> Sample:
    return Sample("gw", source, t, values)


def test_steady_gauges_keep_pacing_and_queues_inside_the_window() -> None:
    duty = 'hearthgate_pacing_prefill_duty{worker="gen"}'
    rag = 'hearthgate_queue_depth{cls="rag"}'
    samples = [
        _gw(1.0, {duty: 0.1, rag: 50.0}),  # warm-up: left out
        *(
            _gw(5.0 + i, {duty: 0.1 * (i + 1), rag: float(i), "hearthgate_in_flight": 3.0})
            for i in range(10)
        ),
        _gw(30.0, {duty: 0.0}),  # after the window: left out
        _gw(6.0, {duty: 9.0}, source="worker"),  # not the gateway's
    ]
    got = steady_gauges(samples, warmup_s=5.0, duration_s=20.0)
    assert set(got) == {duty, rag}  # other gauges stay under `server`
    assert got[duty]["mean"] == pytest.approx(0.55)
    assert got[duty]["p10"] == pytest.approx(0.19)
    assert got[duty]["p90"] == pytest.approx(0.91)
    assert got[rag]["p50"] == pytest.approx(4.5)
    assert steady_gauges(samples, warmup_s=40.0, duration_s=50.0) == {}


def test_merge_gauges_takes_medians_and_keeps_each_runs_mean() -> None:
    cap = 'hearthgate_pacing_background_cap{worker="gen"}'
    one = {"mean": 4.0, "p10": 1.0, "p50": 4.0, "p90": 8.0}
    two = {"mean": 6.0, "p10": 2.0, "p50": 5.0, "p90": 9.0}
    three = {"mean": 10.0, "p10": 3.0, "p50": 6.0, "p90": 20.0}
    got = merge_gauges([{cap: one}, {cap: three}, {cap: two}, {}])
    assert got[cap]["mean"] == 6.0
    assert got[cap]["p90"] == 9.0
    assert got[cap]["mean_runs"] == [4.0, 10.0, 6.0, None]
    assert merge_gauges([{}, {}]) == {}


def test_point_stats_carry_the_gateways_steady_gauges() -> None:
    sc = load_scenario("rag-burst")
    cap = 'hearthgate_pacing_background_cap{worker="gen"}'

    def outcome(caps: list[float], with_gateway: bool = True) -> bench.TargetOutcome:
        t0 = sc.warmup_s
        samples = [_gw(t0 + i, {cap: c}) for i, c in enumerate(caps)] if with_gateway else []
        result = RunResult("gw", sc.name, [], samples, "now", sc.duration_s, sc.warmup_s)
        return bench.TargetOutcome(Endpoints("gw", "http://127.0.0.1:1"), result)

    got = point_stats([outcome([2.0, 4.0]), outcome([8.0, 8.0]), outcome([1.0, 1.0])], sc)
    assert got["gateway_gauges"][cap]["mean"] == 3.0
    assert got["gateway_gauges"][cap]["mean_runs"] == [3.0, 8.0, 1.0]
    one = point_stats([outcome([], with_gateway=False)], sc)
    assert "gateway_gauges" not in one
    # each class keeps every run's attainment and TTFT p99 beside the pooled ones (none
    # measured here)
    for key in ("attainment_runs", "ttft_p99_s_runs"):
        assert {len(c[key]) for c in got["classes"].values()} == {3}
        assert {len(c[key]) for c in one["classes"].values()} == {1}
