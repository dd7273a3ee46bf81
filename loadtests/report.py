"""Turn one run's records into the per-class goodput summary.

Definitions (the markdown report repeats them):

- *Measured* requests are those scheduled at or after `warmup_s`; each ends as exactly one of
  completed (2xx, full response), rejected (HTTP 429 or 503) or failed (anything else:
  other status, connection error, timeout, broken stream).
- A request is *good* when it completed and met its class's SLO: TTFT <= `ttft_s` (for a
  non-streamed request TTFT is the time to the whole response) and its inter-token statistic
  (`itl_stat`: tpot = mean gap after the first token, default; p99_gap; max_gap) <= `itl_s`.
  A missing target is met. Rejections and failures are misses; of the completed misses,
  `missed_ttft` counts those whose first token was late and `missed_itl` those whose stream
  was too slow (a request can be both).
- *attainment* = good / measured requests; *goodput_rps* = good / (duration_s - warmup_s).
- Latency percentiles are over completed measured requests; `itl_*` pools every inter-token
  gap of those requests, `max_gap_*` is over each request's largest gap.
- Token rates count tokens as they arrive (input tokens at the first token, output tokens
  spread over the token chunks, non-streamed ones at the end), from any request, inside the
  steady window [warmup_s, duration_s), divided by its length. `drain_s` is the time from the
  end of arrivals until the last request of the class finished.
- Fairness: an app's *service* is `w_in * input + w_out * output` tokens delivered in the
  steady window (1 and 2, as the gateway's VTC charges). `jain_service` is Jain's index over
  service / weight; `jain_maxmin` is Jain's index over service / (its weighted max-min fair
  share of the delivered total given each app's demand, the service its measured requests
  asked for). 1 is fair; a flooding app that gets less than it asks for is not unfair.
- Embeddings (when the scenario has an embeddings flow): *inputs_per_s* = embedding inputs
  of requests that completed inside the steady window, per second of it (any request, as for
  token rates); *upstream_calls* = embeddings calls that reached a worker during the run:
  through a gateway, the increase of `hearthgate_coalesce_upstream_calls_total` from the
  first gateway sample to the last; without one, the embeddings requests sent (one call
  each). *inputs_per_call* = inputs sent / upstream calls.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from hearthgate.loadtests.records import RequestRecord, Sample
from hearthgate.loadtests.runner import RunResult
from hearthgate.loadtests.sampler import PACING_CUTS, QUEUE_BLOCKED
from hearthgate.loadtests.scenario import Scenario, Slo
from hearthgate.loadtests.stats import jain_index, max_min_fair, mean, percentile

W_IN = 1.0
W_OUT = 2.0
UPSTREAM_CALLS = "hearthgate_coalesce_upstream_calls_total"
INPUTS_PER_REQUEST = 1  # the workload sends one string per embeddings request


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def itl_statistic(rec: RequestRecord, stat: str) -> float | None:
    if stat == "tpot":
        return rec.tpot_s
    gaps = rec.gaps_s
    if not gaps:
        return None
    if stat == "p99_gap":
        return percentile(gaps, 99)
    return max(gaps)


def late_first_token(rec: RequestRecord, slo: Slo) -> bool:
    """Completed, but its first token (the whole answer, unstreamed) came after the target."""
    ttft = rec.ttft_s
    return rec.outcome == "ok" and slo.ttft_s is not None and (ttft is None or ttft > slo.ttft_s)


def slow_stream(rec: RequestRecord, slo: Slo) -> bool:
    """Completed and streamed, but its tokens came slower than the inter-token target."""
    if rec.outcome != "ok" or slo.itl_s is None or not rec.stream:
        return False
    value = itl_statistic(rec, slo.itl_stat)
    return value is not None and value > slo.itl_s


def meets_slo(rec: RequestRecord, slo: Slo) -> bool:
    """Completed and within both targets (see the module docstring)."""
    return rec.outcome == "ok" and not late_first_token(rec, slo) and not slow_stream(rec, slo)


def _output_weight(rec: RequestRecord) -> float:
    """Output tokens represented by each token chunk."""
    if not rec.chunk_s:
        return 0.0
    if rec.output_tokens is not None:
        return rec.output_tokens / len(rec.chunk_s)
    return 1.0 if rec.stream else 0.0


def window_tokens(recs: Iterable[RequestRecord], lo: float, hi: float) -> tuple[float, float]:
    """(input, output) tokens that arrived within [lo, hi)."""
    tin = tout = 0.0
    for rec in recs:
        if not rec.chunk_s:
            continue
        if lo <= rec.chunk_s[0] < hi:
            tin += rec.prompt_tokens if rec.prompt_tokens is not None else 0
        w = _output_weight(rec)
        if w:
            tout += w * sum(1 for t in rec.chunk_s if lo <= t < hi)
    return tin, tout


def class_summary(
    recs: Sequence[RequestRecord], slo: Slo, *, duration_s: float, warmup_s: float
) -> dict[str, Any]:
    """The statistics of one class in one run (`recs` = all its records, warm-up included)."""
    measured = [r for r in recs if not r.warmup]
    ok = [r for r in measured if r.outcome == "ok"]
    good = [r for r in measured if meets_slo(r, slo)]
    steady = duration_s - warmup_s
    ttft = [t for r in ok if (t := r.ttft_s) is not None]
    queued = [q for r in ok if (q := r.queued_s) is not None]
    worker_ttft = [t for r in ok if (t := r.worker_ttft_s) is not None]
    e2e = [t for r in ok if (t := r.e2e_s) is not None]
    tpot = [t for r in ok if (t := r.tpot_s) is not None]
    gaps = [g for r in ok for g in r.gaps_s]
    max_gaps = [g for r in ok if (g := r.max_gap_s) is not None]
    tin, tout = window_tokens(recs, warmup_s, duration_s)
    ends = [r.end_s for r in recs if r.end_s is not None]
    n = len(measured)
    return {
        "requests": n,
        "completed": len(ok),
        "rejected": sum(r.outcome == "rejected" for r in measured),
        "failed": sum(r.outcome == "failed" for r in measured),
        "good": len(good),
        # Why completed requests missed: first token late, stream too slow (or both).
        "missed_ttft": sum(late_first_token(r, slo) for r in ok),
        "missed_itl": sum(slow_stream(r, slo) for r in ok),
        "attainment": _r(len(good) / n) if n else None,
        "goodput_rps": _r(len(good) / steady),
        "ttft_p50_s": _r(percentile(ttft, 50)),
        "ttft_p90_s": _r(percentile(ttft, 90)),
        "ttft_p99_s": _r(percentile(ttft, 99)),
        # Through a gateway: its queue wait, and the first token's time without it.
        "gateway_queue_p50_s": _r(percentile(queued, 50)),
        "gateway_queue_p99_s": _r(percentile(queued, 99)),
        "worker_ttft_p50_s": _r(percentile(worker_ttft, 50)),
        "worker_ttft_p99_s": _r(percentile(worker_ttft, 99)),
        "tpot_p50_s": _r(percentile(tpot, 50)),
        "tpot_p99_s": _r(percentile(tpot, 99)),
        "itl_p50_s": _r(percentile(gaps, 50)),
        "itl_p99_s": _r(percentile(gaps, 99)),
        "max_gap_p50_s": _r(percentile(max_gaps, 50)),
        "max_gap_p99_s": _r(percentile(max_gaps, 99)),
        "max_gap_max_s": _r(max(max_gaps) if max_gaps else None),
        "e2e_p50_s": _r(percentile(e2e, 50)),
        "e2e_p99_s": _r(percentile(e2e, 99)),
        "input_tokens_per_s": _r(tin / steady, 2),
        "output_tokens_per_s": _r(tout / steady, 2),
        "prompt_tokens_mean": _r(mean([float(r.prompt_tokens) for r in ok if r.prompt_tokens])),
        "output_tokens_mean": _r(mean([float(r.output_tokens) for r in ok if r.output_tokens])),
        "drain_s": _r(max(0.0, max(ends) - duration_s) if ends else None, 3),
        "slo": slo.model_dump(),
    }


def _service(recs: Iterable[RequestRecord], lo: float, hi: float) -> float:
    tin, tout = window_tokens(recs, lo, hi)
    return W_IN * tin + W_OUT * tout


def _demand(recs: Iterable[RequestRecord]) -> float:
    return sum(
        W_IN * r.prompt_tokens_requested + W_OUT * (r.output_tokens_requested or 0)
        for r in recs
        if not r.warmup
    )


def fairness(
    recs: Sequence[RequestRecord], weights: dict[str, float], *, duration_s: float, warmup_s: float
) -> dict[str, Any]:
    """Per-app service, share and the two Jain indices over `recs` (one class, or all)."""
    by_app: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in recs:
        by_app[r.app].append(r)
    service = {a: _service(rs, warmup_s, duration_s) for a, rs in by_app.items()}
    demand = {a: _demand(rs) for a, rs in by_app.items()}
    total = sum(service.values())
    fair = max_min_fair(total, demand, weights)
    apps = sorted(a for a in by_app if demand[a] > 0 or service[a] > 0)
    ratios = [service[a] / fair[a] for a in apps if fair[a] > 0]
    return {
        "jain_service": _r(jain_index([service[a] / weights.get(a, 1.0) for a in apps])),
        "jain_maxmin": _r(jain_index([min(x, 1.0) for x in ratios])) if ratios else None,
        "apps": {
            a: {
                "service": round(service[a], 1),
                "share": _r(service[a] / total) if total else None,
                "demand_share": _r(demand[a] / sum(demand.values())) if demand[a] else 0.0,
                "fair_share": _r(fair[a] / total) if total else None,
                "weight": weights.get(a, 1.0),
            }
            for a in apps
        },
    }


def server_summary(samples: Sequence[Sample]) -> dict[str, dict[str, dict[str, float]]]:
    """Per source and metric: mean, max and (for counters) the increase over the run."""
    series: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in sorted(samples, key=lambda s: s.t_s):
        for k, v in s.values.items():
            series[s.source][k].append(v)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for src, metrics in sorted(series.items()):
        out[src] = {}
        for k, vs in sorted(metrics.items()):
            row = {"mean": round(sum(vs) / len(vs), 4), "max": round(max(vs), 4)}
            if k.split("{", 1)[0].endswith("_total"):
                row["increase"] = round(vs[-1] - vs[0], 4)
            out[src][k] = row
    return out


# Gateway gauges whose course over the steady window the summary keeps (`gateway_gauges`):
# what pacing allowed each worker and what waited per class, to see why a cell came out as
# it did (the run-wide mean and max of every gauge are under `server`), and the counters
# whose increase over that window it keeps: why pacing cut what it cut, and what each
# class's oldest request waited for (seconds by limit).
STEADY_GAUGES: tuple[str, ...] = (
    "hearthgate_pacing_",
    "hearthgate_queue_depth",
    "hearthgate_worker_admitted",  # against the caps: is a cap what holds?
    "hearthgate_worker_prefill_tokens",  # against the prefill budget
)
STEADY_COUNTERS: tuple[str, ...] = (PACING_CUTS, QUEUE_BLOCKED)


def increase(values: Sequence[float]) -> float:
    """A counter's increase over consecutive readings, as Prometheus counts it: a drop is a
    restart from 0 (a pacer restarted by a reload), so the value after it is all new."""
    return sum(b - a if b >= a else b for a, b in itertools.pairwise(values))


def steady_gauges(
    samples: Sequence[Sample], *, warmup_s: float, duration_s: float
) -> dict[str, dict[str, float | None]]:
    """Per gateway gauge named in ``STEADY_GAUGES`` (keyed with its labels): its mean and
    10th, 50th and 90th percentiles over the scrapes inside the steady window; per counter
    in ``STEADY_COUNTERS``: its ``increase`` from the last scrape before the window (else the
    run's first scrape, taken before any request) to the last one inside it, a series not
    shown yet counting 0."""
    gw = sorted((s for s in samples if s.source == "gateway"), key=lambda s: s.t_s)
    inside = [s for s in gw if warmup_s <= s.t_s <= duration_s]
    if not inside:
        return {}
    before = [s for s in gw if s.t_s < warmup_s]
    start = (before[-1] if before else gw[0]).values
    gauges: dict[str, list[float]] = defaultdict(list)
    counters: dict[str, list[float]] = defaultdict(list)
    for s in inside:
        for k, v in s.values.items():
            if k.split("{", 1)[0] in STEADY_COUNTERS:
                counters[k].append(v)
            elif k.startswith(STEADY_GAUGES):
                gauges[k].append(v)
    out: dict[str, dict[str, float | None]] = {
        k: {
            "mean": _r(mean(vs)),
            "p10": _r(percentile(vs, 10)),
            "p50": _r(percentile(vs, 50)),
            "p90": _r(percentile(vs, 90)),
        }
        for k, vs in gauges.items()
    }
    for k, vs in counters.items():
        out[k] = {"increase": _r(increase([start.get(k, 0.0), *vs]))}
    return dict(sorted(out.items()))


def counter_increase(samples: Sequence[Sample], source: str, name: str) -> float | None:
    """The increase of counter `name` (summed over its label sets) from the first sample of
    `source` to its last; None when no sample of `source` holds it. A series missing from a
    sample counts 0 (a labelled counter shows up once it is first incremented)."""
    ss = sorted((s for s in samples if s.source == source), key=lambda s: s.t_s)

    def total(s: Sample) -> float:
        return sum(v for k, v in s.values.items() if k.split("{", 1)[0] == name)

    if not any(k.split("{", 1)[0] == name for s in ss for k in s.values):
        return None
    return increase([total(s) for s in ss])


def embeddings_summary(
    recs: Sequence[RequestRecord],
    samples: Sequence[Sample],
    *,
    duration_s: float,
    warmup_s: float,
) -> dict[str, Any]:
    """Embedding throughput and upstream calls of one run (see the module docstring)."""
    emb = [r for r in recs if r.endpoint == "embeddings"]
    steady = duration_s - warmup_s
    done = sum(
        r.outcome == "ok" and r.end_s is not None and warmup_s <= r.end_s < duration_s for r in emb
    )
    offered = sum(warmup_s <= r.scheduled_s < duration_s for r in emb)
    sent = sum(r.sent_s is not None for r in emb)
    calls: float | None
    if any(s.source == "gateway" for s in samples):
        calls, source = counter_increase(samples, "gateway", UPSTREAM_CALLS), "gateway_metrics"
    else:
        calls, source = float(sent), "requests_sent"
    measured_ok = [r for r in emb if not r.warmup and r.outcome == "ok"]
    e2e = [t for r in measured_ok if (t := r.e2e_s) is not None]
    return {
        "inputs_per_s": _r(done * INPUTS_PER_REQUEST / steady, 2),
        "inputs_offered_per_s": _r(offered * INPUTS_PER_REQUEST / steady, 2),
        "requests_sent": sent,
        "inputs_sent": sent * INPUTS_PER_REQUEST,
        "upstream_calls": None if calls is None else round(calls),
        "upstream_calls_from": source,
        "inputs_per_call": _r(sent * INPUTS_PER_REQUEST / calls, 2) if calls else None,
        "e2e_p50_s": _r(percentile(e2e, 50)),
        "e2e_p99_s": _r(percentile(e2e, 99)),
    }


def summarize(result: RunResult, scenario: Scenario) -> dict[str, Any]:
    """The summary of one target's run: run health, per-class stats, fairness, server side."""
    recs = result.records
    dur, warm = result.duration_s, result.warmup_s
    by_class: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in recs:
        by_class[r.klass].append(r)
    used = {f.klass for f in scenario.flows}
    classes = {
        c: class_summary(by_class.get(c, []), spec.slo, duration_s=dur, warmup_s=warm)
        for c, spec in scenario.classes.items()
        if c in used
    }
    weights = {a: spec.weight for a, spec in scenario.apps.items()}
    measured = [r for r in recs if not r.warmup]
    lags = [x for r in recs if (x := r.send_lag_s) is not None]
    ends = [r.end_s for r in recs if r.end_s is not None]
    interactive = [c for c in classes if scenario.classes[c].interactive]
    inter_n = sum(classes[c]["requests"] for c in interactive)
    inter_good = sum(classes[c]["good"] for c in interactive)
    background = [c for c in classes if c not in interactive]
    errors: dict[str, int] = defaultdict(int)
    for r in measured:
        if r.error:
            errors[r.error[:120]] += 1
    out: dict[str, Any] = {
        "run": {
            "started_at": result.started_at,
            "requests": len(measured),
            "warmup_requests": len(recs) - len(measured),
            "completed": sum(r.outcome == "ok" for r in measured),
            "rejected": sum(r.outcome == "rejected" for r in measured),
            "failed": sum(r.outcome == "failed" for r in measured),
            "steady_window_s": [warm, dur],
            "drain_s": _r(max(0.0, max(ends) - dur) if ends else None, 3),
            "send_lag_p99_s": _r(percentile(lags, 99)),
            "send_lag_max_s": _r(max(lags) if lags else None),
            "sampler_errors": result.sampler_errors,
            # The generator's own CPU use: near 1.0 means it, not the server, may be the limit.
            "client_cpu_share": _r(result.client_cpu_s / result.wall_s, 3)
            if result.client_cpu_s is not None and result.wall_s
            else None,
            "top_errors": dict(sorted(errors.items(), key=lambda kv: -kv[1])[:5]),
        },
        "interactive": {
            "classes": interactive,
            "attainment": _r(inter_good / inter_n) if inter_n else None,
            "background_output_tokens_per_s": round(
                sum(classes[c]["output_tokens_per_s"] or 0.0 for c in background), 2
            ),
            "goodput_rps": round(sum(classes[c]["goodput_rps"] or 0.0 for c in classes), 3),
        },
        "classes": classes,
        "fairness": {
            **{
                c: fairness(rs, weights, duration_s=dur, warmup_s=warm)
                for c, rs in sorted(by_class.items())
                if len({r.app for r in rs}) > 1
            },
            "all": fairness(recs, weights, duration_s=dur, warmup_s=warm),
        },
        "server": server_summary(result.samples),
    }
    gauges = steady_gauges(result.samples, warmup_s=warm, duration_s=dur)
    if gauges:
        out["gateway_gauges"] = gauges
    # Classes that several flows (apps) share: each flow's own numbers, under the class's SLO.
    by_flow: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in recs:
        by_flow[r.flow].append(r)
    shared = {c for c in classes if len({r.flow for r in by_class[c]}) > 1}
    flows = {
        f: class_summary(rs, scenario.classes[rs[0].klass].slo, duration_s=dur, warmup_s=warm)
        for f, rs in sorted(by_flow.items())
        if rs[0].klass in shared
    }
    if flows:
        out["flows"] = flows
    if any(f.endpoint == "embeddings" for f in scenario.flows):
        out["embeddings"] = embeddings_summary(recs, result.samples, duration_s=dur, warmup_s=warm)
    return out
