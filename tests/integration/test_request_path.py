"""The request path in-process, one fault at a time: every way a request can end gives back
everything it held (its lease), and each fault gets the answer a user expects.

The upstream is an injected client (tests/inprocess.py) that fails as each test needs; the
client side is a hand-driven ASGI exchange that can disconnect at any moment.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from hearthgate.gateway.core import Gateway
from hearthgate.gateway.errors import UpstreamFailed
from hearthgate.gateway.lease import Lease
from hearthgate.gateway.upstream import UpstreamResponse, WorkerUnreachable
from tests.inprocess import (
    Exchange,
    FakeResponse,
    FakeUpstream,
    Handler,
    settings,
    token_chunks,
    until,
)

COMPLETION = {"model": "m", "prompt": "hello", "max_tokens": 4}
STREAM = {**COMPLETION, "stream": True}
OK_JSON = json.dumps(
    {"id": "x", "choices": [{"text": "hi"}], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}
).encode()


@asynccontextmanager
async def running(handler: Handler, **extra: Any) -> AsyncIterator[tuple[Gateway, FakeUpstream]]:
    up = FakeUpstream(handler)
    gw = Gateway(settings(**extra), upstream=up)
    await gw.start()
    try:
        yield gw, up
    finally:
        await gw.stop()


def idle(gw: Gateway) -> bool:
    """Nothing held anywhere: no lease, nothing queued or admitted, no in-flight count."""
    return (
        len(gw.leases) == 0
        and gw.scheduler.queued_count == 0
        and gw.scheduler.in_flight_count == 0
        and gw.admission.waiting == 0
        and gw.admission.queued_bytes == 0
        and all(w.in_flight == 0 for w in gw.pool.workers)
    )


def answer(resp: FakeResponse) -> Handler:
    async def handler(worker: str, path: str, body: dict[str, Any]) -> UpstreamResponse:
        return resp

    return handler


def post(
    gw: Gateway, body: dict[str, Any] | bytes, path: str = "/v1/completions", **h: str
) -> Exchange:
    return Exchange(gw, path, body, h)


# ------------------------------------------------------------------ client goes away


async def test_non_streaming_disconnect_aborts_the_upstream_request() -> None:
    resp = FakeResponse(hang=True)
    async with running(answer(resp)) as (gw, up):
        ex = post(gw, COMPLETION)
        await until(lambda: len(up.posts) == 1)
        assert gw.leases.counts()["admitted"] == 1
        ex.disconnect()
        await ex.done()
        assert resp.closed and not resp.finished  # the worker's connection was dropped
        assert idle(gw)


async def test_stream_disconnect_before_the_first_token_aborts_upstream() -> None:
    resp = FakeResponse(chunks=[], hang=True, content_type="text/event-stream")
    async with running(answer(resp)) as (gw, up):
        ex = post(gw, STREAM)
        await until(lambda: len(up.posts) == 1)
        ex.disconnect()
        await ex.done()
        assert resp.closed and ex.status is None
        assert idle(gw)


async def test_stream_disconnect_mid_stream_releases_everything() -> None:
    resp = FakeResponse(chunks=token_chunks(2, usage=False)[:-1], hang=True)
    async with running(answer(resp)) as (gw, _):
        ex = post(gw, STREAM)
        await until(lambda: resp.sent >= 2 and ex.status == 200)
        ex.disconnect()
        await ex.done()
        assert resp.closed and idle(gw)
        # the tokens streamed were charged to the app
        assert gw.scheduler.tenant_counters()["chat"]["anonymous"] > 0


async def test_disconnect_while_queued_leaves_no_trace() -> None:
    resp = FakeResponse(hang=True)
    limits = {"max_in_flight": 1}
    workers = [{"name": "w0", "url": "http://w0", "models": ["m"], "limits": limits}]
    async with running(answer(resp), workers=workers) as (gw, up):
        first = post(gw, COMPLETION)
        await until(lambda: len(up.posts) == 1)
        second = post(gw, COMPLETION)
        await until(lambda: gw.scheduler.queued_count == 1)
        assert gw.leases.counts()["queued"] == 1
        second.disconnect()
        await second.done()
        assert gw.scheduler.queued_count == 0 and len(gw.leases) == 1
        first.disconnect()
        await first.done()
        assert idle(gw)


async def test_answers_say_their_class_and_how_long_they_waited_in_line() -> None:
    now = [100.0]
    gate = asyncio.Event()

    async def handler(worker: str, path: str, body: dict[str, Any]) -> UpstreamResponse:
        if body["prompt"] == "first":
            await gate.wait()
        return FakeResponse(chunks=[OK_JSON])

    limits = {"max_in_flight": 1}
    workers = [{"name": "w0", "url": "http://w0", "models": ["m"], "limits": limits}]
    up = FakeUpstream(handler)
    gw = Gateway(settings(workers=workers), clock=lambda: now[0], upstream=up)
    await gw.start()
    try:
        first = post(gw, {**COMPLETION, "prompt": "first"})
        await until(lambda: len(up.posts) == 1)
        second = post(gw, {**COMPLETION, "prompt": "second"})
        await until(lambda: gw.scheduler.queued_count == 1)
        third = post(gw, {**COMPLETION, "prompt": "third"})
        await until(lambda: gw.scheduler.queued_count == 2)
        now[0] += 0.25  # the second waits a quarter of a second behind the first
        gate.set()
        for ex in (first, second, third):
            await ex.done()
        assert first.headers["x-hearthgate-queued-ms"] == "0"
        assert second.headers["x-hearthgate-queued-ms"] == "250"
        assert second.headers["x-hearthgate-class"] == "chat"
        # requests queued ahead when each arrived (the running first one is not queued)
        assert [ex.headers["x-hearthgate-queued-behind"] for ex in (first, second, third)] == [
            "0",
            "0",
            "1",
        ]
        assert idle(gw)
    finally:
        await gw.stop()


async def test_a_cancelled_request_task_gives_everything_back() -> None:
    resp = FakeResponse(hang=True)
    async with running(answer(resp)) as (gw, up):
        ex = post(gw, COMPLETION)
        # handed to the proxy (``posts`` fills before the fake's handler has answered)
        await until(lambda: len(up.responses) == 1)
        ex.task.cancel()
        await asyncio.gather(ex.task, return_exceptions=True)
        assert resp.closed and idle(gw)


async def test_an_answer_arriving_as_the_request_is_cancelled_is_closed() -> None:
    """The worker's answer comes in the very step the request task is cancelled: nobody
    will read it, and it is closed (its connection goes back to the pool), not dropped."""
    gw = Gateway(settings())
    resp = FakeResponse(hang=True)
    answered: asyncio.Future[FakeResponse] = asyncio.get_running_loop().create_future()
    async with Lease(gw.leases, gw.admission, gw.pool) as lease:
        waiter = asyncio.ensure_future(lease.guard(answered))
        await asyncio.sleep(0)  # the guard waits for the answer
        answered.set_result(resp)  # the answer arrives...
        waiter.cancel()  # ...as the request is cancelled, before the guard wakes
        with pytest.raises(asyncio.CancelledError):
            await waiter
    assert resp.closed


# ------------------------------------------------------------------ odd workers


async def test_a_body_that_breaks_off_gives_502_and_leaks_nothing() -> None:
    async def handler(worker: str, path: str, body: dict[str, Any]) -> UpstreamResponse:
        return FakeResponse(chunks=[b'{"id": "x", "cho'], fail=UpstreamFailed("broke off"))

    apps = [{"name": "a", "key_env": "HG_TEST_KEY_A", "max_in_flight": 4}]
    os.environ["HG_TEST_KEY_A"] = "key-a"
    async with running(handler, apps=apps) as (gw, _):
        for _ in range(6):  # more than the app's max_in_flight: none may stay held
            ex = await post(gw, COMPLETION, authorization="Bearer key-a").done()
            assert ex.status == 502
            assert ex.json()["error"]["type"] == "upstream_error"
        assert idle(gw)


async def test_usage_that_is_not_an_object_is_passed_on_and_leaks_nothing() -> None:
    odd = json.dumps({"id": "x", "choices": [], "usage": [1, 2]}).encode()
    async with running(answer(FakeResponse(chunks=[odd]))) as (gw, _):
        ex = await post(gw, COMPLETION).done()
        assert ex.status == 200 and ex.json()["usage"] == [1, 2]
        assert idle(gw)


async def test_a_worker_error_answer_alone_is_passed_on() -> None:
    err = b'{"error": {"message": "engine died"}}'
    async with running(answer(FakeResponse(status=500, chunks=[err]))) as (gw, _):
        ex = await post(gw, COMPLETION).done()
        assert ex.status == 500 and ex.headers["x-hearthgate-worker"] == "w0"
        assert idle(gw)


async def test_garbage_stream_is_relayed_without_a_500() -> None:
    chunks = [b"data: {not json\n\n", b"data: [1, 2]\n\n", b'data: {"usage": 5}\n\n']
    async with running(answer(FakeResponse(chunks=chunks))) as (gw, _):
        ex = await post(gw, STREAM).done()
        assert ex.status == 200 and len(ex.events()) == 3
        assert idle(gw)


# ------------------------------------------------------------------ hung and lost workers

FAST_FAIL = {
    "chat": {"priority": 1, "interactive": True, "first_byte_timeout_ms": 50},
    "embed": {"priority": 3},
}
TWO = [
    {"name": "w0", "url": "http://w0", "models": ["m"]},
    {"name": "w1", "url": "http://w1", "models": ["m"]},
]


def hung_on(bad: str) -> Handler:
    """w``bad`` accepts and never answers; the other answers at once."""

    async def handler(worker: str, path: str, body: dict[str, Any]) -> UpstreamResponse:
        if worker == bad:
            await asyncio.Event().wait()
        return FakeResponse(chunks=[OK_JSON])

    return handler


async def test_first_byte_limit_fails_over_to_another_worker() -> None:
    classes = {**FAST_FAIL}
    # the router's tie-break sends the first request to w0, which hangs
    async with running(hung_on("w0"), workers=TWO, classes=classes) as (gw, up):
        ex = await post(gw, COMPLETION).done()
        assert ex.status == 200 and ex.headers["x-hearthgate-worker"] == "w1"
        assert [p[0] for p in up.posts] == ["w0", "w1"]
        assert idle(gw)


async def test_first_byte_limit_alone_gives_503_with_retry_after() -> None:
    classes = {**FAST_FAIL}
    async with running(hung_on("w0"), classes=classes) as (gw, _):
        ex = await post(gw, COMPLETION).done()
        assert ex.status == 503 and "retry-after" in ex.headers
        assert "sent nothing within" in ex.json()["error"]["message"]
        assert idle(gw)


async def test_a_worker_marked_down_releases_its_requests_and_they_fail_over() -> None:
    async with running(hung_on("w0"), workers=TWO) as (gw, up):
        ex = post(gw, COMPLETION)
        await until(lambda: len(up.posts) == 1)
        gw.pool.mark_down(gw.pool.by_name["w0"], "health check timed out")
        await ex.done()
        assert ex.status == 200 and ex.headers["x-hearthgate-worker"] == "w1"
        assert idle(gw)


async def test_a_worker_marked_down_mid_stream_ends_the_stream_with_an_error_event() -> None:
    resp = FakeResponse(chunks=token_chunks(2, usage=False)[:-1], hang=True)
    async with running(answer(resp)) as (gw, _):
        ex = post(gw, STREAM)
        await until(lambda: resp.sent >= 2 and ex.status == 200)
        gw.pool.mark_down(gw.pool.by_name["w0"], "gone")
        await ex.done()
        events = ex.events()
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"]["code"] == "no_worker_available"
        assert idle(gw)


async def test_queued_requests_for_a_model_without_a_healthy_worker_get_503_at_once() -> None:
    workers = [
        {"name": "w0", "url": "http://w0", "models": ["m"], "limits": {"max_in_flight": 1}},
        {"name": "e0", "url": "http://e0", "models": ["other"]},
    ]
    async with running(hung_on("w0"), workers=workers) as (gw, up):
        first = post(gw, COMPLETION)
        await until(lambda: len(up.posts) == 1)
        queued = post(gw, COMPLETION)
        await until(lambda: gw.scheduler.queued_count == 1)
        up.down.add("w0")
        gw.pool.mark_down(gw.pool.by_name["w0"], "gone")
        for ex in (first, queued):
            await ex.done()
            assert ex.status == 503 and "retry-after" in ex.headers
        assert idle(gw)


async def test_refused_connection_with_no_other_worker_is_503() -> None:
    async with running(answer(FakeResponse(chunks=[OK_JSON]))) as (gw, up):
        up.down.add("w0")
        ex = await post(gw, COMPLETION).done()
        assert ex.status == 503 and ex.headers["retry-after"]
        assert gw.pool.by_name["w0"].up is False and idle(gw)


async def test_a_dropped_connection_is_retried_once() -> None:
    calls = 0

    async def handler(worker: str, path: str, body: dict[str, Any]) -> UpstreamResponse:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise WorkerUnreachable(worker, refused=False)
        return FakeResponse(chunks=[OK_JSON])

    async with running(handler) as (gw, _):
        ex = await post(gw, COMPLETION).done()
        assert ex.status == 200 and calls == 2 and idle(gw)


# ------------------------------------------------------------------ shedding and bounds


async def test_per_app_queue_cap_and_queued_bytes_cap_answer_429() -> None:
    resp = FakeResponse(hang=True)
    workers = [{"name": "w0", "url": "http://w0", "models": ["m"], "limits": {"max_in_flight": 1}}]
    apps = [{"name": "a", "max_queued": 1}]
    async with running(answer(resp), workers=workers, apps=apps) as (gw, up):
        running_ex = post(gw, COMPLETION)
        await until(lambda: len(up.posts) == 1)
        queued = post(gw, COMPLETION)
        await until(lambda: gw.scheduler.queued_count == 1)
        shed = await post(gw, COMPLETION).done()
        assert shed.status == 429 and shed.json()["error"]["code"] == "app_queue_full"
        assert "retry-after" in shed.headers
        for ex in (queued, running_ex):
            ex.disconnect()
            await ex.done()
        assert idle(gw)
    limits = {"max_queued_bytes": 1024}
    big = {**COMPLETION, "prompt": "x" * 900}
    async with running(answer(resp), workers=workers, limits=limits) as (gw, up):
        first = post(gw, big)
        await until(lambda: len(up.posts) == 1)
        queued = post(gw, big)
        await until(lambda: gw.scheduler.queued_count == 1)
        shed = await post(gw, big).done()
        assert shed.status == 429 and shed.json()["error"]["code"] == "queue_bytes_full"
        for ex in (queued, first):
            ex.disconnect()
            await ex.done()
        assert idle(gw)


async def test_bad_bodies_get_400_in_openai_shape() -> None:
    async with running(answer(FakeResponse(chunks=[OK_JSON]))) as (gw, up):
        bodies: list[bytes] = [
            b"[" * 5000 + b"]" * 5000,  # deeper than the parser's recursion limit
            b'{"model": "m", "prompt": ' + b"[" * 100 + b"]" * 100 + b"}",
            b'{"model": "m", "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}",
            b'{"model": "m", "prompt": "x", "max_tokens": NaN}',
            b'{"model": "m", "prompt": "x", "max_tokens": 99999999999999}',
            b'{"model": "m", "prompt": "x", "n": 1000}',
        ]
        for raw in bodies:
            ex = await post(gw, raw).done()
            assert ex.status == 400, raw[:60]
            err = ex.json()["error"]
            assert err["type"] == "invalid_request_error" and err["message"]
        many = {"model": "m", "input": [""] * 3000}
        ex = await post(gw, many, "/v1/embeddings").done()
        assert ex.status == 400 and "at most 2048" in ex.json()["error"]["message"]
        assert not up.posts and idle(gw)


async def test_n_counts_in_the_output_budget() -> None:
    seen: list[int] = []
    async with running(answer(FakeResponse(chunks=[OK_JSON]))) as (gw, _):
        orig = gw.scheduler.enqueue

        def spy(req: Any, now: float, *rates: float) -> Any:
            seen.append(req.max_tokens)
            return orig(req, now, *rates)

        gw.scheduler.enqueue = spy  # type: ignore[method-assign]
        await post(gw, {**COMPLETION, "n": 3}).done()
        assert seen == [12]


async def test_tools_count_as_prompt_tokens_and_can_make_a_request_rag() -> None:
    tools = [{"type": "function", "function": {"name": "f", "description": "d" * 8000}}]
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    rules = [{"min_prompt_tokens": 1500, "class": "rag"}]
    async with running(answer(FakeResponse(chunks=[OK_JSON])), rules=rules) as (gw, _):
        await post(gw, body, "/v1/chat/completions").done()
        assert gw.scheduler.queue_stats()["rag"].dispatched_tokens > 2000


# ------------------------------------------------------------------ shutdown


async def test_shutdown_answers_queued_with_503_and_cuts_streams_after_the_drain() -> None:
    stream = FakeResponse(chunks=token_chunks(1, usage=False)[:-1], hang=True)
    workers = [{"name": "w0", "url": "http://w0", "models": ["m"], "limits": {"max_in_flight": 1}}]
    async with running(answer(stream), workers=workers, shutdown={"drain_s": 0.2}) as (gw, _):
        streaming = post(gw, STREAM)
        await until(lambda: stream.sent >= 1 and streaming.status == 200)
        queued = post(gw, COMPLETION)
        await until(lambda: gw.scheduler.queued_count == 1)
        gw.begin_drain()
        await queued.done()
        assert queued.status == 503 and queued.json()["error"]["code"] == "shutting_down"
        assert "retry-after" in queued.headers
        new = await post(gw, COMPLETION).done()
        assert new.status == 503
        assert not streaming.task.done()  # the stream may still finish during the drain
        await streaming.done()
        assert streaming.events()[-1] == "[DONE]"
        assert json.loads(streaming.events()[-2])["error"]["code"] == "shutting_down"
        assert idle(gw)


async def test_coalesced_embeddings_leave_nothing_behind() -> None:
    async def handler(worker: str, path: str, body: dict[str, Any]) -> UpstreamResponse:
        items = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = [{"index": i, "embedding": [0.0, float(i)]} for i in range(len(items))]
        usage = {"prompt_tokens": 2 * len(items), "total_tokens": 2 * len(items)}
        return FakeResponse(chunks=[json.dumps({"data": data, "usage": usage}).encode()])

    async with running(handler) as (gw, _):
        exs = [post(gw, {"model": "m", "input": f"t{i}"}, "/v1/embeddings") for i in range(5)]
        leaving = post(gw, {"model": "m", "input": "bye"}, "/v1/embeddings")
        leaving.disconnect()
        for ex in exs:
            await ex.done()
            assert ex.status == 200
        await leaving.done()
        assert idle(gw)


async def test_an_answer_that_breaks_before_the_first_byte_fails_over() -> None:
    async def handler(worker: str, path: str, body: dict[str, Any]) -> UpstreamResponse:
        if worker == "w0":  # headers, then the worker dies before its first event
            return FakeResponse(chunks=[], fail=UpstreamFailed("payload broke"))
        return FakeResponse(chunks=token_chunks(2))

    async with running(handler, workers=TWO) as (gw, _):
        ex = await post(gw, STREAM).done()
        assert ex.status == 200 and ex.headers["x-hearthgate-worker"] == "w1"
        assert ex.events()[-1] == "[DONE]" and idle(gw)


async def test_a_worker_that_dies_before_the_first_byte_gives_503_not_502() -> None:
    async def handler(worker: str, path: str, body: dict[str, Any]) -> UpstreamResponse:
        up.down.add(worker)  # the process is gone: the next connection is refused
        return FakeResponse(chunks=[], fail=UpstreamFailed("payload broke"))

    up = FakeUpstream(handler)
    gw = Gateway(settings(), upstream=up)
    await gw.start()
    try:
        ex = await post(gw, STREAM).done()
        assert ex.status == 503 and "retry-after" in ex.headers
        assert idle(gw)
    finally:
        await gw.stop()


async def test_a_route_the_worker_lacks_gets_an_openai_shaped_error() -> None:
    nf = FakeResponse(status=404, chunks=[b'{"detail":"Not Found"}'])
    async with running(answer(nf)) as (gw, _):
        ex = await post(gw, {"model": "m", "input": "x"}, "/v1/embeddings").done()
        assert ex.status == 404
        err = ex.json()["error"]
        assert err["code"] == "unsupported_endpoint" and "/v1/embeddings" in err["message"]
    plain = FakeResponse(status=400, chunks=[b"bad things"])
    async with running(answer(plain)) as (gw, _):
        ex = await post(gw, COMPLETION).done()
        assert ex.status == 400 and "bad things" in ex.json()["error"]["message"]


async def test_unknown_paths_and_trailing_slashes_are_openai_shaped_404s() -> None:
    import httpx

    from hearthgate.gateway.app import create_app

    app = create_app(settings(), upstream=FakeUpstream(answer(FakeResponse(chunks=[OK_JSON]))))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        for path in ("/v1/completions/", "/v1/nothing"):
            r = await client.post(path, json=COMPLETION)
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


async def test_a_client_that_leaves_while_uploading_gets_nothing_and_holds_nothing() -> None:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if not sent:
            sent.append({})
            return {"type": "http.request", "body": b'{"model": "m", ', "more_body": True}
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions",
        "headers": [(b"content-type", b"application/json")],
        "query_string": b"",
    }
    async with running(answer(FakeResponse(chunks=[OK_JSON]))) as (gw, up):
        await gw.serve(scope, receive, send)
        assert sent == [{}]  # no response started for a client that left
        assert idle(gw) and gw.leases.opened == 0 and not up.posts
