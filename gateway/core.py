"""One running gateway: the parts shared between requests, and the request path from raw
ASGI request to answer (read, classify, lease; then gateway/dispatch.py admits, forwards
and fails over; account).

Every request that gets past classification runs inside one :class:`gateway.lease.Lease`,
the response included, so whatever ends it gives back all it held exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from hearthgate.gateway import accounting, inprocess
from hearthgate.gateway.admission import AdmissionController
from hearthgate.gateway.classify import CLASS_HEADER, Classification, Classifier
from hearthgate.gateway.coalesce import Coalescer, client_upstream, window_policies
from hearthgate.gateway.dispatch import dispatch
from hearthgate.gateway.endpoints import BY_PATH
from hearthgate.gateway.errors import (
    ClientGone,
    GatewayError,
    ModelNotFound,
    NoWorkerAvailable,
    error_response,
)
from hearthgate.gateway.inprocess import Answer, OnBehalf
from hearthgate.gateway.lease import Lease, LeaseBook
from hearthgate.gateway.metrics import GatewayMetrics, SchedulerCollector, WorkerCollector
from hearthgate.gateway.parse import parse_body, parse_upload, read_body
from hearthgate.gateway.proxy import Proxy, Result
from hearthgate.gateway.scheduling import (
    app_names,
    app_pacing_floor,
    app_queue_caps,
    build_scheduler,
    class_policy,
    embed_activity,
    pacing_rule,
    routing_policy,
    tenant_policies,
)
from hearthgate.gateway.settings import Settings
from hearthgate.gateway.status import render_status
from hearthgate.gateway.stored import AnswerHomes
from hearthgate.gateway.tokens import token_counter
from hearthgate.gateway.upstream import AiohttpUpstream, UpstreamClient
from hearthgate.gateway.workers import WorkerPool, WorkerState
from hearthgate.policies.types import QueuedRequest

log = logging.getLogger("hearthgate")

# The scheduled routes: client path -> endpoint name (gateway/endpoints).
ROUTES = {path: e.name for path, e in BY_PATH.items()}


def app_key_header(headers: Headers) -> str | None:
    """The client's ``Authorization`` header; Anthropic's clients send the key as
    ``x-api-key`` instead, taken as a bearer key."""
    auth = headers.get("authorization")
    if auth is None and (key := headers.get("x-api-key")):
        return f"Bearer {key}"
    return auth


class Gateway:
    """The parts one running gateway shares between requests.

    ``upstream``: the HTTP client towards the workers (default: aiohttp); tests hand in one
    that fails in whatever way they need.
    """

    def __init__(
        self,
        settings: Settings,
        clock: Callable[[], float] = time.perf_counter,
        upstream: UpstreamClient | None = None,
    ):
        self.settings = settings
        self.clock = clock
        self.metrics = GatewayMetrics(
            settings.models(),
            settings.metrics.recent_window,
            classes=settings.classes,
            apps=app_names(settings),
        )
        self.client: UpstreamClient = upstream or AiohttpUpstream(
            settings.upstream.max_connections,
            settings.upstream.keepalive_s,
            settings.upstream.connect_timeout_s,
        )
        self.pool = WorkerPool(settings.workers, settings.health, self.metrics)
        self.metrics.registry.register(WorkerCollector(self.pool.rows))
        self.classifier = Classifier(settings)
        self.tokens = token_counter(settings.tokens, self.pool, self.client)
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
            app_queue_caps=app_queue_caps(settings),
            max_queued_bytes=settings.limits.max_queued_bytes,
            retry_after_s=settings.health.retry_after_s,
            app_pacing_floor=app_pacing_floor(settings),
        )
        self.metrics.registry.register(
            SchedulerCollector(self.scheduler, self.admission.pacing_state, self.admission.clock)
        )
        self.leases = LeaseBook()
        self.pool.on_change = self.admission.pump
        self.pool.on_down = self._worker_down
        self.pool.on_prefill = self.admission.prefill_rates.observe
        self.homes = AnswerHomes()  # where stored answers live (gateway/stored.py)
        self.proxy = Proxy(self.client, self.pool, settings, clock, self.homes)
        self.coalescer = Coalescer(  # embeddings batching (gateway/coalesce.py)
            client_upstream(self.client, settings),
            self.pool,
            window_policies(settings),
            self._embed_activity,
            self.metrics,
            clock,
        )
        self.draining = False
        # App -> [prompt, completion] tokens served since start (kept in Redis when set).
        self.app_tokens: dict[str, list[int]] = {}
        self.request_ids = itertools.count()
        self._lag_task: asyncio.Task[None] | None = None
        self._drain_timer: asyncio.TimerHandle | None = None
        self._checks: set[asyncio.Task[None]] = set()  # health checks of added workers
        self.started_at = time.time()

    def reconfigure(self, settings: Settings) -> None:
        """Apply new settings while running (gateway/reload.py decides what may change):
        queued requests are re-judged by the new class policies, requests in flight carry
        on. Raises ValueError and changes nothing if the scheduler refuses (a class removed
        while it still has requests)."""
        self.scheduler.reconfigure(
            [class_policy(name, c) for name, c in settings.classes.items()],
            tenant_policies(settings),
            w_in=settings.scheduler.w_in,
            w_out=settings.scheduler.w_out,
            routing=routing_policy(settings),
        )
        self.settings = settings
        self.metrics.add_labels(settings.models(), settings.classes, app_names(settings))
        self.classifier = Classifier(settings)
        self.coalescer.set_policies(window_policies(settings))
        fresh = self.pool.reconfigure(settings.workers, settings.health)
        self.admission.reconfigure(
            early_release=settings.scheduler.early_prefill_release,
            pacing=pacing_rule(settings),
            app_queue_caps=app_queue_caps(settings),
            max_queued_bytes=settings.limits.max_queued_bytes,
            retry_after_s=settings.health.retry_after_s,
            app_pacing_floor=app_pacing_floor(settings),
        )
        if fresh:
            task = asyncio.create_task(self.pool.check_all(self.client, fresh), name="check-new")
            self._checks.add(task)
            task.add_done_callback(self._checks.discard)

    # ------------------------------------------------------------ life cycle

    async def start(self) -> None:
        await self.pool.check_all(self.client)
        self.pool.start(self.client)
        self.admission.start()
        self._lag_task = asyncio.create_task(self._watch_loop_lag(), name="loop-lag")

    async def stop(self) -> None:
        if self._drain_timer is not None:
            self._drain_timer.cancel()
        if self._lag_task is not None:
            self._lag_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lag_task
            self._lag_task = None
        self.begin_drain(drain_s=0.0)
        await self.admission.stop()
        await self.coalescer.stop()
        await self.pool.stop()
        await self.client.close()

    def begin_drain(self, drain_s: float | None = None) -> None:
        """Shut down gracefully: ``/readyz`` turns 503; new and queued requests get 503 with
        ``Retry-After``; requests in flight may finish for ``drain_s`` (default
        ``shutdown.drain_s``), then the rest are cut (a stream ends with an error event and
        ``[DONE]``)."""
        wait = self.settings.shutdown.drain_s if drain_s is None else drain_s
        if not self.draining:
            self.draining = True
            log.info("shutting down: %d requests open, draining for %.0f s", len(self.leases), wait)
            self.admission.close(self._shutting_down())
        if self._drain_timer is not None:
            self._drain_timer.cancel()
            self._drain_timer = None
        if wait <= 0:
            self._cut_all()
        else:
            self._drain_timer = asyncio.get_running_loop().call_later(wait, self._cut_all)

    def _cut_all(self) -> None:
        n = self.leases.cut_all(self._shutting_down())
        if n:
            log.info("shutdown: cut %d requests still open", n)

    def _shutting_down(self) -> NoWorkerAvailable:
        return NoWorkerAvailable(
            "the gateway is shutting down; retry shortly",
            retry_after_s=self.settings.health.retry_after_s,
            code="shutting_down",
        )

    def _worker_down(self, worker: WorkerState, reason: str) -> None:
        err = NoWorkerAvailable(
            f"worker {worker.name} went down ({reason})",
            retry_after_s=self.settings.health.retry_after_s,
        )
        n = self.leases.cut_worker(worker.name, err)
        if n:
            log.warning("worker %s down: cut %d requests on it", worker.name, n)

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

    # ------------------------------------------------------------ the request path

    async def serve(
        self, scope: Scope, receive: Receive, send: Send, *, on_behalf: OnBehalf | None = None
    ) -> None:
        """Answer one request on a proxy route (the whole ASGI exchange). ``on_behalf``: a
        request the gateway makes itself (a batch line) for an app, in a given class; no
        key is checked and no rule or header chooses the class."""
        route = scope["path"]
        received_at = self.clock()
        model = "other"
        request = Request(scope, receive)
        try:
            if self.draining:
                raise self._shutting_down()
            app = None
            if on_behalf is None:
                app = self.classifier.authenticate(app_key_header(request.headers))
            lim = self.settings.limits
            spec = BY_PATH[route]
            query = scope.get("query_string", b"").decode("latin-1")
            if spec.form:
                raw = await read_body(request, lim.max_upload_bytes)
                ctype = request.headers.get("content-type")
                parsed = await asyncio.to_thread(parse_upload, raw, ctype, spec.name, route, query)
            else:
                raw = await read_body(request, lim.max_body_bytes)
                parsed = parse_body(
                    raw,
                    spec.name,
                    lim.max_json_depth,
                    lim.max_n,
                    lim.max_embedding_inputs,
                    path=route,
                    query=query,
                )
            model = parsed.model
            if model not in self._models():
                raise ModelNotFound(
                    f"The model '{model}' does not exist. "
                    f"Available models: {', '.join(self._models())}"
                )
            prompt_tokens = await self.tokens.count(parsed)
            if on_behalf is None:
                c = self.classifier.classify(
                    parsed, app, request.headers.get(CLASS_HEADER), prompt_tokens
                )
            else:
                c = Classification(
                    on_behalf.app,
                    on_behalf.cls,
                    prompt_tokens,
                    self.classifier.max_tokens(parsed),
                )
        except ClientGone:
            self.metrics.count(route, model, 499)
            return
        except GatewayError as exc:
            self.metrics.count(route, model, exc.status)
            await error_response(exc, BY_PATH[route].error_shape)(scope, receive, send)
            return
        label = request.headers.get("x-request-id")
        label = label[:128] if label else None
        lease = Lease(self.leases, self.admission, self.pool, receive, len(raw), label)
        async with lease:
            try:
                response = await dispatch(self, lease, route, parsed, c, received_at)
            except ClientGone:
                self.metrics.count(route, model, 499)
                return
            except GatewayError as exc:
                self.metrics.count(route, model, exc.status)
                response = error_response(exc, BY_PATH[route].error_shape)
            with contextlib.suppress(OSError):
                await response(scope, receive, send)

    def _embed_activity(self, worker: str) -> tuple[int, bool]:
        return embed_activity(self.scheduler, worker)

    def record_result(self, route: str, model: str, c: Classification, result: Result) -> None:
        cls = self.settings.classes[c.cls]
        accounting.record(self.metrics, self.app_tokens, route, model, c.cls, cls, c.app, result)

    async def call(
        self, route: str, body: bytes, on_behalf: OnBehalf, stop: asyncio.Event
    ) -> Answer:
        """One non-streaming request through the whole request path, made by the gateway
        itself (gateway/inprocess.py). Setting ``stop`` acts as the client leaving: the
        request is withdrawn or aborted upstream."""

        async def serve(scope: Scope, receive: Receive, send: Send, who: OnBehalf) -> None:
            await self.serve(scope, receive, send, on_behalf=who)

        return await inprocess.call(serve, route, body, on_behalf, stop)

    # ------------------------------------------------------------ views

    def _models(self) -> list[str]:
        return self.settings.models()

    def list_models(self) -> dict[str, Any]:
        """Every model the workers serve, in the order of the settings (clients such as
        Continue take the first), with ``max_model_len`` where the worker reported it;
        answered from memory, however busy the workers are."""
        created = int(self.started_at)
        data: list[dict[str, Any]] = []
        for m in self._models():
            entry: dict[str, Any] = {
                "id": m,
                "object": "model",
                "created": created,
                "owned_by": "hearthgate",
            }
            n = self.pool.max_model_len(m)
            if n is not None:
                entry["max_model_len"] = n
            data.append(entry)
        return {"object": "list", "data": data}

    def status(self) -> dict[str, Any]:
        return render_status(
            scheduler=self.scheduler,
            admission=self.admission,
            pool=self.pool,
            metrics=self.metrics,
            leases=self.leases,
            now=self.clock(),
            started_at=self.started_at,
            draining=self.draining,
        )
