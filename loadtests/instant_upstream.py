"""A minimal OpenAI-style upstream that answers instantly, for overhead measurements and tests.

It streams ``max_tokens`` chunks as fast as it can (or with ``delay_ms`` between them),
in the same event format as vLLM, ending with a usage chunk when asked and ``[DONE]``.
It is a measuring instrument, never evidence that the gateway works with vLLM.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import random
import struct
import time

from aiohttp import web


def _chunk(i: int, chat: bool, created: int, model: str = "m") -> bytes:
    if chat:
        choice = {"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": f"t{i} ", "finish_reason": None}
        obj = "text_completion"
    body = {"id": "x", "object": obj, "created": created, "model": model, "choices": [choice]}
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


async def _generate(request: web.Request) -> web.StreamResponse:
    try:
        body = await request.json()
    except ValueError:
        return web.json_response({"error": {"message": "bad json"}}, status=400)
    # Fault injection for tests (--drop-before-headers): close the connection unanswered.
    if request.app.get("drop_before_headers"):
        assert request.transport is not None
        request.transport.close()
        return web.Response()
    # Fault injection (--fail-status): answer every generation request with this error, as
    # vLLM does (500) once its engine has died.
    fail = request.app.get("fail_status")
    if fail is not None:
        err = {"message": "EngineCore encountered an issue.", "type": "InternalServerError"}
        return web.json_response({"error": {**err, "code": fail}}, status=fail)
    # Fault injection (body field test_fail_and_close): answer 500 with a whole body, then
    # close the connection a moment later without reading on, as uvicorn (vLLM's server)
    # does after an exception escaped the app: no `Connection: close` header says so.
    if body.get("test_fail_and_close"):
        err = {"message": "'list' object has no attribute 'get'", "type": "InternalServerError"}
        failed = web.json_response({"error": {**err, "code": 500}}, status=500)
        await failed.prepare(request)
        await failed.write_eof()
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.close()
        return failed
    # --served-model: answer only that model name, as vLLM does (404 otherwise).
    served = request.app.get("served_model")
    if served is not None and body.get("model") != served:
        msg = f"The model `{body.get('model')}` does not exist."
        return web.json_response({"error": {"message": msg, "code": 404}}, status=404)
    model = served or "m"
    n = int(body.get("max_tokens") or 16)
    chat = request.path.endswith("/chat/completions")
    delay = float(request.app["delay_ms"]) / 1000.0
    created = int(time.time())
    usage = {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}
    if not body.get("stream"):
        text = "".join(f"t{i} " for i in range(n))
        choice: dict[str, object] = (
            {"index": 0, "message": {"role": "assistant", "content": text}}
            if chat
            else {"index": 0, "text": text}
        )
        choice["finish_reason"] = "length"
        return web.json_response({"id": "x", "model": model, "choices": [choice], "usage": usage})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    # Fault injection for tests: drop the connection after this many chunks.
    break_after = body.get("test_break_after")
    for i in range(n):
        if delay:
            await asyncio.sleep(delay)
        if break_after is not None and i >= int(break_after):
            if i:  # a worker that dies mid-stream: the client has read what was sent
                await asyncio.sleep(0.05)
            assert request.transport is not None
            request.transport.close()
            return resp
        await resp.write(_chunk(i, chat, created, model))
    if (body.get("stream_options") or {}).get("include_usage"):
        tail = {"id": "x", "object": "chunk", "created": created, "choices": [], "usage": usage}
        await resp.write(b"data: " + json.dumps(tail).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def _tokenize(request: web.Request) -> web.Response:
    """A stand-in for vLLM's /tokenize: one token per whitespace-separated word."""
    body = await request.json()
    text = body.get("prompt") or " ".join(
        str(m.get("content", "")) for m in body.get("messages") or []
    )
    return web.json_response({"count": len(str(text).split()), "max_model_len": 4096})


def _vector(item: object, params: dict[str, object], dims: int = 8) -> list[float]:
    """A distinct, deterministic vector per input item and parameter set (so an answer
    computed with another request's parameters would show): 8 dimensions by default, or
    ``dims`` full-precision floats like a real model's (384 for MiniLM), for measuring the
    cost of relaying them."""
    digest = hashlib.sha256(json.dumps([item, params], sort_keys=True).encode()).digest()
    if dims == 8:
        return [b / 255.0 for b in digest[:8]]
    rnd = random.Random(digest)
    return [rnd.uniform(-0.2, 0.2) for _ in range(dims)]


async def _embeddings(request: web.Request) -> web.Response:
    """A stand-in for vLLM's /v1/embeddings: a deterministic vector per item; usage counts
    one token per word plus 2 per text (vLLM's MiniLM adds 2 special tokens) and the length
    of token arrays. An item "BAD" fails the whole call with 400, as vLLM does for one
    bad item. Calls and items are counted at GET /stats."""
    try:
        body = await request.json()
    except ValueError:
        return web.json_response({"error": {"message": "bad json"}}, status=400)
    raw = body.get("input")
    items: list[object]
    if isinstance(raw, str) or (raw and all(isinstance(t, int) for t in raw)):
        items = [raw]
    else:
        items = list(raw or [])
    stats = request.app["stats"]
    stats["embedding_calls"] += 1
    stats["embedding_items"] += len(items)
    if not items or "BAD" in items:
        msg = {"message": "bad input", "type": "BadRequestError", "code": 400}
        return web.json_response({"error": msg}, status=400)
    delay = float(request.app["delay_ms"]) / 1000.0
    if delay:
        await asyncio.sleep(delay)
    data = []
    tokens = 0
    params = {k: v for k, v in body.items() if k not in ("input", "priority")}
    for i, item in enumerate(items):
        vec = _vector(item, params, request.app["dims"])
        tokens += len(item) if isinstance(item, list) else len(str(item).split()) + 2
        emb: object = vec
        if body.get("encoding_format") == "base64":
            emb = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
        data.append({"index": i, "object": "embedding", "embedding": emb})
    usage = {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}
    answer = {
        "id": "embd-x",
        "object": "list",
        "created": int(time.time()),
        "model": body.get("model"),
        "data": data,
        "usage": usage,
    }
    return web.json_response(answer)


async def _stats(request: web.Request) -> web.Response:
    return web.json_response(request.app["stats"])


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="")


def make_app(
    delay_ms: float = 0.0,
    served_model: str | None = None,
    drop_before_headers: bool = False,
    fail_status: int | None = None,
    dims: int = 8,
) -> web.Application:
    app = web.Application()
    app["fail_status"] = fail_status
    app["delay_ms"] = delay_ms
    app["dims"] = dims
    app["served_model"] = served_model
    app["drop_before_headers"] = drop_before_headers
    app["stats"] = {"embedding_calls": 0, "embedding_items": 0}
    app.router.add_post("/v1/embeddings", _embeddings)
    app.router.add_get("/stats", _stats)
    app.router.add_post("/v1/completions", _generate)
    app.router.add_post("/v1/chat/completions", _generate)
    app.router.add_post("/tokenize", _tokenize)
    app.router.add_get("/health", _health)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=18900)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--dims", type=int, default=8, help="embedding vector length")
    parser.add_argument("--served-model", default=None, help="answer only this model name")
    parser.add_argument(
        "--drop-before-headers",
        action="store_true",
        help="fault injection: close every generation request's connection unanswered",
    )
    parser.add_argument(
        "--fail-status",
        type=int,
        default=None,
        help="fault injection: answer every generation request with this HTTP status",
    )
    args = parser.parse_args(argv)
    app = make_app(
        args.delay_ms, args.served_model, args.drop_before_headers, args.fail_status, args.dims
    )
    web.run_app(app, host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
