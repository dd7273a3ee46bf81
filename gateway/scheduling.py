"""Translating the settings into the pure scheduler's value types."""

from __future__ import annotations

from hearthgate.gateway.classify import ANONYMOUS
from hearthgate.gateway.settings import RequestClass, Settings, WorkerLimits
from hearthgate.policies.pacing import PacingRule
from hearthgate.policies.routing import RoutingPolicy, RoutingWeights
from hearthgate.policies.scheduler import Scheduler
from hearthgate.policies.types import ClassPolicy, TenantPolicy, WorkerBudget


def _ms(value: float | None) -> float | None:
    return None if value is None else value / 1000.0


def class_policy(name: str, c: RequestClass) -> ClassPolicy:
    return ClassPolicy(
        name=name,
        priority=c.priority,
        interactive=c.interactive,
        ttft_s=_ms(c.ttft_ms),
        itl_s=_ms(c.itl_ms),
        min_share=c.min_share,
        max_wait_s=_ms(c.max_wait_ms),
        max_queue=c.max_queue,
        max_queued_tokens=c.max_queued_tokens,
        queue_timeout_s=_ms(c.queue_timeout_ms),
        shed_late=c.shed_late,
        shed_after_wait_s=_ms(c.shed_after_wait_ms),
        shed_queued=c.shed_queued,
        ordering=c.ordering,
        fair_share=c.fair_share,
    )


def worker_budget(limits: WorkerLimits) -> WorkerBudget:
    return WorkerBudget(
        max_in_flight=limits.max_in_flight,
        max_in_flight_per_class=dict(limits.max_in_flight_per_class),
        prefill_token_budget=limits.prefill_token_budget,
        interactive_reserved_slots=limits.interactive_reserved_slots,
        interactive_reserved_prefill_tokens=limits.interactive_reserved_prefill_tokens,
        max_scraped_waiting=limits.max_scraped_waiting,
        max_kv_usage=limits.max_kv_usage,
    )


def build_scheduler(settings: Settings) -> Scheduler:
    return Scheduler(
        [class_policy(name, c) for name, c in settings.classes.items()],
        tenant_policies(settings),
        w_in=settings.scheduler.w_in,
        w_out=settings.scheduler.w_out,
        routing=routing_policy(settings),
    )


def tenant_policies(settings: Settings) -> list[TenantPolicy]:
    return [TenantPolicy(a.name, a.weight, a.max_in_flight) for a in settings.apps]


def routing_policy(settings: Settings) -> RoutingPolicy:
    r = settings.routing
    return RoutingPolicy(
        long_prefill_min_tokens=r.long_prefill_min_tokens,
        weights=RoutingWeights(r.weights.in_flight, r.weights.waiting, r.weights.kv),
        unknown_load=r.unknown_load,
    )


def pacing_rule(settings: Settings) -> PacingRule | None:
    """Decode pacing's rule, or None when it is off."""
    gap_ms = settings.pacing_gap_ms()
    if gap_ms is None:
        return None
    p = settings.scheduler.pacing
    prefill_ms = settings.prefill_gap_ms()
    behind_ms = settings.prefill_behind_gap_ms()
    app_ms = settings.app_pacing_gap_ms()
    return PacingRule(
        target_gap_s=gap_ms / 1000,
        interval_s=p.interval_ms / 1000,
        max_cap=p.max_cap,
        prefill_gap_s=None if prefill_ms is None else prefill_ms / 1000,
        flood_prefill=p.flood_prefill,
        flood_yields=p.flood_yields,
        flood_until_first_token=p.flood_until_first_token,
        background_prefill=p.background_prefill,
        behind_gap_s=None if behind_ms is None else behind_ms / 1000,
        late_cut_when_blind=p.late_cuts_decode_cap == "when_blind",
        proportional_growth=p.cap_growth == "proportional",
        app_gap_s=None if app_ms is None else app_ms / 1000,
        app_gap_steps=p.app_gap_steps,
    )


def app_pacing_floor(settings: Settings) -> int | None:
    """The per-app pacing cap's floor, or None when per-app pacing (or pacing) is off."""
    p = settings.scheduler.pacing
    if not p.per_app or settings.pacing_gap_ms() is None:
        return None
    return p.app_min_cap


def app_names(settings: Settings) -> list[str]:
    """Every app the metrics and the scheduler know, the anonymous one included."""
    return [a.name for a in settings.apps] + [ANONYMOUS]


def app_queue_caps(settings: Settings) -> dict[str, int]:
    return {a.name: a.max_queued for a in settings.apps if a.max_queued}


def embed_activity(scheduler: Scheduler, worker: str) -> tuple[int, bool]:
    """For the embeddings batching window: requests admitted to ``worker`` and not
    finished, and whether interactive work is queued or in its prefill on any worker (they
    share the machine's accelerator, so background batches make way for it)."""
    usage = scheduler.worker_usage()
    admitted = usage[worker].in_flight if worker in usage else 0
    interactive = any(u.interactive_prefill_tokens > 0 for u in usage.values())
    if not interactive:
        classes = scheduler.classes
        interactive = any(
            st.depth > 0 and classes[name].interactive
            for name, st in scheduler.queue_stats().items()
        )
    return admitted, interactive
