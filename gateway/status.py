"""``/status``: the gateway's state as JSON, rendered from the parts that hold it."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import Counter

from hearthgate.gateway.admission import AdmissionController
from hearthgate.gateway.lease import LeaseBook
from hearthgate.gateway.metrics import GatewayMetrics, percentile
from hearthgate.gateway.workers import WorkerPool
from hearthgate.policies.budgets import flooding_apps
from hearthgate.policies.scheduler import Scheduler


def render_status(
    *,
    scheduler: Scheduler,
    admission: AdmissionController,
    pool: WorkerPool,
    metrics: GatewayMetrics,
    leases: LeaseBook,
    now: float,
    started_at: float,
    draining: bool,
) -> dict[str, Any]:
    """Queues, leases, workers (with their budgets and pacing), fair-share counters, recent
    latency, targets met per class and tokens per app (what the status page shows, see
    gateway/dashboard.py). ``now`` is on the gateway's clock; ``started_at`` a wall-clock
    time."""
    recent: dict[str, Any] = {}
    for route, values in metrics.recent_ttft.items():
        recent.setdefault(route, {})["ttft_p50_s"] = percentile(values, 50)
        recent[route]["ttft_p99_s"] = percentile(values, 99)
        recent[route]["ttft_samples"] = len(values)
    for route, values in metrics.recent_e2e.items():
        recent.setdefault(route, {})["e2e_p50_s"] = percentile(values, 50)
        recent[route]["e2e_p99_s"] = percentile(values, 99)
    usage = scheduler.worker_usage()
    pacing = admission.pacing_state()
    flood_at = admission.flood_at
    workers = pool.status()
    for w in workers:
        u = usage.get(str(w["name"]))
        w["admitted"] = 0 if u is None else u.in_flight
        w["prefill_tokens"] = 0 if u is None else u.prefill_tokens
        w["flooding_apps"] = [] if u is None else flooding_apps(u, flood_at)
        # The prompt tokens per second the gateway takes the worker to prefill (its
        # estimate: what prefill pacing's duty is a share of).
        # (None for an embeddings worker: it prefills nothing a stream waits on.)
        embeds = w.get("role") == "embeddings"
        rate = admission.prefill_rates.rate(str(w["name"]))
        w["prefill_tokens_per_s"] = None if embeds else round(rate)
        paced = pacing.get(str(w["name"]))
        if paced is not None:
            gap = paced.token_gap_s
            w["pacing"] = {
                "background_cap": paced.background_cap,
                "app_cap": paced.app_cap,
                "token_gap_s": None if gap is None else round(gap, 4),
                # The gap the per-app cap holds now (it follows the worker's speed with
                # scheduler.pacing.app_gap_steps).
                "app_gap_s": None if paced.app_gap_s is None else round(paced.app_gap_s, 4),
                "prefill_duty": None
                if paced.prefill_duty is None
                else round(paced.prefill_duty, 2),
                # Times each lever was cut, by reason ("gap" / "late"): what holds it.
                "cuts": {f"{lever}_{reason}": n for lever, reason, n in paced.cut_counts()},
            }
    rule, per_app = admission.paced.rule, admission.paced.app_floor is not None
    # The gaps pacing holds (None: pacing off): what the caps above are moved against.
    gaps = None
    if rule is not None:
        gaps = {
            "decode_s": rule.target_gap_s,
            "prefill_s": rule.prefill_gap_s,
            "prefill_behind_s": rule.behind_gap_s,
            "app_s": rule.app_target_gap_s if per_app else None,
        }
    classes = scheduler.classes
    queues = {
        cls: {
            "priority": classes[cls].priority,
            "interactive": classes[cls].interactive,
            "ttft_target_s": classes[cls].ttft_s,
            "itl_target_s": classes[cls].itl_s,
            "admitted": sum(u.in_flight_by_class.get(cls, 0) for u in usage.values()),
            "depth": st.depth,
            "queued_tokens": st.tokens,
            "oldest_wait_s": None
            if st.oldest_arrival is None
            else round(now - st.oldest_arrival, 3),
            "dispatched_tokens": st.dispatched_tokens,
        }
        for cls, st in scheduler.queue_stats().items()
    }
    return {
        "uptime_s": round(time.time() - started_at, 1),
        "draining": draining,
        "in_flight": sum(w.in_flight for w in pool.workers),
        "queued": scheduler.queued_count,
        "admitted": scheduler.in_flight_count,
        "queued_bytes": admission.queued_bytes,
        "leases": leases.counts(),
        "queues": queues,
        "tenant_counters": scheduler.tenant_counters(),
        "workers": workers,
        "pacing_gaps": gaps,
        "recent": recent,
        # Since start, from the metrics: streamed requests that met both targets of their
        # class or missed one (the status page plots attainment from successive reads),
        # and tokens served per app.
        "slo": {
            cls: {"met": int(v.get("met", 0)), "missed": int(v.get("missed", 0))}
            for cls, v in _counter_totals(metrics.slo, "cls", "result", target="both").items()
        },
        "app_tokens": {
            app: {"prompt": int(v.get("prompt", 0)), "completion": int(v.get("completion", 0))}
            for app, v in _counter_totals(metrics.class_tokens, "app", "kind").items()
        },
    }


def _counter_totals(
    counter: Counter, outer: str, inner: str, **only: str
) -> dict[str, dict[str, float]]:
    """A labelled counter's values summed into ``outer`` label -> ``inner`` label -> total,
    over the samples whose labels match ``only``."""
    out: dict[str, dict[str, float]] = {}
    for family in counter.collect():
        for s in family.samples:
            labels = s.labels
            if not s.name.endswith("_total") or any(labels.get(k) != v for k, v in only.items()):
                continue
            row = out.setdefault(labels[outer], {})
            row[labels[inner]] = row.get(labels[inner], 0.0) + s.value
    return out
