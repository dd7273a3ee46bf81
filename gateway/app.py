"""The FastAPI application: routes, error mapping, and the lifetime of shared parts."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from gateway.errors import (
    BadRequest,
    GatewayError,
    InternalError,
    MethodNotAllowed,
    ModelNotFound,
    NotFound,
    NoWorkerAvailable,
    error_response,
)
from gateway.metrics import GatewayMetrics, percentile
from gateway.parse import parse_body, read_body
from gateway.proxy import Proxy
from gateway.settings import Settings
from gateway.workers import WorkerPool

log = logging.getLogger("hearthgate")

_ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}


class Gateway:
    """The parts one running gateway shares between requests."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.perf_counter):
        self.settings = settings
        self.clock = clock
        self.metrics = GatewayMetrics(settings.models(), settings.metrics.recent_window)
        self.pool = WorkerPool(settings.workers, settings.health, self.metrics)
        self._session: aiohttp.ClientSession | None = None
        self._proxy: Proxy | None = None
        self.started_at = time.time()

    @property
    def proxy(self) -> Proxy:
        if self._proxy is None:
            raise InternalError("gateway is not started")
        return self._proxy

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self.settings.upstream.max_connections, keepalive_timeout=30
        )
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        self._proxy = Proxy(self._session, self.pool, self.metrics, self.settings, self.clock)
        await self.pool.check_all(self._session)
        self.pool.start(self._session)

    async def stop(self) -> None:
        await self.pool.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def handle(self, request: Request, route: str) -> Response:
        received_at = self.clock()
        endpoint = _ROUTES[route]
        model = "other"
        try:
            raw = await read_body(request, self.settings.limits.max_body_bytes)
            parsed = parse_body(raw, endpoint)
            model = parsed.model
            if model not in self._models():
                raise ModelNotFound(
                    f"The model '{model}' does not exist. "
                    f"Available models: {', '.join(self._models())}"
                )
            return await self.proxy.forward(route, parsed, received_at)
        except GatewayError as exc:
            self.metrics.count(route, model, exc.status)
            return error_response(exc)

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
        workers = self.pool.status()
        return {
            "uptime_s": round(time.time() - self.started_at, 1),
            "in_flight": sum(w.in_flight for w in self.pool.workers),
            "workers": workers,
            "recent": recent,
        }


def create_app(settings: Settings, clock: Callable[[], float] = time.perf_counter) -> FastAPI:
    """Build the gateway application for ``settings``."""
    gw = Gateway(settings, clock)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gw.start()
        try:
            yield
        finally:
            await gw.stop()

    app = FastAPI(
        title="hearthgate",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.gateway = gw

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError) -> Response:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        err: GatewayError
        if exc.status_code == 404:
            err = NotFound(f"no route {request.method} {request.url.path}")
        elif exc.status_code == 405:
            err = MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}")
        else:
            err = BadRequest(str(exc.detail))
        return error_response(err)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        return error_response(BadRequest(str(exc.errors())))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error on %s", request.url.path)
        return error_response(InternalError("internal gateway error; see the gateway log"))

    async def chat(request: Request) -> Response:
        return await gw.handle(request, "/v1/chat/completions")

    async def completions(request: Request) -> Response:
        return await gw.handle(request, "/v1/completions")

    async def embeddings(request: Request) -> Response:
        return await gw.handle(request, "/v1/embeddings")

    app.add_api_route("/v1/chat/completions", chat, methods=["POST"])
    app.add_api_route("/v1/completions", completions, methods=["POST"])
    app.add_api_route("/v1/embeddings", embeddings, methods=["POST"])

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse(gw.list_models())

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        up = [w.name for w in gw.pool.workers if w.up]
        if not up:
            return error_response(
                NoWorkerAvailable(
                    "no worker is reachable", retry_after_s=settings.health.retry_after_s
                )
            )
        return JSONResponse({"status": "ready", "workers_up": up})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/status")
    async def status() -> JSONResponse:
        return JSONResponse(gw.status())

    return app
