"""A minimal OpenAI-style upstream that answers instantly, for overhead measurements and tests.

It streams ``max_tokens`` chunks as fast as it can (or with ``delay_ms`` between them),
in the same event format as vLLM, ending with a usage chunk when asked and ``[DONE]``.
It is a measuring instrument, never evidence that the gateway works with vLLM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from aiohttp import web


def _chunk(i: int, chat: bool, created: int) -> bytes:
    if chat:
        choice = {"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": f"t{i} ", "finish_reason": None}
        obj = "text_completion"
    body = {"id": "x", "object": obj, "created": created, "model": "m", "choices": [choice]}
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


async def _generate(request: web.Request) -> web.StreamResponse:
    try:
        body = await request.json()
    except ValueError:
        return web.json_response({"error": {"message": "bad json"}}, status=400)
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
        return web.json_response({"id": "x", "choices": [choice], "usage": usage})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    # Fault injection for tests: drop the connection after this many chunks.
    break_after = body.get("test_break_after")
    for i in range(n):
        if delay:
            await asyncio.sleep(delay)
        if break_after is not None and i >= int(break_after):
            assert request.transport is not None
            request.transport.close()
            return resp
        await resp.write(_chunk(i, chat, created))
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


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="")


def make_app(delay_ms: float = 0.0) -> web.Application:
    app = web.Application()
    app["delay_ms"] = delay_ms
    app.router.add_post("/v1/completions", _generate)
    app.router.add_post("/v1/chat/completions", _generate)
    app.router.add_post("/tokenize", _tokenize)
    app.router.add_get("/health", _health)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=18900)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    args = parser.parse_args(argv)
    web.run_app(make_app(args.delay_ms), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
