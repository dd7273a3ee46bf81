"""The ASGI application: the proxy fast path, FastAPI routes, error mapping, lifespan."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from hearthgate.gateway import relays
from hearthgate.gateway.auth import AdminGuard, warn_if_anonymous
from hearthgate.gateway.batches.api import build_router, owner_name
from hearthgate.gateway.batches.service import BatchService
from hearthgate.gateway.batches.service import describe as describe_batches
from hearthgate.gateway.classify import ANONYMOUS
from hearthgate.gateway.core import ROUTES, Gateway, app_key_header
from hearthgate.gateway.dashboard import status_page
from hearthgate.gateway.errors import (
    BadRequest,
    GatewayError,
    InternalError,
    MethodNotAllowed,
    NotFound,
    NoWorkerAvailable,
    error_response,
)
from hearthgate.gateway.reload import Reloader
from hearthgate.gateway.settings import Settings
from hearthgate.gateway.upstream import UpstreamClient

log = logging.getLogger("hearthgate")


class FastPath:
    """The ASGI entry: the three proxy routes go straight to the gateway, the rest (and the
    lifespan) to FastAPI.

    Each layer of middleware wraps every ``send`` of every streamed token; for the hot
    routes the gateway needs none of them (it maps its own errors), so they are skipped.
    """

    def __init__(self, app: FastAPI, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in ROUTES:
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.gateway.serve(scope, receive, tracking_send)
        except Exception:
            log.exception("unexpected error on %s", scope["path"])
            if not started:
                err = InternalError("internal gateway error; see the gateway log")
                await error_response(err)(scope, receive, send)


class _ProxyRoute:
    """A proxy route as a plain ASGI endpoint (for apps built with :func:`create_app`
    alone; :class:`FastPath` reaches the gateway before FastAPI does)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.gateway.serve(scope, receive, send)


def served_paths() -> list[str]:
    """Every path a client may call, for the 404 that names them."""
    return [
        *ROUTES,
        *relays.BY_MODEL,
        *relays.STORED,
        *relays.SPEECH_LISTS,
        "/v1/models",
        "/v1/files",
        "/v1/batches",
        "/health",
    ]


def create_asgi_app(
    settings: Settings,
    clock: Callable[[], float] = time.perf_counter,
    upstream: UpstreamClient | None = None,
    source: Callable[[], Settings] | None = None,
    path: str | None = None,
) -> FastPath:
    """The application ``hearthgate serve`` runs: FastAPI plus the proxy fast path."""
    app = create_app(settings, clock, upstream, source, path)
    return FastPath(app, app.state.gateway)


def create_app(
    settings: Settings,
    clock: Callable[[], float] = time.perf_counter,
    upstream: UpstreamClient | None = None,
    source: Callable[[], Settings] | None = None,
    path: str | None = None,
) -> FastAPI:
    """Build the gateway application for ``settings`` (``upstream``: the client towards
    the workers; default aiohttp). ``source`` reads the settings again for a reload
    (gateway/reload.py), ``path`` names where they come from; without ``source`` a reload
    is refused."""
    gw = Gateway(settings, clock, upstream)
    admin = AdminGuard(settings)

    def apply(new: Settings) -> None:
        nonlocal admin
        gw.reconfigure(new)
        admin = AdminGuard(new)

    reloader = Reloader(settings, apply, source, path)
    warn_if_anonymous(settings)
    batches = BatchService(settings, gw) if settings.redis.url else None

    async def operator_only(request: Request) -> None:
        """/status and /metrics: the admin key, or this machine only (gateway.auth)."""
        client = request.client.host if request.client is not None else None
        h = request.headers
        # A browser always sends Host (and Origin on a cross-site POST): both are checked.
        admin.check(h.get("authorization"), client, h.get("host"), h.get("origin"))

    async def app_key(request: Request) -> None:
        """Non-proxy /v1 routes: an app's key whenever apps have keys, as on the proxy."""
        gw.classifier.authenticate(app_key_header(request.headers))

    def owner_of(request: Request) -> str:
        app = gw.classifier.authenticate(request.headers.get("authorization"))
        return owner_name(app.name if app else None, gw.classifier.auth_required)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gw.start()
        if batches is not None:
            await batches.start()
        try:
            yield
        finally:
            if batches is not None:
                await batches.stop()
            await gw.stop()

    app = FastAPI(
        title="hearthgate",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        # A path with a trailing slash is a 404 in OpenAI's shape, not a 307 redirect that
        # clients would follow with a GET or not at all.
        redirect_slashes=False,
    )
    app.state.gateway = gw
    app.state.batches = batches
    app.state.reloader = reloader
    app.include_router(build_router(batches, owner_of, lambda: gw.settings.models()))

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError) -> Response:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        err: GatewayError
        if exc.status_code == 404:
            err = NotFound(
                f"no route {request.method} {request.url.path}; this gateway serves "
                f"{', '.join(served_paths())}"
            )
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

    for path in ROUTES:
        app.router.routes.append(Route(path, _ProxyRoute(gw), methods=["POST"]))

    @app.get("/v1/models", dependencies=[Depends(app_key)])
    async def models() -> JSONResponse:
        return JSONResponse(gw.list_models())

    @app.get("/v1/hearthgate/queue")
    async def queue(request: Request) -> JSONResponse:
        """The calling app's requests waiting now, with their place in line (the app's key
        decides whose; another app's requests are never shown)."""
        found = gw.classifier.authenticate(request.headers.get("authorization"))
        name = found.name if found is not None else ANONYMOUS
        data = gw.admission.queue_of(name)
        return JSONResponse({"object": "list", "app": name, "data": data})

    for path in relays.BY_MODEL:

        @app.post(path, dependencies=[Depends(app_key)])
        async def relay_by_model(request: Request) -> Response:
            return await relays.by_model(gw, request)

    for path in relays.SPEECH_LISTS:

        @app.get(path, dependencies=[Depends(app_key)])
        async def speech_list(request: Request) -> Response:
            return await relays.speech_list(gw, request)

    @app.get("/v1/responses/{response_id}", dependencies=[Depends(app_key)])
    async def get_response(request: Request, response_id: str) -> Response:
        return await relays.stored(gw, request, response_id, cancel=False)

    @app.post("/v1/responses/{response_id}/cancel", dependencies=[Depends(app_key)])
    async def cancel_response(request: Request, response_id: str) -> Response:
        return await relays.stored(gw, request, response_id, cancel=True)

    @app.get("/health")
    async def health() -> Response:
        """As vLLM answers it (benchmark clients probe it first): 200 with no body while a
        worker is up, 503 when none is or the gateway is shutting down."""
        up = not gw.draining and any(w.up for w in gw.pool.workers)
        return Response(status_code=200 if up else 503)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        if gw.draining:
            return error_response(
                NoWorkerAvailable(
                    "the gateway is shutting down",
                    retry_after_s=gw.settings.health.retry_after_s,
                    code="shutting_down",
                )
            )
        up = [w.name for w in gw.pool.workers if w.up]
        if not up:
            return error_response(
                NoWorkerAvailable(
                    "no worker is reachable", retry_after_s=gw.settings.health.retry_after_s
                )
            )
        # Redis down pauses batches only: the gateway stays ready for live traffic.
        redis = batches.redis_state() if batches is not None else "not configured"
        return JSONResponse({"status": "ready", "workers_up": up, "redis": redis})

    @app.get("/metrics", dependencies=[Depends(operator_only)])
    async def metrics() -> Response:
        return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/status", dependencies=[Depends(operator_only)])
    async def status() -> JSONResponse:
        return JSONResponse(
            {**gw.status(), "batches": describe_batches(batches), "settings": reloader.status()}
        )

    @app.post("/reload", dependencies=[Depends(operator_only)])
    async def reload() -> JSONResponse:
        """Read the settings file again (as SIGHUP does); 200 with what changed, or 400
        with why the running settings stay."""
        outcome = reloader.reload()
        return JSONResponse(outcome.as_json(), status_code=200 if outcome.ok else 400)

    @app.get("/")
    @app.get("/dashboard")
    async def dashboard(request: Request) -> Response:
        """The status page (gateway/dashboard.py), for people; its data is /status."""
        return status_page(admin, request.client.host if request.client is not None else None)

    return app
