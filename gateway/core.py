"""One running gateway: the parts shared between requests, and the request path from
parsed body to admitted, forwarded request (classify, admit, forward, account)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from starlette.requests import Request
from starlette.responses import Response

from gateway.admission import AdmissionController
from gateway.classify import (
    ANONYMOUS,
    CLASS_HEADER,
    Classification,
    Classifier,
    prompt_chars,
)
from gateway.coalesce import Coalescer, aiohttp_upstream, mergeable, window_policy
from gateway.errors import (
    GatewayError,
    InternalError,
    ModelNotFound,
    NoWorkerAvailable,
    error_response,
)
from gateway.metrics import GatewayMetrics, SchedulerCollector, WorkerCollector, percentile
from gateway.parse import ParsedRequest, parse_body, read_body
from gateway.proxy import Proxy, Result, WorkerUnreachable
from gateway.scheduling import build_scheduler, pacing_rule
from gateway.settings import Settings
from gateway.workers import WorkerPool
from policies.types import QueuedRequest

log = logging.getLogger("hearthgate")

ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}


class Gateway:
    """The parts one running gateway shares between requests."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.perf_counter):
        self.settings = settings
        self.clock = clock
        self.metrics = GatewayMetrics(
            settings.models(),
            settings.metrics.recent_window,
            classes=settings.classes,
            apps=[a.name for a in settings.apps] + [ANONYMOUS],
        )
        self.pool = WorkerPool(settings.workers, settings.health, self.metrics)
        self.metrics.registry.register(WorkerCollector(self.pool.rows))
        self.classifier = Classifier(settings)
        self.scheduler = build_scheduler(settings)
        self.admission = AdmissionController(
            self.scheduler,
            self.pool.snapshots,
            clock=clock,
            tick_s=settings.scheduler.tick_ms / 1000,
            on_admit=self._on_admit,
            on_reject=self._on_reject,
            early_release=settings.scheduler.early_prefill_release,
            pacing=pacing_rule(settings),
        )
        self.metrics.registry.register(
            SchedulerCollector(self.scheduler, self.admission.pacing_state)
        )
        self.pool.on_change = self.admission.pump
        self._session: aiohttp.ClientSession | None = None
        self._proxy: Proxy | None = None
        self._coalescer: Coalescer | None = None  # embeddings batching (gateway/coalesce.py)
        self._ids = itertools.count()
        self._lag_task: asyncio.Task[None] | None = None
        self.started_at = time.time()

    @property
    def proxy(self) -> Proxy:
        if self._proxy is None:
            raise InternalError("gateway is not started")
        return self._proxy

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self.settings.upstream.max_connections,
            keepalive_timeout=self.settings.upstream.keepalive_s,
        )
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        self._proxy = Proxy(self._session, self.pool, self.settings, self.clock)
        self._coalescer = Coalescer(
            aiohttp_upstream(self._session, self.settings),
            self.pool,
            {name: window_policy(c) for name, c in self.settings.classes.items()},
            self._embed_activity,
            self.metrics,
            self.clock,
        )
        await self.pool.check_all(self._session)
        self.pool.start(self._session)
        self.admission.start()
        self._lag_task = asyncio.create_task(self._watch_loop_lag(), name="loop-lag")

    async def stop(self) -> None:
        if self._lag_task is not None:
            self._lag_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lag_task
            self._lag_task = None
        await self.admission.stop()
        if self._coalescer is not None:
            await self._coalescer.stop()
        await self.pool.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _watch_loop_lag(self, interval_s: float = 0.1) -> None:
        """Observe how late a 100 ms timer fires: the event loop's own delay, which every
        relayed token and every admission decision pays."""
        while True:
            t = time.perf_counter()
            await asyncio.sleep(interval_s)
            self.metrics.loop_lag.observe(max(0.0, time.perf_counter() - t - interval_s))

    def _on_admit(self, req: QueuedRequest, waited_s: float) -> None:
        self.metrics.queue_wait.labels(req.cls).observe(waited_s)
        self.metrics.admitted.labels(req.cls, self.metrics.app_label(req.tenant)).inc()

    def _on_reject(self, req: QueuedRequest, reason: str) -> None:
        self.metrics.rejected.labels(req.cls, reason).inc()

    async def handle(self, request: Request, route: str) -> Response:
        received_at = self.clock()
        endpoint = ROUTES[route]
        model = "other"
        try:
            app = self.classifier.authenticate(request.headers.get("authorization"))
            raw = await read_body(request, self.settings.limits.max_body_bytes)
            parsed = parse_body(raw, endpoint)
            model = parsed.model
            if model not in self._models():
                raise ModelNotFound(
                    f"The model '{model}' does not exist. "
                    f"Available models: {', '.join(self._models())}"
                )
            prompt_tokens = await self._prompt_tokens(parsed)
            c = self.classifier.classify(
                parsed, app, request.headers.get(CLASS_HEADER), prompt_tokens
            )
            return await self._dispatch(request, route, parsed, c, received_at)
        except GatewayError as exc:
            self.metrics.count(route, model, exc.status)
            return error_response(exc)

    async def _prompt_tokens(self, parsed: ParsedRequest) -> int:
        """The heuristic estimate, or for long prompts (when enabled) the worker's own count
        from vLLM's ``/tokenize``: a few ms, paid only where a prefill costs far more."""
        estimate = self.classifier.estimate_prompt_tokens(parsed)
        t = self.settings.tokens
        if not t.use_worker_tokenizer or parsed.endpoint == "embeddings":
            return estimate
        chars, _ = prompt_chars(parsed)
        if chars < t.tokenizer_min_chars:
            return estimate
        worker = self.pool.pick(parsed.model)
        if worker is None or self._session is None:
            return estimate
        key = "messages" if parsed.endpoint == "chat" else "prompt"
        body = {"model": worker.spec.upstream_model(parsed.model), key: parsed.body[key]}
        try:
            async with self._session.post(
                worker.spec.url + "/tokenize",
                json=body,
                timeout=aiohttp.ClientTimeout(total=2.0),
            ) as resp:
                if resp.status == 200:
                    return int((await resp.json())["count"])
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError):
            pass
        return estimate

    async def _dispatch(
        self,
        request: Request,
        route: str,
        parsed: ParsedRequest,
        c: Classification,
        received_at: float,
    ) -> Response:
        cls = self.settings.classes[c.cls]

        async def disconnected() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        done = functools.partial(self._record, route, parsed.model, c)
        # Mergeable embeddings go through the coalescer (a bad input is refused here, alone).
        batching = mergeable(parsed)
        dropped: set[str] = set()
        failed: set[str] = set()  # workers that failed this request before answering
        last_answer: Response | None = None  # a worker's own 5xx, if that was the failure
        for attempt in range(3):
            serving = self.pool.for_model(parsed.model)
            # Fail over: the retry goes to a worker that has not failed this request yet;
            # only when none is left is one tried again (a pooled connection the worker had
            # just closed is worth a second try).
            eligible = [w for w in serving if w.name not in failed] or serving
            req = QueuedRequest(
                id=f"r{next(self._ids)}",
                cls=c.cls,
                tenant=c.app,
                arrival=received_at,
                priority=cls.priority,
                prompt_tokens=c.prompt_tokens,
                max_tokens=c.max_tokens,
                workers=frozenset(w.name for w in eligible),
                endpoint=parsed.endpoint,
            )
            try:
                ticket = await self.admission.admit(
                    req, disconnected, eligible_healthy=any(w.up is not False for w in eligible)
                )
            except asyncio.CancelledError:
                self.metrics.rejected.labels(c.cls, "disconnected").inc()
                return Response(status_code=499)
            worker = self.pool.by_name[ticket.worker]
            try:
                if batching is not None and self._coalescer is not None:
                    return await self._coalescer.forward(
                        batching,
                        worker,
                        ticket,
                        c.cls,
                        c.prompt_tokens,
                        received_at,
                        done,
                        disconnected,
                        priority=cls.priority,
                    )
                return await self.proxy.forward(
                    route, parsed, worker, ticket, received_at, done, priority=cls.priority
                )
            except WorkerUnreachable as exc:
                if not exc.refused:
                    if worker.name in dropped:  # dropped twice in a row: treat as down
                        self.pool.mark_down(worker, "dropped the connection twice")
                    dropped.add(worker.name)
                failed.add(worker.name)
                worker.failovers += 1
                last_answer = exc.answer
                others = [w for w in self.pool.for_model(parsed.model) if w.name not in failed]
                if last_answer is not None and not any(w.up is not False for w in others):
                    break  # a worker's own error, and no other worker to try: pass it on
                log.info("worker %s unreachable; retrying (attempt %d)", worker.name, attempt)
                continue
        if last_answer is not None:
            self.metrics.count(route, parsed.model, last_answer.status_code)
            return last_answer
        raise NoWorkerAvailable(
            "no worker that serves this model is reachable; try again shortly",
            retry_after_s=self.settings.health.retry_after_s,
        )

    def _embed_activity(self, worker: str) -> tuple[int, bool]:
        """For the batching window: requests admitted to ``worker`` and not finished, and
        whether interactive work is queued or in its prefill on any worker (they share the
        machine's accelerator, so background batches make way for it)."""
        usage = self.scheduler.worker_usage()
        admitted = usage[worker].in_flight if worker in usage else 0
        interactive = any(u.interactive_prefill_tokens > 0 for u in usage.values())
        if not interactive:
            classes = self.scheduler.classes
            interactive = any(
                st.depth > 0 and classes[name].interactive
                for name, st in self.scheduler.queue_stats().items()
            )
        return admitted, interactive

    def _record(self, route: str, model: str, c: Classification, result: Result) -> None:
        m = self.metrics
        m.count(route, model, result.status)
        cls = self.settings.classes[c.cls]
        app = m.app_label(c.app)
        if result.prompt_tokens:
            m.class_tokens.labels(c.cls, app, "prompt").inc(result.prompt_tokens)
        if result.completion_tokens:
            m.class_tokens.labels(c.cls, app, "completion").inc(result.completion_tokens)
        m.tokens(model, result.prompt_tokens or 0, result.completion_tokens or 0)
        if result.e2e_s is not None:
            m.observe_e2e(route, model, result.e2e_s)
        if result.ttft_s is None:
            return
        m.observe_ttft(route, model, result.ttft_s)
        m.observe_gaps(route, model, result.gaps)
        m.class_ttft.labels(c.cls).observe(result.ttft_s)
        if not result.completed:
            return
        ttft_ok = cls.ttft_ms is None or result.ttft_s * 1000 <= cls.ttft_ms
        mean_gap = sum(result.gaps) / len(result.gaps) if result.gaps else 0.0
        itl_ok = cls.itl_ms is None or mean_gap * 1000 <= cls.itl_ms
        for target, ok in (("ttft", ttft_ok), ("itl", itl_ok), ("both", ttft_ok and itl_ok)):
            m.slo.labels(c.cls, target, "met" if ok else "missed").inc()

    def _models(self) -> list[str]:
        return self.settings.models()

    def list_models(self) -> dict[str, Any]:
        created = int(self.started_at)
        return {
            "object": "list",
            "data": [
                {"id": m, "object": "model", "created": created, "owned_by": "hearthgate"}
                for m in self._models()
            ],
        }

    def status(self) -> dict[str, Any]:
        recent: dict[str, Any] = {}
        for route, values in self.metrics.recent_ttft.items():
            recent.setdefault(route, {})["ttft_p50_s"] = percentile(values, 50)
            recent[route]["ttft_p99_s"] = percentile(values, 99)
            recent[route]["ttft_samples"] = len(values)
        for route, values in self.metrics.recent_e2e.items():
            recent.setdefault(route, {})["e2e_p50_s"] = percentile(values, 50)
            recent[route]["e2e_p99_s"] = percentile(values, 99)
        usage = self.scheduler.worker_usage()
        pacing = self.admission.pacing_state()
        workers = self.pool.status()
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
        now = self.clock()
        queues = {
            cls: {
                "depth": st.depth,
                "queued_tokens": st.tokens,
                "oldest_wait_s": None
                if st.oldest_arrival is None
                else round(now - st.oldest_arrival, 3),
                "dispatched_tokens": st.dispatched_tokens,
            }
            for cls, st in self.scheduler.queue_stats().items()
        }
        return {
            "uptime_s": round(time.time() - self.started_at, 1),
            "in_flight": sum(w.in_flight for w in self.pool.workers),
            "queued": self.scheduler.queued_count,
            "queues": queues,
            "tenant_counters": self.scheduler.tenant_counters(),
            "workers": workers,
            "recent": recent,
        }
