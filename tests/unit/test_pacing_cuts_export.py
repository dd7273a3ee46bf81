"""Pacing's cuts, by lever and reason, as /metrics exports them and the bench reads them."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from hearthgate.gateway.metrics import SchedulerCollector
from hearthgate.loadtests.records import Sample
from hearthgate.loadtests.repeats import merge_gauges
from hearthgate.loadtests.report import steady_gauges
from hearthgate.loadtests.sampler import gateway_values
from hearthgate.policies import Scheduler
from hearthgate.policies.pacing import PacingCuts, PacingState
from tests.unit.test_policies_support import CLASSES

CUTS = "hearthgate_pacing_cuts_total"


def _scrape(states: dict[str, PacingState]) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(SchedulerCollector(Scheduler(CLASSES), lambda: states))
    text = generate_latest(registry).decode()
    assert f"# TYPE {CUTS} counter" in text  # a counter, not a gauge
    return gateway_values(text)


def test_metrics_export_each_levers_cuts_and_the_bench_keeps_them() -> None:
    cuts = PacingCuts(background_gap=2, duty_late=3, app_gap=1)
    got = _scrape(
        {
            "w0": PacingState(4, None, 0.01, 0.5, cuts, prefill_rate=9000.0),  # no per-app
            "w1": PacingState(8, 6, None, None, cuts),  # no prefill pacing
        }
    )

    def levers(worker: str) -> dict[tuple[str, str], float]:
        out = {}
        for key, value in got.items():
            if key.startswith(CUTS) and f'worker="{worker}"' in key:
                labels = dict(kv.split("=") for kv in key[len(CUTS) + 1 : -1].split(","))
                out[(labels["lever"].strip('"'), labels["reason"].strip('"'))] = value
        return out

    rate = "hearthgate_pacing_prefill_rate"
    assert got[f'{rate}{{worker="w0"}}'] == 9000.0
    assert not any(k.startswith(rate) and "w1" in k for k in got)  # no prefill pacing
    assert levers("w0") == {
        ("background", "gap"): 2.0,
        ("background", "late"): 0.0,
        ("duty", "gap"): 0.0,
        ("duty", "late"): 3.0,
    }
    assert levers("w1") == {
        ("background", "gap"): 2.0,
        ("background", "late"): 0.0,
        ("app", "gap"): 1.0,
    }


def test_cut_counts_over_the_steady_window_and_over_runs() -> None:
    late = f'{CUTS}{{worker="gen",lever="duty",reason="late"}}'
    gap = f'{CUTS}{{worker="gen",lever="duty",reason="gap"}}'
    duty = 'hearthgate_pacing_prefill_duty{worker="gen"}'

    def gw(t: float, values: dict[str, float]) -> Sample:
        return Sample("gw", "gateway", t, values)

    samples = [
        gw(0.0, {}),  # before the pacer existed: its series count 0
        gw(4.0, {late: 2.0, duty: 0.7}),  # the last scrape before the window
        gw(5.0, {late: 3.0, duty: 0.49}),
        gw(10.0, {late: 7.0, gap: 1.0, duty: 0.7}),
        gw(30.0, {late: 99.0, gap: 50.0}),  # after the window
    ]
    got = steady_gauges(samples, warmup_s=5.0, duration_s=20.0)
    assert got[late] == {"increase": 5.0}
    assert got[gap] == {"increase": 1.0}  # absent before the window: from 0
    assert got[duty]["mean"] == pytest.approx(0.595)
    merged = merge_gauges([got, {late: {"increase": 1.0}}, {}])
    assert merged[late] == {"increase": 3.0, "increase_runs": [5.0, 1.0, None]}
    assert set(merged[duty]) == {"mean", "p10", "p50", "p90", "mean_runs"}


def test_cut_counts_with_no_scrape_before_the_window_a_restart_or_a_series_gone() -> None:
    late = f'{CUTS}{{worker="gen",lever="duty",reason="late"}}'
    gap = f'{CUTS}{{worker="gen",lever="duty",reason="gap"}}'

    def gw(t: float, values: dict[str, float]) -> Sample:
        return Sample("gw", "gateway", t, values)

    # No warm-up: the run's first scrape (before any request) is the baseline, not 0, since
    # one gateway lives through many runs.
    got = steady_gauges([gw(0.1, {late: 40.0}), gw(5.0, {late: 42.0})], warmup_s=0, duration_s=9)
    assert got[late] == {"increase": 2.0}
    # A reload restarts the pacer: its series is gone for a while, then back from 0.
    samples = [
        gw(0.0, {late: 40.0, gap: 3.0}),
        gw(5.0, {late: 42.0, gap: 4.0}),
        gw(6.0, {gap: 4.0}),  # the late series gone
        gw(7.0, {late: 3.0}),  # back from 0; the gap series gone till the end
    ]
    got = steady_gauges(samples, warmup_s=1.0, duration_s=9.0)
    assert got[late] == {"increase": 5.0}  # 40 -> 42, then 0 -> 3
    assert got[gap] == {"increase": 1.0}  # what it counted while it was there
