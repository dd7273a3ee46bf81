"""The configured vLLM workers: health state, in-flight counts, and the health-check loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from hearthgate.gateway.metrics import GatewayMetrics, WorkerRow
from hearthgate.gateway.scheduling import worker_budget
from hearthgate.gateway.settings import Health, Worker
from hearthgate.gateway.upstream import UpstreamClient, WorkerUnreachable
from hearthgate.policies.types import WorkerSnapshot

log = logging.getLogger("hearthgate.workers")


@dataclass
class WorkerState:
    """Mutable run-time state of one worker; only the event loop thread touches it."""

    spec: Worker
    up: bool | None = None  # None until the first check
    in_flight: int = 0
    last_check: float | None = None
    last_error: str | None = None
    consecutive_failures: int = 0
    served: int = field(default=0)
    scraped_waiting: float | None = None  # None: unknown (never scraped, or stale)
    kv_usage: float | None = None
    scraped_running: float | None = None
    gauges: dict[str, float] = field(default_factory=dict)
    scraped_at: float | None = None
    failovers: int = 0  # requests moved to another worker after this one failed them
    consecutive_drops: int = 0  # connections dropped before an answer, in a row
    # Served model name -> its max_model_len, from the worker's /v1/models once it is up
    # (None: not read since it last came up). Clients read it from the gateway's list.
    model_lens: dict[str, int] | None = None

    @property
    def name(self) -> str:
        return self.spec.name


_GAUGES = {
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions",
}


# Histograms whose sums give the per-request prefill speed of finished requests, streamed
# or not (the gateway sees first tokens of streams only).
PROMPT_SUM = "vllm:request_prompt_tokens_sum"
PREFILL_SUM = "vllm:request_prefill_time_seconds_sum"
_SUMS = {"vllm:request_prompt_tokens", "vllm:request_prefill_time_seconds"}

_PREFIXES = tuple(sorted(_GAUGES | _SUMS))
_GAUGE_IN = re.compile(
    r"^# (?:HELP|TYPE) (?:" + "|".join(map(re.escape, _GAUGES | _SUMS)) + r")[ _]"
)


def parse_vllm_gauges(text: str) -> dict[str, float]:
    """The vLLM gauges the scheduler uses, summed over engines, from a /metrics page.
    Raises ValueError for a page the Prometheus parser cannot read."""
    # vLLM's page is mostly histograms; hand the library parser only the lines it needs.
    wanted = "\n".join(
        line
        for line in text.splitlines()
        if line.startswith(_PREFIXES) or (line.startswith("# ") and _GAUGE_IN.search(line))
    )
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(wanted):
        if family.name in _SUMS:
            for sample in family.samples:
                if sample.name == family.name + "_sum":
                    out[sample.name] = out.get(sample.name, 0.0) + sample.value
            continue
        if family.name not in _GAUGES:
            continue
        for sample in family.samples:
            if sample.name in (family.name, family.name + "_total"):
                key = family.name if family.type != "counter" else family.name + "_total"
                out[key] = out.get(key, 0.0) + sample.value
    return out


class WorkerPool:
    """Tracks each worker's health and picks one for a model.

    A failed connection marks a worker down at once (passive detection); the periodic
    ``/health`` check brings it back.
    """

    def __init__(
        self,
        workers: list[Worker],
        health: Health,
        metrics: GatewayMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.workers = [WorkerState(w) for w in workers]
        self.by_name = {w.name: w for w in self.workers}
        self._budgets = {w.name: worker_budget(w.limits) for w in workers}
        self.on_change: Callable[[], None] | None = None  # health changed: re-run admission
        # A worker went down: cut the requests on it (they fail over or end with an error).
        self.on_down: Callable[[WorkerState, str], None] | None = None
        # Prompt tokens and the prefill seconds they took, of the requests a worker finished
        # since the last scrape (from its vLLM histograms): feeds the prefill speed estimate.
        self.on_prefill: Callable[[str, int, float], None] | None = None
        self._health = health
        self._metrics = metrics
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        # Workers a reload removed: an admission decided just before still reaches them.
        self._retired: dict[str, WorkerState] = {}
        for w in self.workers:
            metrics.in_flight.labels(w.name).set(0)
            metrics.worker_up.labels(w.name).set(0)

    def reconfigure(self, workers: list[Worker], health: Health) -> list[WorkerState]:
        """New settings (a reload). A worker keeps its state (health, counts) when its name
        stays; a new one starts unchecked; a removed one takes no more requests, those in
        flight on it finish. Returns the workers to check at once: new ones and those whose
        address changed."""
        fresh: list[WorkerState] = []
        states: list[WorkerState] = []
        for spec in workers:
            st = self.by_name.get(spec.name)
            if st is None or st.spec.url != spec.url:
                st = WorkerState(spec)  # requests on the old address release the old state
                fresh.append(st)
                self._metrics.in_flight.labels(st.name).set(st.in_flight)
                self._metrics.worker_up.labels(st.name).set(0)
            else:
                st.spec = spec
            states.append(st)
        names = {w.name for w in workers}
        for gone in self.workers:
            if gone.name not in names:
                log.info("worker %s removed from the settings", gone.name)
                self._retired[gone.name] = gone
                with contextlib.suppress(KeyError):
                    self._metrics.worker_up.remove(gone.name)
        for name in names:
            self._retired.pop(name, None)
        self.workers = states
        self.by_name = {w.name: w for w in states}
        self._budgets = {w.name: worker_budget(w.limits) for w in workers}
        self._health = health
        return fresh

    def state(self, name: str) -> WorkerState:
        """The worker called ``name``, also if a reload removed it since (KeyError if it
        never was one)."""
        found = self.by_name.get(name)
        return found if found is not None else self._retired[name]

    def any_up(self, names: Collection[str]) -> bool:
        """Whether one of these configured workers is not known to be down."""
        return any(w.up is not False for n in names if (w := self.by_name.get(n)) is not None)

    def for_model(self, model: str) -> list[WorkerState]:
        return [w for w in self.workers if model in w.spec.models]

    def pick(self, model: str, exclude: Collection[str] = ()) -> WorkerState | None:
        """The least-loaded worker serving ``model`` that is not known to be down."""
        candidates = [
            w for w in self.for_model(model) if w.up is not False and w.name not in exclude
        ]
        if not candidates:
            return None
        return min(candidates, key=lambda w: (w.in_flight, w.name))

    def snapshots(self) -> list[WorkerSnapshot]:
        """What the scheduler needs to know of each worker now."""
        return [
            WorkerSnapshot(
                name=w.name,
                healthy=w.up is not False,
                limits=self._budgets[w.name],
                scraped_waiting=w.scraped_waiting,
                kv_usage=w.kv_usage,
                role=w.spec.role,
            )
            for w in self.workers
        ]

    def rows(self) -> list[WorkerRow]:
        """Each worker for the metrics collector."""
        return [
            WorkerRow(
                name=w.name,
                role=w.spec.role,
                waiting=w.scraped_waiting,
                running=w.scraped_running,
                kv_usage=w.kv_usage,
                served=w.served,
                failovers=w.failovers,
            )
            for w in self.workers
        ]

    def note_dropped(self, worker: WorkerState) -> None:
        """The worker dropped a connection before answering. Once may be a keep-alive race;
        twice in a row (across requests) it counts as down until its health check passes."""
        worker.consecutive_drops += 1
        if worker.consecutive_drops >= 2:
            self.mark_down(worker, f"dropped {worker.consecutive_drops} connections in a row")

    def note_answered(self, worker: WorkerState) -> None:
        worker.consecutive_drops = 0

    def mark_down(self, worker: WorkerState, reason: str) -> None:
        was_up = worker.up is not False
        if was_up:
            log.warning("worker %s marked down: %s", worker.name, reason)
        worker.up = False
        worker.model_lens = None  # it may come back with other settings
        worker.last_error = reason
        self._metrics.worker_up.labels(worker.name).set(0)
        if was_up:
            if self.on_down is not None:
                self.on_down(worker, reason)
            if self.on_change is not None:
                self.on_change()

    def _mark_up(self, worker: WorkerState) -> None:
        changed = worker.up is not True
        if changed:
            log.info("worker %s is up", worker.name)
        worker.up = True
        worker.last_error = None
        worker.consecutive_failures = 0
        self._metrics.worker_up.labels(worker.name).set(1)
        if changed and self.on_change is not None:
            self.on_change()

    def acquire(self, worker: WorkerState) -> None:
        worker.in_flight += 1
        worker.served += 1
        self._metrics.in_flight.labels(worker.name).set(worker.in_flight)

    def release(self, worker: WorkerState) -> None:
        worker.in_flight -= 1
        self._metrics.in_flight.labels(worker.name).set(worker.in_flight)

    async def check(self, client: UpstreamClient, worker: WorkerState) -> bool:
        refused = False
        try:
            # A speech server's /health may be missing, or a web page that answers 200
            # for any path; its model list is what every OpenAI-compatible one serves.
            probe = "/v1/models" if worker.spec.role == "speech" else "/health"
            status, _ = await client.get(
                worker.name, worker.spec.url + probe, self._health.timeout_s
            )
            ok = status == 200
            reason = f"{probe} answered {status}"
        except WorkerUnreachable as exc:
            ok, refused = False, exc.refused
            reason = "/health: connection " + ("refused" if exc.refused else "dropped")
        except Exception as exc:  # a timeout, a broken answer: one failed check
            ok = False
            reason = f"/health failed: {exc}"
        worker.last_check = self._clock()
        if ok:
            self._mark_up(worker)
            if worker.model_lens is None:
                await self._read_models(client, worker)
            return True
        worker.consecutive_failures += 1
        # A refused connection means nothing listens: down at once. A slow answer is often
        # a busy CPU worker that still serves its requests: down only after several in a row.
        if refused or worker.consecutive_failures >= self._health.unhealthy_after:
            self.mark_down(worker, reason)
        else:
            log.info(
                "worker %s: %s (%d in a row)", worker.name, reason, worker.consecutive_failures
            )
        return False

    async def _read_models(self, client: UpstreamClient, worker: WorkerState) -> None:
        """Note each served model's ``max_model_len`` (an OpenAI-compatible speech server
        may list none: an empty map, read once)."""
        try:
            status, body = await client.get(
                worker.name, worker.spec.url + "/v1/models", self._health.timeout_s
            )
            data = json.loads(body).get("data") if status == 200 else None
        except Exception as exc:  # tried again at the next check
            log.debug("reading %s's models failed: %r", worker.name, exc)
            return
        lens: dict[str, int] = {}
        for entry in data if isinstance(data, list) else []:
            if isinstance(entry, dict) and isinstance(entry.get("id"), str):
                n = entry.get("max_model_len")
                if type(n) is int and n > 0:
                    lens[entry["id"]] = n
        worker.model_lens = lens

    def max_model_len(self, model: str) -> int | None:
        """The context length of logical ``model`` as its first worker (settings order)
        that reported one serves it."""
        for w in self.for_model(model):
            n = (w.model_lens or {}).get(w.spec.upstream_model(model))
            if n is not None:
                return n
        return None

    async def scrape(self, client: UpstreamClient, worker: WorkerState) -> None:
        """Read the worker's vLLM gauges; on any failure (or a page that does not parse)
        this worker's old values age out, and the other workers' are not affected."""
        try:
            status, body = await client.get(
                worker.name, worker.spec.url + "/metrics", self._health.timeout_s
            )
            if status != 200:
                return
            text = body.decode()
            # The parser is pure Python; a thread keeps a large page from stalling relays.
            gauges = await asyncio.to_thread(parse_vllm_gauges, text)
        except Exception as exc:
            log.debug("scraping %s failed: %r", worker.name, exc)
            return
        old = worker.gauges
        worker.gauges = gauges
        worker.scraped_at = self._clock()
        tokens = gauges.get(PROMPT_SUM, 0.0) - old.get(PROMPT_SUM, 0.0)
        seconds = gauges.get(PREFILL_SUM, 0.0) - old.get(PREFILL_SUM, 0.0)
        if self.on_prefill is not None and PROMPT_SUM in old and tokens > 0 and seconds > 0:
            self.on_prefill(worker.name, int(tokens), seconds)

    def refresh_gauges(self) -> None:
        """Expose scraped values to the scheduler only while they are fresh."""
        stale_after = 3 * self._health.interval_s
        now = self._clock()
        for w in self.workers:
            fresh = w.scraped_at is not None and now - w.scraped_at <= stale_after
            w.scraped_waiting = w.gauges.get("vllm:num_requests_waiting") if fresh else None
            w.kv_usage = w.gauges.get("vllm:kv_cache_usage_perc") if fresh else None
            w.scraped_running = w.gauges.get("vllm:num_requests_running") if fresh else None

    async def check_all(
        self, client: UpstreamClient, only: Collection[WorkerState] | None = None
    ) -> None:
        """Check (and scrape) every worker, or those in ``only``."""
        chosen = self.workers if only is None else [w for w in self.workers if w in only]
        await asyncio.gather(*(self.check(client, w) for w in chosen))
        if self._health.scrape_metrics:
            # Only vLLM exports vllm: gauges; a speech server has none to read.
            vllm = [w for w in chosen if w.up and w.spec.role != "speech"]
            await asyncio.gather(*(self.scrape(client, w) for w in vllm))
        self.refresh_gauges()

    async def _loop(self, client: UpstreamClient) -> None:
        while True:
            try:
                await self.check_all(client)
            except Exception:  # the loop must survive anything a check throws
                log.exception("health check round failed")
            await asyncio.sleep(self._health.interval_s)

    def start(self, client: UpstreamClient) -> None:
        self._task = asyncio.create_task(self._loop(client), name="worker-health")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def status(self) -> list[dict[str, object]]:
        now = self._clock()
        return [
            {
                "name": w.name,
                "url": w.spec.url,
                "role": w.spec.role,
                "models": list(w.spec.models),
                "upstream_models": dict(w.spec.upstream_models),
                "up": w.up,
                "in_flight": w.in_flight,
                "served": w.served,
                "failovers": w.failovers,
                # Fresh scraped values the router and budgets use; None: unknown (stale).
                "waiting": w.scraped_waiting,
                "running": w.scraped_running,
                "kv_usage": w.kv_usage,
                "last_check_age_s": None if w.last_check is None else round(now - w.last_check, 3),
                "last_error": w.last_error,
                "scraped": dict(w.gauges),
                "scraped_age_s": None if w.scraped_at is None else round(now - w.scraped_at, 3),
            }
            for w in self.workers
        ]
