"""Endpoints relayed to a worker without queueing: they cost the worker next to nothing and
clients call them before or around a scheduled request.

- ``POST /tokenize``, ``/detokenize`` (vLLM's), ``/v1/messages/count_tokens`` (Anthropic's):
  to the least-loaded worker serving the body's ``model``;
- ``GET /v1/audio/voices`` and ``/v1/audio/models``: to a speech worker;
- ``GET /v1/responses/{id}`` and ``POST /v1/responses/{id}/cancel``: to the worker that
  stored the response (gateway/stored.py); an unknown id goes to the only worker that could
  hold it, or is a 404.

The worker's answer is passed on (its errors in OpenAI's shape); a worker that cannot be
reached is a 503 with ``Retry-After``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from hearthgate.gateway.errors import (
    BadRequest,
    ModelNotFound,
    NotFound,
    NoWorkerAvailable,
)
from hearthgate.gateway.parse import decode_json, read_body
from hearthgate.gateway.proxy import model_swap, openai_error_body, swap_model
from hearthgate.gateway.upstream import WorkerUnreachable

if TYPE_CHECKING:
    from hearthgate.gateway.core import Gateway
    from hearthgate.gateway.workers import WorkerState

# Relayed by model: the paths, each served by the worker under the same path.
BY_MODEL = ("/tokenize", "/detokenize", "/v1/messages/count_tokens")
# A stored response: read or cancel it on the worker that holds it.
STORED = ("/v1/responses/{response_id}", "/v1/responses/{response_id}/cancel")
# A speech server's lists (Open WebUI reads them), from the first speech worker that is up.
SPEECH_LISTS = ("/v1/audio/voices", "/v1/audio/models")
# How long a relayed call may take (they answer in milliseconds on an idle worker).
_TIMEOUT_S = 30.0


async def _send(
    gw: Gateway, worker: WorkerState, path: str, body: bytes | None, model: str
) -> Response:
    """POST ``body`` (GET when None) to ``worker`` and pass its answer on."""
    url = worker.spec.url + path
    try:
        if body is None:
            status, content = await gw.client.get(worker.name, url, _TIMEOUT_S)
            ctype = "application/json"
        else:
            resp = await gw.client.post(worker.name, url, body, _TIMEOUT_S)
            try:
                status, ctype, content = resp.status, resp.content_type, await resp.read()
            finally:
                resp.close()
    except WorkerUnreachable as exc:
        if exc.refused:
            gw.pool.mark_down(worker, "refused the connection")
        raise NoWorkerAvailable(
            f"worker {worker.name} could not be reached; try again shortly",
            retry_after_s=gw.settings.health.retry_after_s,
        ) from None
    if status != 200:
        content = openai_error_body(status, content, path.split("?")[0], model)
        ctype = "application/json"
    return Response(content, status, {"x-hearthgate-worker": worker.name}, media_type=ctype)


async def by_model(gw: Gateway, request: Request) -> Response:
    """Relay a small JSON call to a worker serving its ``model``."""
    raw = await read_body(request, gw.settings.limits.max_body_bytes)
    body = decode_json(raw, gw.settings.limits.max_json_depth) if raw.strip() else None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object with a 'model'")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a non-empty string")
    if model not in gw.settings.models():
        raise ModelNotFound(
            f"The model '{model}' does not exist. "
            f"Available models: {', '.join(gw.settings.models())}"
        )
    worker = gw.pool.pick(model)
    if worker is None:
        raise NoWorkerAvailable(
            "no worker that serves this model is reachable; try again shortly",
            retry_after_s=gw.settings.health.retry_after_s,
        )
    upstream = {**body, "model": worker.spec.upstream_model(model)}
    path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    response = await _send(gw, worker, path, json.dumps(upstream).encode(), model)
    swap = model_swap(model, worker)
    if swap is not None and isinstance(response.body, bytes):
        response.body = swap_model(response.body, swap)
        response.headers["content-length"] = str(len(response.body))
    return response


async def stored(gw: Gateway, request: Request, response_id: str, cancel: bool) -> Response:
    """Read or cancel the stored response ``response_id`` on the worker that holds it."""
    home = gw.homes.home(response_id)
    candidates = [
        w
        for w in gw.pool.workers
        if w.spec.role in ("general", "long_prefill") and (home is None or w.name == home)
    ]
    if home is None and len(candidates) != 1:
        raise NotFound(f"no stored response with id {response_id!r}", code="response_not_found")
    if not candidates or candidates[0].up is False:
        raise NotFound(
            f"response {response_id!r} was stored by worker {home}, which is gone (down or "
            "removed, and its stored responses with it)",
            code="response_not_found",
        )
    path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    if not cancel:
        return await _send(gw, candidates[0], path, None, "")
    await read_body(request, gw.settings.limits.max_body_bytes)  # cancel takes no body
    return await _send(gw, candidates[0], path, b"{}", "")


async def speech_list(gw: Gateway, request: Request) -> Response:
    """A speech server's list of voices or models."""
    speech = [w for w in gw.pool.workers if w.spec.role == "speech"]
    if not speech:
        raise NotFound("no speech worker is configured (a worker with role: speech)")
    up = next((w for w in speech if w.up is not False), None)
    if up is None:
        raise NoWorkerAvailable(
            "no speech worker is reachable; try again shortly",
            retry_after_s=gw.settings.health.retry_after_s,
        )
    path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return await _send(gw, up, path, None, "")
