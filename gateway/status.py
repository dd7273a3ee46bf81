"""``/status``: the gateway's state as JSON, rendered from the parts that hold it."""

from __future__ import annotations

import time
from typing import Any

from hearthgate.gateway.admission import AdmissionController
from hearthgate.gateway.lease import LeaseBook
from hearthgate.gateway.metrics import GatewayMetrics, percentile
from hearthgate.gateway.workers import WorkerPool
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
    """Queues, leases, workers (with their budgets and pacing), fair-share counters and
    recent latency. ``now`` is on the gateway's clock; ``started_at`` a wall-clock time."""
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
    workers = pool.status()
    for w in workers:
        u = usage.get(str(w["name"]))
        w["admitted"] = 0 if u is None else u.in_flight
        w["prefill_tokens"] = 0 if u is None else u.prefill_tokens
        paced = pacing.get(str(w["name"]))
        if paced is not None:
            cap, gap = paced
            w["pacing"] = {
                "background_cap": cap,
                "token_gap_s": None if gap is None else round(gap, 4),
            }
    queues = {
        cls: {
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
        "recent": recent,
    }
