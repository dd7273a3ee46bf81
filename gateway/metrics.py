"""Prometheus metrics of one gateway instance, in a registry of its own.

Labels stay bounded: ``route`` is one of the gateway's routes, ``model`` one of the configured
models (anything else is counted as ``other``), ``status`` an HTTP status code, ``worker`` a
configured worker name.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hearthgate.policies.pacing import PacingState
from hearthgate.policies.scheduler import Scheduler

# No `*_created` series: in the text format each counter and histogram child would add a
# gauge of its creation time, which no dashboard here uses and every scrape pays for.
disable_created_metrics()  # type: ignore[no-untyped-call]

# Buckets cover a fast local GPU (ms) up to an overloaded CPU worker (tens of seconds).
_LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 60.0,
)  # fmt: skip
_GAP_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0,
    2.0,
)  # fmt: skip


class GatewayMetrics:
    """All metric families, plus a small window of recent latencies for ``/status``."""

    def __init__(
        self,
        models: Iterable[str],
        recent_window: int = 256,
        classes: Iterable[str] = (),
        apps: Iterable[str] = (),
    ) -> None:
        self.registry = CollectorRegistry()
        self._models = frozenset(models)
        self._classes = frozenset(classes)
        self._apps = frozenset(apps)
        r = self.registry
        self.requests = Counter(
            "hearthgate_requests",
            "Requests answered, by route, model and HTTP status",
            ["route", "model", "status"],
            registry=r,
        )
        self.ttft = Histogram(
            "hearthgate_ttft_seconds",
            "Time to first token measured at the gateway (request received to first token sent)",
            ["route", "model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inter_token = Histogram(
            "hearthgate_inter_token_seconds",
            "Gap between consecutive token events relayed to the client",
            ["route", "model"],
            buckets=_GAP_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "hearthgate_e2e_seconds",
            "Request received to last byte sent",
            ["route", "model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "hearthgate_prompt_tokens",
            "Prompt tokens of completed requests (from the worker's usage)",
            ["model"],
            registry=r,
        )
        self.completion_tokens = Counter(
            "hearthgate_completion_tokens",
            "Completion tokens of completed requests (from the worker's usage)",
            ["model"],
            registry=r,
        )
        self.in_flight = Gauge(
            "hearthgate_in_flight",
            "Requests forwarded to a worker and not yet finished",
            ["worker"],
            registry=r,
        )
        self.worker_up = Gauge(
            "hearthgate_worker_up",
            "1 if the worker's last health check passed, else 0",
            ["worker"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "hearthgate_queue_wait_seconds",
            "Time a request waited in its class queue before admission",
            ["cls"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.admitted = Counter(
            "hearthgate_admitted",
            "Requests admitted to a worker, by class and app",
            ["cls", "app"],
            registry=r,
        )
        self.rejected = Counter(
            "hearthgate_rejected",
            "Requests refused by the gateway, by class and reason",
            ["cls", "reason"],
            registry=r,
        )
        self.class_ttft = Histogram(
            "hearthgate_class_ttft_seconds",
            "Time to first token by request class (queue wait included)",
            ["cls"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.slo = Counter(
            "hearthgate_slo",
            "Finished streaming requests that met (or missed) their class targets; target is "
            "ttft, itl (mean gap between token events) or both",
            ["cls", "target", "result"],
            registry=r,
        )
        self.class_tokens = Counter(
            "hearthgate_tokens",
            "Tokens served, by class, app and kind (prompt or completion)",
            ["cls", "app", "kind"],
            registry=r,
        )
        # Embeddings coalescing (gateway/coalesce.py)
        self.coalesce_batch_size = Histogram(
            "hearthgate_coalesce_batch_size",
            "Embeddings requests answered by one upstream call",
            ["model"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
            registry=r,
        )
        self.coalesce_window = Histogram(
            "hearthgate_coalesce_window_seconds",
            "Time an admitted embeddings request waited in its batching window",
            ["cls"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0),
            registry=r,
        )
        self.coalesce_upstream_calls = Counter(
            "hearthgate_coalesce_upstream_calls",
            "Upstream embeddings calls made by the coalescer (retries of single members too)",
            ["model"],
            registry=r,
        )
        self.coalesce_saved = Counter(
            "hearthgate_coalesce_calls_saved",
            "Upstream calls saved: requests answered by a merged call, minus one per call",
            ["model"],
            registry=r,
        )
        self.loop_lag = Histogram(
            "hearthgate_event_loop_lag_seconds",
            "How late the gateway's event loop ran a timer (a busy or blocked loop delays "
            "every relayed token)",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=r,
        )
        self.batch_lines_finished = Counter(
            "hearthgate_batch_lines_finished",
            "Batch lines this gateway ran to an answer (completed: 2xx, failed: other); "
            "rate() gives lines per second",
            ["outcome"],
            registry=r,
        )
        self.batches_ended = Counter(
            "hearthgate_batches_ended",
            "Batches this gateway ended, by final status",
            ["status"],
            registry=r,
        )
        self.recent_ttft: dict[str, deque[float]] = {}
        self.recent_e2e: dict[str, deque[float]] = {}
        self._window = recent_window

    def add_labels(
        self, models: Iterable[str], classes: Iterable[str], apps: Iterable[str]
    ) -> None:
        """Names a settings reload added become label values of their own (names removed
        stay: their series keep counting what happened before)."""
        self._models |= frozenset(models)
        self._classes |= frozenset(classes)
        self._apps |= frozenset(apps)

    def model_label(self, model: str) -> str:
        return model if model in self._models else "other"

    def class_label(self, cls: str) -> str:
        return cls if cls in self._classes else "other"

    def app_label(self, app: str) -> str:
        return app if app in self._apps else "other"

    def observe_ttft(self, route: str, model: str, seconds: float) -> None:
        self.ttft.labels(route, self.model_label(model)).observe(seconds)
        self.recent_ttft.setdefault(route, deque(maxlen=self._window)).append(seconds)

    def observe_e2e(self, route: str, model: str, seconds: float) -> None:
        self.e2e.labels(route, self.model_label(model)).observe(seconds)
        self.recent_e2e.setdefault(route, deque(maxlen=self._window)).append(seconds)

    def observe_gaps(self, route: str, model: str, gaps: Iterable[float]) -> None:
        h = self.inter_token.labels(route, self.model_label(model))
        for g in gaps:
            h.observe(g)

    def count(self, route: str, model: str, status: int) -> None:
        self.requests.labels(route, self.model_label(model), str(status)).inc()

    def tokens(self, model: str, prompt: int, completion: int) -> None:
        label = self.model_label(model)
        if prompt:
            self.prompt_tokens.labels(label).inc(prompt)
        if completion:
            self.completion_tokens.labels(label).inc(completion)


def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of ``values``; None when empty."""
    data = sorted(values)
    if not data:
        return None
    rank = max(1, min(len(data), int(-(-q * len(data) // 100))))
    return data[rank - 1]


class SchedulerCollector(Collector):
    """Gauges read from the scheduler at scrape time: queues, tenant counters, budgets."""

    def __init__(
        self,
        scheduler: Scheduler,
        pacing: Callable[[], Mapping[str, PacingState]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._scheduler = scheduler
        self._pacing = pacing
        self._clock = clock  # the scheduler's clock (the admission controller's)

    def collect(self) -> Iterator[Metric]:
        s = self._scheduler
        depth = GaugeMetricFamily(
            "hearthgate_queue_depth", "Requests waiting in each class queue", labels=["cls"]
        )
        tokens = GaugeMetricFamily(
            "hearthgate_queued_tokens",
            "Prompt-token estimates waiting in each class queue",
            labels=["cls"],
        )
        for cls, st in s.queue_stats().items():
            depth.add_metric([cls], st.depth)
            tokens.add_metric([cls], st.tokens)
        vtc = GaugeMetricFamily(
            "hearthgate_tenant_counter",
            "Fair-share counter of each app in each class (weighted tokens served)",
            labels=["cls", "app"],
        )
        for cls, tenants in s.tenant_counters().items():
            for app, value in tenants.items():
                vtc.add_metric([cls, app], value)
        slots = GaugeMetricFamily(
            "hearthgate_worker_admitted",
            "Requests the scheduler admitted to each worker and not yet finished",
            labels=["worker"],
        )
        prefill = GaugeMetricFamily(
            "hearthgate_worker_prefill_tokens",
            "Prompt tokens admitted to each worker whose first token has not arrived",
            labels=["worker"],
        )
        for name, u in s.worker_usage().items():
            slots.add_metric([name], u.in_flight)
            prefill.add_metric([name], u.prefill_tokens)
        waits = CounterMetricFamily(
            "hearthgate_queue_blocked_seconds",
            "Seconds each class's oldest queued request waited, by the first limit that kept "
            "it off every worker: a budget (class_cap, saturated, slots, prefill, paced, "
            "app_paced), held (an earlier class blocked on a shared budget holds the "
            "workers), app_cap (every queued app at its max_in_flight) or no_worker",
            labels=["cls", "reason"],
        )
        for (cls, reason), seconds in sorted(s.queue_waits(self._clock()).items()):
            waits.add_metric([cls, reason], seconds)
        yield from (depth, tokens, vtc, slots, prefill, waits)
        if self._pacing is None:
            return
        cap = GaugeMetricFamily(
            "hearthgate_pacing_background_cap",
            "Background sequences decode pacing allows on each worker now",
            labels=["worker"],
        )
        app_cap = GaugeMetricFamily(
            "hearthgate_pacing_app_cap",
            "Interactive sequences decode pacing allows any one app on each worker now",
            labels=["worker"],
        )
        gap = GaugeMetricFamily(
            "hearthgate_pacing_token_gap_seconds",
            "Mean gap between streamed tokens on each worker in pacing's last interval "
            "(gaps no prefill overlapped, when prefill pacing is on)",
            labels=["worker"],
        )
        duty = GaugeMetricFamily(
            "hearthgate_pacing_prefill_duty",
            "Share of each worker's measured prefill speed background prompts may use now",
            labels=["worker"],
        )
        rate = GaugeMetricFamily(
            "hearthgate_pacing_prefill_rate",
            "Prompt tokens per second the gateway estimates each worker prefills (the "
            "speed the prefill duty is a share of)",
            labels=["worker"],
        )
        cuts = CounterMetricFamily(
            "hearthgate_pacing_cuts",
            "Intervals in which pacing cut each lever of each worker (at its floor too): "
            "lever background (cap), duty (prefill) or app (per-app cap); reason late (an "
            "interactive first token came late; counted so even when the gap was over too) "
            "or gap (mean token gap over its target)",
            labels=["worker", "lever", "reason"],
        )
        for name, state in self._pacing().items():
            for lever, reason, count in state.cut_counts():
                cuts.add_metric([name, lever, reason], count)
            cap.add_metric([name], state.background_cap)
            if state.prefill_duty is not None:
                duty.add_metric([name], state.prefill_duty)
            if state.prefill_rate is not None:
                rate.add_metric([name], state.prefill_rate)
            if state.app_cap is not None:
                app_cap.add_metric([name], state.app_cap)
            if state.token_gap_s is not None:
                gap.add_metric([name], state.token_gap_s)
        yield from (cap, app_cap, gap, duty, rate, cuts)


@dataclass(frozen=True)
class WorkerRow:
    """One worker as the worker collector exports it; None gauges are unknown (stale)."""

    name: str
    role: str
    waiting: float | None
    running: float | None
    kv_usage: float | None
    served: int
    failovers: int


class WorkerCollector(Collector):
    """Per-worker gauges read from the worker pool at scrape time: role, vLLM's scraped
    gauges while fresh (absent when unknown), requests forwarded, failovers."""

    def __init__(self, rows: Callable[[], Iterable[WorkerRow]]) -> None:
        self._rows = rows

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "hearthgate_worker_info",
            "Each configured worker and its role",
            labels=["worker", "role"],
        )
        waiting = GaugeMetricFamily(
            "hearthgate_worker_scraped_waiting",
            "vllm:num_requests_waiting last scraped from the worker (absent while unknown)",
            labels=["worker"],
        )
        running = GaugeMetricFamily(
            "hearthgate_worker_scraped_running",
            "vllm:num_requests_running last scraped from the worker (absent while unknown)",
            labels=["worker"],
        )
        kv = GaugeMetricFamily(
            "hearthgate_worker_kv_usage",
            "vllm:kv_cache_usage_perc (0..1) last scraped from the worker (absent while unknown)",
            labels=["worker"],
        )
        served = CounterMetricFamily(
            "hearthgate_worker_served",
            "Requests the gateway forwarded to the worker",
            labels=["worker"],
        )
        failovers = CounterMetricFamily(
            "hearthgate_worker_failovers",
            "Requests retried on another worker after this one failed before answering",
            labels=["worker"],
        )
        for r in self._rows():
            info.add_metric([r.name, r.role], 1)
            for family, value in ((waiting, r.waiting), (running, r.running), (kv, r.kv_usage)):
                if value is not None:
                    family.add_metric([r.name], value)
            served.add_metric([r.name], r.served)
            failovers.add_metric([r.name], r.failovers)
        yield from (info, waiting, running, kv, served, failovers)
