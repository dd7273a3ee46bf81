"""The OpenAI Files and Batches endpoints (``/v1/files``, ``/v1/batches``).

Objects, statuses and list pages are OpenAI's, so the official SDK works unchanged. Every
file and batch belongs to the app whose key created it (``anonymous`` when no app has a
key); another app's id answers 404 as if it did not exist.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from starlette.datastructures import UploadFile
from starlette.responses import JSONResponse, Response
from starlette.types import Message

from hearthgate.gateway.batches.files import file_object
from hearthgate.gateway.batches.lines import BATCH_ENDPOINTS, check_batch, split_lines
from hearthgate.gateway.batches.service import NOT_CONFIGURED, BatchService
from hearthgate.gateway.batches.store import ACTIVE_STATUSES, batch_object
from hearthgate.gateway.classify import ANONYMOUS
from hearthgate.gateway.errors import BadRequest, GatewayError, NotFound, NoWorkerAvailable
from hearthgate.gateway.parse import decode_json, read_body

# Room for the multipart envelope around the file itself.
_MULTIPART_SLACK = 64 * 1024


class Conflict(GatewayError):
    status = 409
    type = "invalid_request_error"
    code = "conflict"


def _now() -> int:
    return int(time.time())


def _page_limit(raw: str | None, default: int, top: int) -> int:
    if raw is None:
        return default
    try:
        n = int(raw)
    except ValueError:
        raise BadRequest(f"'limit' must be an integer, got {raw!r}") from None
    if not 1 <= n <= top:
        raise BadRequest(f"'limit' must be between 1 and {top}")
    return n


def _list(data: list[dict[str, Any]], has_more: bool) -> JSONResponse:
    return JSONResponse(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": has_more,
        }
    )


def build_router(
    service: BatchService | None,
    owner_of: Callable[[Request], str],
    models: Callable[[], list[str]],
) -> APIRouter:
    """The routes; ``owner_of`` authenticates a request and names its app (raises 401)."""
    router = APIRouter()
    settings = service.settings if service is not None else None

    def ready(request: Request) -> tuple[BatchService, str]:
        owner = owner_of(request)
        if service is None:
            raise NoWorkerAvailable(NOT_CONFIGURED, code="batches_not_configured")
        return service, owner

    # ------------------------------------------------------------ files

    @router.post("/v1/files")
    async def upload(request: Request) -> JSONResponse:
        svc, owner = ready(request)
        assert settings is not None
        cfg = settings.batch
        ctype = request.headers.get("content-type", "")
        if not ctype.startswith("multipart/form-data"):
            raise BadRequest(
                "upload the file as multipart/form-data with fields 'file' and 'purpose'"
            )
        raw = await read_body(request, cfg.max_file_bytes + _MULTIPART_SLACK)
        form = await _form(request, raw)
        purpose = form.get("purpose")
        upload = form.get("file")
        if not isinstance(purpose, str):
            raise BadRequest("missing form field 'purpose' (use \"batch\")")
        if purpose != "batch":
            raise BadRequest(f'purpose {purpose!r} is not supported; use "batch"')
        if not isinstance(upload, UploadFile):
            raise BadRequest("missing form field 'file' (a JSONL file)")
        content = await upload.read()
        lines, trailing = split_lines(content, cfg.max_file_bytes, cfg.max_lines)
        async with svc.guard():
            obj = await svc.files.add_file(
                owner,
                upload.filename or "upload.jsonl",
                purpose,
                lines,
                trailing,
                len(content),
                _now(),
            )
        return JSONResponse(obj)

    @router.get("/v1/files")
    async def list_files(request: Request) -> JSONResponse:
        svc, owner = ready(request)
        q = request.query_params
        order = q.get("order", "desc")
        if order not in ("asc", "desc"):
            raise BadRequest("'order' must be 'asc' or 'desc'")
        limit = _page_limit(q.get("limit"), 10_000, 10_000)
        async with svc.guard():
            data, more = await svc.files.list_files(
                owner, q.get("purpose"), limit, q.get("after"), order == "desc"
            )
        return _list(data, more)

    async def _file(svc: BatchService, owner: str, fid: str) -> dict[str, str]:
        async with svc.guard():
            rec = await svc.files.file_record(owner, fid)
        if rec is None:
            raise NotFound(f"No such File object: {fid}", code="file_not_found")
        return rec

    @router.get("/v1/files/{fid}")
    async def get_file(fid: str, request: Request) -> JSONResponse:
        svc, owner = ready(request)
        return JSONResponse(file_object(await _file(svc, owner, fid)))

    @router.get("/v1/files/{fid}/content")
    async def file_content(fid: str, request: Request) -> Response:
        svc, owner = ready(request)
        rec = await _file(svc, owner, fid)
        async with svc.guard():
            content = await svc.files.file_content(rec)
        return Response(content, media_type="application/octet-stream")

    @router.delete("/v1/files/{fid}")
    async def delete_file(fid: str, request: Request) -> JSONResponse:
        svc, owner = ready(request)
        await _file(svc, owner, fid)
        async with svc.guard():
            # Every running batch is in the active set. (The file's ``in_use_by`` names only
            # the latest batch on it, and the first of two batches on one file to end clears
            # it while the other still reads its lines.)
            for bid in await svc.store.active():
                b = await svc.store.batch_record(bid)
                if (
                    b is not None
                    and b.get("input_file_id") == fid
                    and b.get("status") in ACTIVE_STATUSES
                ):
                    raise Conflict(
                        f"file {fid} is the input of batch {bid}, which is still running"
                    )
            await svc.files.delete_file(owner, fid)
        return JSONResponse({"id": fid, "object": "file", "deleted": True})

    # ------------------------------------------------------------ batches

    @router.post("/v1/batches")
    async def create_batch(request: Request) -> JSONResponse:
        svc, owner = ready(request)
        assert settings is not None
        lim = svc.gw.settings.limits  # live: a reload may change them
        body = decode_json(await read_body(request, lim.max_body_bytes), lim.max_json_depth)
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        fid = body.get("input_file_id")
        endpoint = body.get("endpoint")
        window = body.get("completion_window")
        metadata = body.get("metadata")
        if not isinstance(fid, str) or not fid:
            raise BadRequest("'input_file_id' is required (the id of an uploaded file)")
        if endpoint not in BATCH_ENDPOINTS:
            raise BadRequest(
                f"'endpoint' must be one of {', '.join(BATCH_ENDPOINTS)}, got {endpoint!r}"
            )
        if window != "24h":
            raise BadRequest(f"'completion_window' must be \"24h\", got {window!r}")
        if metadata is not None and not (
            isinstance(metadata, dict)
            and len(metadata) <= 16
            and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
        ):
            raise BadRequest("'metadata' must be an object of at most 16 string values")
        rec = await _file(svc, owner, fid)
        if rec.get("purpose") != "batch":
            raise BadRequest(f'file {fid} has purpose {rec.get("purpose")!r}, not "batch"')
        async with svc.guard():
            n = int(rec["lines"])
            lines = [v or "" for v in await svc.files.read_lines(fid, 0, n)]
        checked = check_batch(
            lines,
            endpoint,
            models(),
            lim.max_body_bytes,
            lim.max_json_depth,
            lim.max_n,
            lim.max_embedding_inputs,
        )
        async with svc.guard():
            obj = await svc.store.create_batch(
                owner,
                rec,
                endpoint,
                [c.custom_id for c in checked],
                [c.index for c in checked],
                settings.batch.completion_window_s,
                metadata,
                _now(),
            )
        svc.runner.wake()
        return JSONResponse(obj)

    async def _batch(svc: BatchService, owner: str, bid: str) -> dict[str, str]:
        async with svc.guard():
            rec = await svc.store.batch_record(bid, owner)
        if rec is None:
            raise NotFound(f"No such Batch object: {bid}", code="batch_not_found")
        return rec

    @router.get("/v1/batches")
    async def list_batches(request: Request) -> JSONResponse:
        svc, owner = ready(request)
        q = request.query_params
        limit = _page_limit(q.get("limit"), 20, 100)
        async with svc.guard():
            data, more = await svc.store.list_batches(owner, limit, q.get("after"))
        return _list(data, more)

    @router.get("/v1/batches/{bid}")
    async def get_batch(bid: str, request: Request) -> JSONResponse:
        svc, owner = ready(request)
        return JSONResponse(batch_object(await _batch(svc, owner, bid)))

    @router.post("/v1/batches/{bid}/cancel")
    async def cancel_batch(bid: str, request: Request) -> JSONResponse:
        svc, owner = ready(request)
        rec = await _batch(svc, owner, bid)
        status = rec["status"]
        if status in ("validating", "in_progress"):
            now = _now()
            async with svc.guard():
                await svc.store.set_fields(
                    bid, status="cancelling", cancelling_at=now, ending="cancelled"
                )
            rec = {**rec, "status": "cancelling", "cancelling_at": str(now)}
            svc.runner.wake()
        elif status not in ("cancelling", "cancelled"):
            raise Conflict(f"batch {bid} is {status}; only a running batch can be cancelled")
        return JSONResponse(batch_object(rec))

    return router


async def _form(request: Request, raw: bytes) -> Any:
    """Parse a multipart body already read (within the limit) into its fields."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": raw, "more_body": False}

    try:
        return await Request(request.scope, replay).form(max_files=1, max_fields=8)
    except Exception as exc:  # python-multipart's and starlette's parse errors
        raise BadRequest(f"malformed multipart upload: {exc}") from None


def owner_name(app_name: str | None, auth_required: bool) -> str:
    """Who owns what a request creates: its app, or ``anonymous`` without keys."""
    return app_name if auth_required and app_name is not None else ANONYMOUS
