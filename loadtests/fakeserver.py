"""A tiny OpenAI-style server for testing the load generator without vLLM.

It streams `max_tokens` chunks `token_delay_s` apart after `ttft_s` (like vLLM with
`ignore_eos`), answers `include_usage` with a final usage chunk, serves embeddings, `/tokenize`
(one token per word plus `overhead`) and a vLLM-like `/metrics`. Requests whose bearer key is
in `reject_keys` get 429; in `fail_keys`, 500. It counts in-flight requests so tests can check
that the generator does not wait for completions.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class FakeConfig:
    ttft_s: float = 0.01
    token_delay_s: float = 0.002
    embed_delay_s: float = 0.002
    reject_keys: frozenset[str] = frozenset()
    fail_keys: frozenset[str] = frozenset()
    overhead: int = 1
    chat_overhead: int = 5


@dataclass
class FakeState:
    in_flight: int = 0
    max_in_flight: int = 0
    received: list[dict[str, Any]] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)


def _key(request: web.Request) -> str:
    return request.headers.get("Authorization", "").removeprefix("Bearer ").strip()


def _words(body: dict[str, Any]) -> int:
    if "messages" in body:
        return sum(len(str(m.get("content", "")).split()) for m in body["messages"])
    text = body.get("prompt", body.get("input", ""))
    return len(str(text).split())


def make_app(cfg: FakeConfig, state: FakeState) -> web.Application:
    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        state.received.append({"path": request.path, "body": body, "key": _key(request)})
        state.arrivals.append(time.perf_counter())
        key = _key(request)
        if key in cfg.reject_keys:
            return web.json_response(
                {"error": {"message": "queue full", "type": "rate_limited"}},
                status=429,
                headers={"Retry-After": "2"},
            )
        if key in cfg.fail_keys:
            return web.json_response({"error": {"message": "boom"}}, status=500)
        chat = request.path.endswith("/chat/completions")
        n = int(body.get("max_tokens", 16))
        prompt = _words(body) + (cfg.chat_overhead if chat else cfg.overhead)
        usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            await asyncio.sleep(cfg.ttft_s)
            if not body.get("stream"):
                await asyncio.sleep(cfg.token_delay_s * max(0, n - 1))
                choice: dict[str, Any] = (
                    {"index": 0, "message": {"role": "assistant", "content": "x " * n}}
                    if chat
                    else {"index": 0, "text": "x " * n}
                )
                return web.json_response({"choices": [choice], "usage": usage})
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)

            async def send(obj: dict[str, Any] | str) -> None:
                data = obj if isinstance(obj, str) else json.dumps(obj)
                await resp.write(f"data: {data}\n\n".encode())

            if chat:
                await send({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
            for i in range(n):
                if i:
                    await asyncio.sleep(cfg.token_delay_s)
                if chat:
                    await send({"choices": [{"index": 0, "delta": {"content": f" t{i}"}}]})
                else:
                    await send({"choices": [{"index": 0, "text": f" t{i}"}]})
            if (body.get("stream_options") or {}).get("include_usage"):
                await send({"choices": [], "usage": usage})
            await send("[DONE]")
            await resp.write_eof()
            return resp
        finally:
            state.in_flight -= 1

    async def embeddings(request: web.Request) -> web.Response:
        body = await request.json()
        state.received.append({"path": request.path, "body": body, "key": _key(request)})
        if _key(request) in cfg.reject_keys:
            return web.json_response({"error": {"message": "busy"}}, status=503)
        await asyncio.sleep(cfg.embed_delay_s)
        n = _words(body)
        return web.json_response(
            {
                "data": [{"index": 0, "embedding": [0.0] * 4}],
                "usage": {"prompt_tokens": n + 2, "total_tokens": n + 2},
            }
        )

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        extra = cfg.chat_overhead if "messages" in body else cfg.overhead
        count = _words(body) + extra
        return web.json_response({"count": count, "tokens": [], "max_model_len": 4096})

    async def metrics(request: web.Request) -> web.Response:
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            f'vllm:num_requests_running{{engine="0",model_name="m"}} {state.in_flight}',
            "# TYPE vllm:num_requests_waiting gauge",
            'vllm:num_requests_waiting{engine="0",model_name="m"} 0',
            "# TYPE hearthgate_queue_depth gauge",
            'hearthgate_queue_depth{class="chat"} 1',
            "# TYPE hearthgate_requests_total counter",
            'hearthgate_requests_total{class="chat"} 5',
        ]
        return web.Response(text="\n".join(lines) + "\n")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", generate)
    app.router.add_post("/v1/completions", generate)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_get("/metrics", metrics)
    return app


@asynccontextmanager
async def serve(
    cfg: FakeConfig | None = None, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[tuple[str, FakeState]]:
    """Run the fake server on a loopback port; yield (base URL, state)."""
    state = FakeState()
    runner = web.AppRunner(make_app(cfg or FakeConfig(), state), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = site._server
    assert server is not None
    sockets = getattr(server, "sockets", None) or []
    actual = sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{actual}", state
    finally:
        await runner.cleanup()


@contextmanager
def serve_in_thread(cfg: FakeConfig | None = None) -> Iterator[tuple[str, FakeState]]:
    """The fake server on its own event loop in a daemon thread (for synchronous callers)."""
    ready: queue.Queue[tuple[str, FakeState] | BaseException] = queue.Queue()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def main() -> None:
        try:
            async with serve(cfg) as got:
                ready.put(got)
                await stop.wait()
        except BaseException as err:  # surface start-up errors to the caller
            ready.put(err)

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    got = ready.get(timeout=10)
    if isinstance(got, BaseException):
        raise got
    try:
        yield got
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()
