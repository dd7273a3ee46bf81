"""The OpenAI Batch and Files API (gateway/batches/) end to end, in-process: the real app
with its lifespan (runner included), a real Redis (tests/redis_support.py), a FakeUpstream
standing in for the workers, and the official OpenAI SDK over httpx's ASGI transport.

Tests wait on observable state (``until``, or polling the API), never on fixed sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

import httpx
import openai
import pytest
from openai import AsyncOpenAI
from openai.types import Batch
from redis.asyncio import Redis

from hearthgate.deploy.redis_server import RedisServer
from hearthgate.gateway.app import create_app
from hearthgate.gateway.batches.runner import BatchRunner
from hearthgate.gateway.batches.service import BatchService
from hearthgate.gateway.settings import Settings
from hearthgate.gateway.upstream import UpstreamResponse
from tests.inprocess import FakeResponse, FakeUpstream, settings, until

Endpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]
CHAT: Final = "/v1/chat/completions"
EMB: Final = "/v1/embeddings"
ENDED = ("completed", "failed", "expired", "cancelled")

Handler = Callable[[str, str, dict[str, Any]], Awaitable[UpstreamResponse]]


# ---------------------------------------------------------------- upstream answers


def chat_ok(content: str = "hi") -> FakeResponse:
    return FakeResponse(
        200,
        [
            json.dumps(
                {
                    "id": "cmpl",
                    "object": "chat.completion",
                    "model": "m",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": content},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
                }
            ).encode()
        ],
    )


def embeddings_ok(body: dict[str, Any]) -> FakeResponse:
    """One vector per input item: ``[n]`` for the text ``"text n"``, so a caller can tell
    its own vector from another's after coalescing split the answer back."""
    items = body["input"] if isinstance(body["input"], list) else [body["input"]]
    data = [
        {"object": "embedding", "index": i, "embedding": [float(item.split()[-1])]}
        for i, item in enumerate(items)
    ]
    usage = {"prompt_tokens": 2 * len(items), "total_tokens": 2 * len(items)}
    return FakeResponse(
        200, [json.dumps({"object": "list", "data": data, "model": "m", "usage": usage}).encode()]
    )


def error_answer(status: int, message: str) -> FakeResponse:
    err = {"error": {"message": message, "type": "BadRequestError", "code": status}}
    return FakeResponse(status, [json.dumps(err).encode()])


def content_of(body: dict[str, Any]) -> str:
    """The user message of a chat body: the tests put the line's custom_id there."""
    return str(body["messages"][-1]["content"])


async def instant(worker: str, path: str, body: dict[str, Any]) -> UpstreamResponse:
    if path == EMB:
        return embeddings_ok(body)
    return chat_ok("re: " + content_of(body))


class Gate:
    """A handler whose chosen calls hang until ``open()`` (or until the gateway gives up on
    them: their task is cancelled, which is recorded)."""

    def __init__(self, hold: Callable[[str], bool] = lambda cid: True) -> None:
        self.hold = hold
        self.opened = asyncio.Event()
        self.calls: list[str] = []  # every call's content, in order
        self.waiting: list[str] = []  # calls hanging now
        self.cancelled: list[str] = []  # hanging calls the gateway aborted

    def open(self) -> None:
        self.opened.set()

    async def __call__(self, worker: str, path: str, body: dict[str, Any]) -> UpstreamResponse:
        cid = content_of(body)
        self.calls.append(cid)
        if self.hold(cid) and not self.opened.is_set():
            self.waiting.append(cid)
            try:
                await self.opened.wait()
            except asyncio.CancelledError:
                self.cancelled.append(cid)
                raise
            finally:
                self.waiting.remove(cid)
        return chat_ok("re: " + cid)


# ---------------------------------------------------------------- input files


def chat_line(cid: str, **over: Any) -> dict[str, Any]:
    line: dict[str, Any] = {
        "custom_id": cid,
        "method": "POST",
        "url": CHAT,
        "body": {"model": "m", "messages": [{"role": "user", "content": cid}], "max_tokens": 5},
    }
    line.update(over)
    return line


def chat_body(cid: str, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": cid}]}
    body.update(fields)
    return body


def jsonl(*lines: dict[str, Any] | str) -> bytes:
    return (
        "\n".join(ln if isinstance(ln, str) else json.dumps(ln) for ln in lines) + "\n"
    ).encode()


def chat_file(ids: list[str]) -> bytes:
    return jsonl(*(chat_line(c) for c in ids))


def parse_jsonl(text: str) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in text.splitlines() if ln.strip()]


# ---------------------------------------------------------------- the app


@dataclass
class Gw:
    app: Any
    http: httpx.AsyncClient
    upstream: FakeUpstream

    def sdk(self, key: str = "sk-test") -> AsyncOpenAI:
        # Some openai versions type http_client as another package's client (httpx2); an
        # httpx client over the ASGI transport works with all of them.
        http = cast(Any, self.http)
        return AsyncOpenAI(
            base_url="http://127.0.0.1/v1", api_key=key, http_client=http, max_retries=0
        )

    @property
    def service(self) -> BatchService:
        svc = self.app.state.batches
        assert svc is not None, "the app was built without redis.url"
        return svc  # type: ignore[no-any-return]

    @property
    def runner(self) -> BatchRunner:
        return self.service.runner

    async def upload(self, content: bytes, key: str = "sk-test", name: str = "in.jsonl") -> str:
        f = await self.sdk(key).files.create(file=(name, content), purpose="batch")
        return f.id

    async def create(self, fid: str, endpoint: Endpoint = CHAT, key: str = "sk-test") -> Batch:
        return await self.sdk(key).batches.create(
            input_file_id=fid, endpoint=endpoint, completion_window="24h"
        )

    async def submit(
        self, content: bytes, endpoint: Endpoint = CHAT, key: str = "sk-test"
    ) -> Batch:
        return await self.create(await self.upload(content, key), endpoint, key)

    async def wait(
        self, bid: str, statuses: tuple[str, ...] = ENDED, key: str = "sk-test", timeout: float = 10
    ) -> Batch:
        """Poll the batch until its status is one of ``statuses``."""
        client = self.sdk(key)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            b = await client.batches.retrieve(bid)
            if b.status in statuses:
                return b
            if loop.time() > deadline:
                raise AssertionError(f"batch {bid} is {b.status}, not {statuses} after {timeout} s")
            await asyncio.sleep(0.02)

    async def content(self, fid: str | None, key: str = "sk-test") -> list[dict[str, Any]]:
        if fid is None:
            return []
        got = await self.sdk(key).files.content(fid)
        return parse_jsonl(got.text)


@contextlib.asynccontextmanager
async def running(s: Settings, handler: Handler = instant) -> AsyncIterator[Gw]:
    upstream = FakeUpstream(handler)
    app = create_app(s, upstream=upstream)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            yield Gw(app, http, upstream)


def with_redis(url: str, **extra: Any) -> Settings:
    batch = extra.pop("batch", {})
    redis = {"url": url, **extra.pop("redis", {})}
    return settings(redis=redis, batch=batch, **extra)


def ids_of(lines: list[dict[str, Any]]) -> list[str]:
    return [ln["custom_id"] for ln in lines]


def error_of(resp: httpx.Response) -> dict[str, Any]:
    err = resp.json()["error"]
    assert isinstance(err, dict)
    return err


async def live_chat(gw: Gw, content: str = "live") -> httpx.Response:
    return await gw.http.post(CHAT, json=chat_body(content))


# ---------------------------------------------------------------- the round trip


async def test_sdk_round_trip_in_input_order(redis_url: str) -> None:
    ids = [f"c{i}" for i in range(25)]
    order = [*ids[::2], *ids[1::2]]  # not sorted: the output must follow the file
    content = chat_file(order)
    async with running(with_redis(redis_url)) as gw:
        client = gw.sdk()
        f = await client.files.create(file=("in.jsonl", content), purpose="batch")
        assert (f.purpose, f.bytes, f.filename, f.status) == (
            "batch",
            len(content),
            "in.jsonl",
            "processed",
        )
        assert (await client.files.content(f.id)).content == content
        b = await client.batches.create(
            input_file_id=f.id,
            endpoint=CHAT,
            completion_window="24h",
            metadata={"job": "nightly"},
        )
        assert b.status in ("validating", "in_progress")
        assert b.request_counts is not None and b.request_counts.total == 25
        b = await gw.wait(b.id)
        assert b.status == "completed", b
        assert b.request_counts is not None
        counts = b.request_counts
        assert (counts.total, counts.completed, counts.failed) == (25, 25, 0)
        assert b.metadata == {"job": "nightly"}
        assert b.in_progress_at and b.finalizing_at and b.completed_at
        assert b.error_file_id is None and b.output_file_id is not None
        out = await gw.content(b.output_file_id)
        assert ids_of(out) == order  # every custom_id exactly once, in input order
        for ln in out:
            assert ln["error"] is None
            assert ln["response"]["status_code"] == 200
            msg = ln["response"]["body"]["choices"][0]["message"]["content"]
            assert msg == "re: " + ln["custom_id"]  # each line got its own answer
        assert len({ln["id"] for ln in out}) == 25
        meta = await client.files.retrieve(b.output_file_id)
        assert meta.purpose == "batch_output"
        assert meta.bytes == len((await client.files.content(b.output_file_id)).content)
        assert sorted(body["messages"][0]["content"] for _, _, body in gw.upstream.posts) == sorted(
            ids
        )


async def test_embeddings_lines_are_coalesced_and_split_back(redis_url: str) -> None:
    n = 40
    lines = [
        {
            "custom_id": f"e{i}",
            "method": "POST",
            "url": EMB,
            "body": {"model": "m", "input": f"text {i}"},
        }
        for i in range(n)
    ]
    async with running(with_redis(redis_url)) as gw:
        b = await gw.wait((await gw.submit(jsonl(*lines), EMB)).id)
        assert b.status == "completed"
        assert b.request_counts is not None and b.request_counts.completed == n
        out = await gw.content(b.output_file_id)
        assert ids_of(out) == [f"e{i}" for i in range(n)]
        for i, ln in enumerate(out):
            data = ln["response"]["body"]["data"]
            assert [(d["index"], d["embedding"]) for d in data] == [(0, [float(i)])], ln
        calls = [body for _, path, body in gw.upstream.posts if path == EMB]
        items = [
            x
            for body in calls
            for x in (body["input"] if isinstance(body["input"], list) else [body["input"]])
        ]
        # Every line's input went upstream exactly once.
        assert sorted(items) == sorted(f"text {i}" for i in range(n))
        # The runner claims all 40 lines in one read and queues them together, well within
        # one batching window: the worker sees fewer calls than lines (how many fewer
        # depends on timing).
        assert 1 <= len(calls) < n, f"{n} lines, {len(calls)} upstream calls: no coalescing"


# ---------------------------------------------------------------- refused input


async def _no_batches(gw: Gw) -> None:
    listed = (await gw.http.get("/v1/batches")).json()
    assert listed["data"] == [], listed
    assert await gw.service.store.active() == []


async def test_upload_not_json_names_the_line_and_stores_nothing(redis_url: str) -> None:
    async with running(with_redis(redis_url)) as gw:
        content = jsonl(chat_line("a"), "{not json", chat_line("c"))
        r = await gw.http.post(
            "/v1/files", files={"file": ("x.jsonl", content)}, data={"purpose": "batch"}
        )
        assert r.status_code == 400
        err = error_of(r)
        assert "line 2: not valid JSON" in err["message"] and err["code"] == "invalid_batch_file"
        assert (await gw.http.get("/v1/files")).json()["data"] == []


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        (chat_line("a"), "line 3: custom_id 'a' repeats line 1"),
        (chat_line("x", url=EMB), "line 3: 'url' is \"/v1/embeddings\""),
        (
            chat_line("x", body=chat_body("x", stream=True)),
            "line 3: 'stream': true is not supported",
        ),
        (
            chat_line("x", body=chat_body("x", model="gpt-9")),
            "line 3: model 'gpt-9' does not exist",
        ),
        (chat_line("x", body=chat_body("x" * 2000)), "line 3: 'body' is"),
        (chat_line("x", body=chat_body("x", n=50)), "line 3: 'n' must be between 1 and 8"),
        (chat_line("x", method="GET"), "line 3: 'method' must be \"POST\""),
        ({"method": "POST", "url": CHAT, "body": chat_body("x")}, "line 3: 'custom_id'"),
    ],
)
async def test_batch_creation_refuses_bad_lines_naming_them(
    redis_url: str, bad: dict[str, Any], needle: str
) -> None:
    s = with_redis(redis_url, limits={"max_body_bytes": 1024})
    async with running(s) as gw:
        fid = await gw.upload(jsonl(chat_line("a"), chat_line("b"), bad, chat_line("d")))
        r = await gw.http.post(
            "/v1/batches",
            json={"input_file_id": fid, "endpoint": CHAT, "completion_window": "24h"},
        )
        assert r.status_code == 400, r.text
        err = error_of(r)
        assert needle in err["message"], err
        assert err["code"] == "invalid_batch_file"
        await _no_batches(gw)
        assert gw.upstream.posts == []


async def test_batch_creation_lists_many_problems_with_and_n_more(redis_url: str) -> None:
    async with running(with_redis(redis_url)) as gw:
        fid = await gw.upload(jsonl(*(chat_line(f"x{i}", method="GET") for i in range(8))))
        with pytest.raises(openai.BadRequestError) as exc:
            await gw.create(fid)
        msg = str(exc.value)
        assert [int(n) for n in re.findall(r"line (\d+): ", msg)] == [1, 2, 3, 4, 5]
        assert "(and 3 more)" in msg
        await _no_batches(gw)


async def test_upload_refusals(redis_url: str) -> None:
    s = with_redis(redis_url, batch={"max_file_bytes": 1024, "max_lines": 3})
    async with running(s) as gw:
        ok = chat_file(["a"])

        async def upload(**kw: Any) -> httpx.Response:
            return await gw.http.post("/v1/files", **kw)

        r = await upload(files={"file": ("x.jsonl", ok)}, data={"purpose": "fine-tune"})
        assert (
            r.status_code == 400
            and "purpose 'fine-tune' is not supported" in error_of(r)["message"]
        )
        r = await upload(files={"file": ("x.jsonl", ok)})
        assert r.status_code == 400 and "'purpose'" in error_of(r)["message"]
        # Multipart, but 'file' is a plain field, not a file part.
        r = await upload(files={"purpose": (None, b"batch"), "file": (None, b"not a file")})
        assert r.status_code == 400 and "missing form field 'file'" in error_of(r)["message"]
        r = await upload(
            content=b"\x00garbage\r\n--nope",
            headers={"content-type": "multipart/form-data; boundary=xyz"},
        )
        assert r.status_code == 400, r.text
        assert error_of(r)["type"] == "invalid_request_error"
        r = await upload(content=b"--", headers={"content-type": "multipart/form-data"})
        assert r.status_code == 400, r.text
        r = await upload(json={"purpose": "batch", "file": "x"})
        assert r.status_code == 400 and "multipart/form-data" in error_of(r)["message"]
        # A file a little over batch.max_file_bytes: read, then refused by its size.
        r = await upload(files={"file": ("x.jsonl", b" " * 1025)}, data={"purpose": "batch"})
        assert r.status_code == 400, r.text
        assert error_of(r)["code"] == "file_too_large"
        assert "batch.max_file_bytes is 1024" in error_of(r)["message"]
        # Far over: refused before the body is read.
        r = await upload(files={"file": ("x.jsonl", b" " * 200_000)}, data={"purpose": "batch"})
        assert r.status_code == 413, r.text
        assert error_of(r)["type"] == "invalid_request_error"
        r = await upload(
            files={"file": ("x.jsonl", chat_file(["a", "b", "c", "d"]))}, data={"purpose": "batch"}
        )
        assert r.status_code == 400 and error_of(r)["code"] == "too_many_lines"
        assert "batch.max_lines is 3" in error_of(r)["message"]
        assert (await gw.http.get("/v1/files")).json()["data"] == []
        # Still working after all of that.
        r = await upload(files={"file": ("x.jsonl", ok)}, data={"purpose": "batch"})
        assert r.status_code == 200, r.text


async def test_batch_request_refusals(redis_url: str) -> None:
    async with running(with_redis(redis_url)) as gw:
        fid = await gw.upload(chat_file(["a", "b"]))

        async def create(**body: Any) -> httpx.Response:
            return await gw.http.post(
                "/v1/batches",
                json={"input_file_id": fid, "endpoint": CHAT, "completion_window": "24h", **body},
            )

        r = await create(completion_window="1h")
        assert (
            r.status_code == 400 and "'completion_window' must be \"24h\"" in error_of(r)["message"]
        )
        r = await create(endpoint="/v1/audio/speech")
        assert r.status_code == 400 and "'endpoint' must be one of" in error_of(r)["message"]
        r = await create(input_file_id=None)
        assert r.status_code == 400 and "'input_file_id' is required" in error_of(r)["message"]
        r = await create(metadata={"k": 1})
        assert r.status_code == 400 and "'metadata'" in error_of(r)["message"]
        r = await create(input_file_id="file-nope")
        assert r.status_code == 404 and error_of(r)["code"] == "file_not_found"
        r = await gw.http.post(
            "/v1/batches", content=b"{nope", headers={"content-type": "application/json"}
        )
        assert r.status_code == 400
        # A batch's lines must fit its endpoint: a chat file is not an embeddings batch.
        r = await create(endpoint=EMB)
        assert r.status_code == 400 and "line 1: 'url' is" in error_of(r)["message"]
        await _no_batches(gw)
        # Output files are not batch input.
        b = await gw.wait((await gw.create(fid)).id)
        r = await create(input_file_id=b.output_file_id)
        assert r.status_code == 400 and 'not "batch"' in error_of(r)["message"]


async def test_unknown_ids_are_404(redis_url: str) -> None:
    async with running(with_redis(redis_url)) as gw:
        for method, path in [
            ("GET", "/v1/files/file-nope"),
            ("GET", "/v1/files/file-nope/content"),
            ("DELETE", "/v1/files/file-nope"),
            ("GET", "/v1/batches/batch_nope"),
            ("POST", "/v1/batches/batch_nope/cancel"),
        ]:
            r = await gw.http.request(method, path)
            assert r.status_code == 404, (method, path, r.text)
            assert error_of(r)["code"] in ("file_not_found", "batch_not_found")
            assert "nope" in error_of(r)["message"]
        client = gw.sdk()
        with pytest.raises(openai.NotFoundError):
            await client.files.retrieve("file-nope")
        with pytest.raises(openai.NotFoundError):
            await client.batches.retrieve("batch_nope")


async def test_bad_list_parameters_are_400(redis_url: str) -> None:
    async with running(with_redis(redis_url)) as gw:
        for path in [
            "/v1/batches?limit=0",
            "/v1/batches?limit=-1",
            "/v1/batches?limit=abc",
            "/v1/batches?limit=101",
            "/v1/files?limit=0",
            "/v1/files?limit=10001",
            "/v1/files?limit=1.5",
            "/v1/files?order=sideways",
        ]:
            r = await gw.http.get(path)
            assert r.status_code == 400, (path, r.text)
            assert "'limit'" in error_of(r)["message"] or "'order'" in error_of(r)["message"]
        assert (await gw.http.get("/v1/batches?limit=100")).status_code == 200
        assert (await gw.http.get("/v1/files?limit=10000&order=asc")).status_code == 200


# ---------------------------------------------------------------- ownership


async def test_each_app_sees_only_its_own_files_and_batches(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HG_TEST_KEY_A", "key-a")
    monkeypatch.setenv("HG_TEST_KEY_B", "key-b")
    apps = [{"name": "a", "key_env": "HG_TEST_KEY_A"}, {"name": "b", "key_env": "HG_TEST_KEY_B"}]
    async with running(with_redis(redis_url, apps=apps)) as gw:
        a, b = gw.sdk("key-a"), gw.sdk("key-b")
        fid = await gw.upload(chat_file(["x", "y"]), key="key-a")
        done = await gw.wait((await gw.create(fid, key="key-a")).id, key="key-a")
        assert done.status == "completed" and done.output_file_id is not None
        for call in (
            lambda: b.files.retrieve(fid),
            lambda: b.files.content(fid),
            lambda: b.files.content(done.output_file_id or ""),
            lambda: b.files.delete(fid),
            lambda: b.batches.retrieve(done.id),
            lambda: b.batches.cancel(done.id),
            lambda: b.batches.create(input_file_id=fid, endpoint=CHAT, completion_window="24h"),
        ):
            with pytest.raises(openai.NotFoundError):
                await call()
        assert (await b.files.list()).data == []
        assert (await b.batches.list()).data == []
        fid_b = await gw.upload(chat_file(["z"]), key="key-b")
        assert [f.id for f in (await b.files.list()).data] == [fid_b]
        assert {f.id for f in (await a.files.list()).data} == {fid, done.output_file_id}
        assert [x.id for x in (await a.batches.list()).data] == [done.id]
        assert (await a.files.retrieve(fid)).id == fid  # A still has it all
        assert (await a.batches.retrieve(done.id)).status == "completed"
        # No key, or a wrong one: 401, not someone's files.
        assert (await gw.http.get("/v1/files")).status_code == 401
        r = await gw.http.get("/v1/files", headers={"authorization": "Bearer nope"})
        assert r.status_code == 401
        # The lines ran as app a, in the batch class (its fair share is charged for them).
        rec = await gw.service.store.batch_record(done.id)
        assert rec is not None and rec["owner"] == "a"
        metrics = (await gw.http.get("/metrics")).text
        assert re.search(
            r'^hearthgate_admitted_total\{app="a",cls="batch"\} 2(\.0)?$', metrics, re.M
        ), [ln for ln in metrics.splitlines() if ln.startswith("hearthgate_admitted")]


async def test_without_keys_everything_belongs_to_anonymous(redis_url: str) -> None:
    async with running(with_redis(redis_url, apps=[{"name": "open"}])) as gw:
        fid = await gw.upload(chat_file(["x"]), key="one-key")
        b = await gw.wait((await gw.create(fid, key="one-key")).id, key="another-key")
        assert b.status == "completed"
        other = gw.sdk("another-key")
        assert (await other.files.retrieve(fid)).id == fid
        assert [x.id for x in (await other.batches.list()).data] == [b.id]
        r = Redis.from_url(redis_url, decode_responses=True)
        try:
            assert fid in await r.zrange("hearthgate:files:anonymous", 0, -1)
            assert await r.zrange("hearthgate:batches:anonymous", 0, -1) == [b.id]
            assert await r.hget(f"hearthgate:batch:{b.id}", "owner") == "anonymous"
        finally:
            await r.aclose()


# ---------------------------------------------------------------- cancel, expiry


async def test_cancel_aborts_running_lines_and_keeps_what_finished(redis_url: str) -> None:
    ids = [f"c{i}" for i in range(10)]
    gate = Gate(hold=lambda cid: cid not in ("c0", "c1"))
    s = with_redis(redis_url, batch={"max_waiting": 4})
    async with running(s, gate) as gw:
        b = await gw.submit(chat_file(ids))
        await until(lambda: len(gate.waiting) == 4, what="4 lines hanging upstream")
        b = await gw.wait(b.id, statuses=("in_progress",))
        assert b.request_counts is not None and b.request_counts.completed == 2
        status = (await gw.http.get("/status")).json()["batches"]
        (seen,) = status["batches"]
        assert (seen["id"], seen["app"], seen["running_here"]) == (b.id, "anonymous", 4)
        metrics = (await gw.http.get("/metrics")).text
        assert re.search(r'^hearthgate_batch_lines\{state="running"\} 4(\.0)?$', metrics, re.M)
        cancelling = await gw.sdk().batches.cancel(b.id)
        assert cancelling.status == "cancelling"
        assert cancelling.cancelling_at is not None
        b = await gw.wait(b.id)
        assert b.status == "cancelled", b
        assert b.cancelled_at is not None
        hung = sorted(gate.cancelled)
        assert len(hung) == 4 and gate.waiting == [], "the hanging upstream calls were not aborted"
        out = await gw.content(b.output_file_id)
        err = await gw.content(b.error_file_id)
        assert ids_of(out) == ["c0", "c1"]
        assert ids_of(err) == ids[2:]  # in input order, the aborted ones included
        assert Counter(ids_of(out) + ids_of(err)) == Counter(ids)
        for ln in err:
            assert ln["response"] is None
            assert ln["error"]["code"] == "batch_cancelled"
        assert not any(c in gate.calls for c in ids[6:]), "lines ran after the cancel"
        assert gw.runner.lines == {}
        # Cancelling again is harmless; an ended batch cannot be cancelled into anything else.
        r = await gw.http.post(f"/v1/batches/{b.id}/cancel")
        assert r.status_code in (200, 409) and (await gw.wait(b.id)).status == "cancelled"


async def test_cancel_of_a_completed_batch_is_409(redis_url: str) -> None:
    async with running(with_redis(redis_url)) as gw:
        b = await gw.wait((await gw.submit(chat_file(["a"]))).id)
        assert b.status == "completed"
        r = await gw.http.post(f"/v1/batches/{b.id}/cancel")
        assert r.status_code == 409, r.text
        assert "completed" in error_of(r)["message"]


async def test_expiry_ends_the_batch_with_batch_expired_lines(redis_url: str) -> None:
    ids = [f"c{i}" for i in range(6)]
    gate = Gate(hold=lambda cid: cid != "c0")
    # The window is counted in whole seconds from the creation second: 2 leaves at least 1.
    s = with_redis(redis_url, batch={"completion_window_s": 2, "max_waiting": 3})
    async with running(s, gate) as gw:
        b = await gw.submit(chat_file(ids))
        b = await gw.wait(b.id, timeout=8)
        assert b.status == "expired", b
        assert b.expired_at is not None
        out = await gw.content(b.output_file_id)
        err = await gw.content(b.error_file_id)
        assert ids_of(out) == ["c0"]
        assert ids_of(err) == ids[1:]
        for ln in err:
            assert ln["error"]["code"] == "batch_expired" and ln["response"] is None
        # c0 answered at once, so c3 took its place: c1..c3 hung until the expiry aborted them.
        assert gate.waiting == [] and sorted(gate.cancelled) == ["c1", "c2", "c3"]
        assert not any(c in gate.calls for c in ids[4:])
        assert b.request_counts is not None
        assert (b.request_counts.completed, b.request_counts.failed) == (1, 0)


# ---------------------------------------------------------------- fair share


async def test_two_apps_batches_interleave(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HG_TEST_KEY_A", "key-a")
    monkeypatch.setenv("HG_TEST_KEY_B", "key-b")
    apps = [{"name": "a", "key_env": "HG_TEST_KEY_A"}, {"name": "b", "key_env": "HG_TEST_KEY_B"}]
    gate = Gate()
    s = with_redis(redis_url, apps=apps, batch={"max_waiting": 4})
    async with running(s, gate) as gw:
        ba = await gw.submit(chat_file([f"a{i}" for i in range(12)]), key="key-a")
        await until(lambda: len(gw.runner.lines) == 4, what="app a fills the window")
        bb = await gw.submit(chat_file([f"b{i}" for i in range(12)]), key="key-b")
        gate.open()
        ra = await gw.wait(ba.id, key="key-a")
        rb = await gw.wait(bb.id, key="key-b")
        assert (ra.status, rb.status) == ("completed", "completed")
        order = [c[0] for c in gate.calls]
        assert Counter(order) == {"a": 12, "b": 12}
        first_b, last_a = order.index("b"), len(order) - 1 - order[::-1].index("a")
        assert first_b < last_a, f"app a's batch ran entirely before app b's started: {order}"
        # Once b has work, a's lines stop taking the whole window (4 ran while b was not
        # there yet, then at most its half): b starts with a third of a's lines still to go.
        assert first_b <= 8, f"app b waited for most of app a's batch: {order}"


async def test_one_apps_batches_run_side_by_side(redis_url: str) -> None:
    """An app's slow chat batch does not hold up its embeddings batch created after it:
    as lines finish, the app's window is refilled from both batches evenly (before, the
    older batch took all of it until it had nothing left to start)."""
    gate = Gate(hold=lambda cid: cid.startswith("c"))

    async def handler(worker: str, path: str, body: dict[str, Any]) -> UpstreamResponse:
        if path == EMB:
            return embeddings_ok(body)
        await asyncio.sleep(0.2)  # a slow worker for the long prompts
        return await gate(worker, path, body)

    s = with_redis(redis_url, batch={"max_waiting": 8})
    async with running(s, handler) as gw:
        chats = await gw.submit(chat_file([f"c{i}" for i in range(40)]))
        await until(lambda: len(gate.waiting) == 8, what="chat lines fill the window")
        lines = [
            {
                "custom_id": f"e{i}",
                "method": "POST",
                "url": EMB,
                "body": {"model": "m", "input": f"text {i}"},
            }
            for i in range(20)
        ]
        emb = await gw.submit(jsonl(*lines), endpoint=EMB)
        gate.open()
        done = await gw.wait(emb.id)
        assert done.status == "completed" and done.request_counts.completed == 20
        chat_now = await gw.sdk().batches.retrieve(chats.id)
        assert chat_now.status == "in_progress", "the embeddings batch waited for the chats"
        assert (await gw.wait(chats.id)).request_counts.completed == 40


async def test_lines_ending_together_wait_for_a_redis_connection(redis_url: str) -> None:
    """Many lines finishing at once need more Redis connections than the pool has: their
    writes wait their turn (redis.max_connections), nothing is reported as "Redis down"
    and the batch endpoints keep answering (before, redis-py's plain pool raised
    MaxConnectionsError past its limit: a 503 to the client and a paused runner)."""
    gate = Gate()
    s = with_redis(redis_url, redis={"max_connections": 2}, batch={"max_waiting": 40})
    async with running(s, gate) as gw:
        b = await gw.submit(chat_file([f"c{i}" for i in range(60)]))
        await until(lambda: len(gate.waiting) >= 8, what="lines running")
        gate.open()
        polls = [gw.sdk().batches.retrieve(b.id) for _ in range(10)]  # while they end
        assert all(p.id == b.id for p in await asyncio.gather(*polls))
        done = await gw.wait(b.id)
        assert done.status == "completed" and done.request_counts.completed == 60
        assert gw.runner.status()["redis"] == "up"


# ---------------------------------------------------------------- worker answers


async def test_a_worker_400_is_a_failed_line(redis_url: str) -> None:
    async def handler(worker: str, path: str, body: dict[str, Any]) -> UpstreamResponse:
        cid = content_of(body)
        if cid == "bad":
            return error_answer(400, "This model's maximum context length is 8 tokens")
        return chat_ok("re: " + cid)

    async with running(with_redis(redis_url), handler) as gw:
        b = await gw.wait((await gw.submit(chat_file(["a", "bad", "c"]))).id)
        assert b.status == "completed"
        assert b.request_counts is not None
        assert (b.request_counts.completed, b.request_counts.failed) == (2, 1)
        assert ids_of(await gw.content(b.output_file_id)) == ["a", "c"]
        (err,) = await gw.content(b.error_file_id)
        assert err["custom_id"] == "bad" and err["error"] is None
        assert err["response"]["status_code"] == 400
        assert "maximum context length" in json.dumps(err["response"]["body"])
        assert sum(1 for _, _, body in gw.upstream.posts if content_of(body) == "bad") == 1


async def test_a_worker_503_or_429_is_retried_not_failed(redis_url: str) -> None:
    seen: Counter[str] = Counter()

    async def handler(worker: str, path: str, body: dict[str, Any]) -> UpstreamResponse:
        cid = content_of(body)
        seen[cid] += 1
        # A worker's 503 comes back as 503 (no other worker to fail over to) and its 429
        # as 429: the runner waits and runs the line again.
        if cid == "busy" and seen[cid] == 1:
            return error_answer(503, "engine is restarting")
        if cid == "limited" and seen[cid] <= 2:
            return error_answer(429, "too many requests")
        return chat_ok("re: " + cid)

    async with running(with_redis(redis_url), handler) as gw:
        b = await gw.wait((await gw.submit(chat_file(["a", "busy", "limited"]))).id)
        assert b.status == "completed"
        assert b.request_counts is not None
        assert (b.request_counts.completed, b.request_counts.failed) == (3, 0)
        assert b.error_file_id is None
        out = await gw.content(b.output_file_id)
        assert ids_of(out) == ["a", "busy", "limited"]
        assert all(ln["response"]["status_code"] == 200 for ln in out)
        assert seen == {"a": 1, "busy": 2, "limited": 3}


# ---------------------------------------------------------------- no Redis


async def test_without_redis_the_batch_api_answers_503_and_live_traffic_goes_on() -> None:
    async with running(settings()) as gw:
        assert gw.app.state.batches is None
        for method, path in [
            ("GET", "/v1/batches"),
            ("GET", "/v1/files"),
            ("GET", "/v1/batches/batch_x"),
            ("POST", "/v1/batches/batch_x/cancel"),
            ("GET", "/v1/files/file-x/content"),
        ]:
            r = await gw.http.request(method, path)
            assert r.status_code == 503, (path, r.text)
            assert "redis.url" in error_of(r)["message"]
            assert error_of(r)["code"] == "batches_not_configured"
        r = await gw.http.post(
            "/v1/files", files={"file": ("x.jsonl", chat_file(["a"]))}, data={"purpose": "batch"}
        )
        assert r.status_code == 503 and "redis.url" in error_of(r)["message"]
        with pytest.raises(openai.APIStatusError) as exc:
            await gw.sdk().batches.create(
                input_file_id="file-x", endpoint=CHAT, completion_window="24h"
            )
        assert exc.value.status_code == 503
        ready = await gw.http.get("/readyz")
        assert ready.status_code == 200 and ready.json()["redis"] == "not configured"
        assert (await gw.http.get("/status")).json()["batches"]["enabled"] is False
        r = await live_chat(gw)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "re: live"


# ---------------------------------------------------------------- Redis going away


async def test_redis_down_pauses_batches_only_and_they_resume(fresh_redis: RedisServer) -> None:
    ids = ["b0", "b1", "b2", "b3"]
    gate = Gate(hold=lambda cid: cid.startswith("b"))
    s = with_redis(fresh_redis.url, redis={"timeout_s": 0.5}, batch={"max_waiting": 2})
    async with running(s, gate) as gw:
        b = await gw.submit(chat_file(ids))
        await until(lambda: len(gate.waiting) == 2, what="2 lines running")
        assert gw.runner.redis_up is True
        fresh_redis.stop()
        r = await gw.http.get("/v1/batches")
        assert r.status_code == 503, r.text
        assert int(r.headers["retry-after"]) >= 1
        assert error_of(r)["code"] == "batch_store_unavailable"
        r = await gw.http.get(f"/v1/batches/{b.id}")
        assert r.status_code == 503 and "retry-after" in r.headers
        r = await gw.http.post(
            "/v1/batches",
            json={"input_file_id": b.input_file_id, "endpoint": CHAT, "completion_window": "24h"},
        )
        assert r.status_code == 503 and "retry-after" in r.headers
        r = await gw.http.post(
            "/v1/files", files={"file": ("x.jsonl", chat_file(["z"]))}, data={"purpose": "batch"}
        )
        assert r.status_code == 503 and "retry-after" in r.headers
        # Live traffic does not need Redis.
        r = await live_chat(gw)
        assert r.status_code == 200, r.text
        await until(lambda: gw.runner.redis_up is False, what="the runner notices Redis is down")
        ready = await gw.http.get("/readyz")
        assert ready.status_code == 200 and ready.json()["redis"] == "down"
        status = (await gw.http.get("/status")).json()["batches"]
        assert status["redis"] == "down" and status["redis_error"]
        metrics = (await gw.http.get("/metrics")).text
        assert re.search(r"^hearthgate_redis_up 0(\.0)?$", metrics, re.M), metrics
        # Lines running when Redis went away finish; their results wait in memory.
        gate.open()
        await until(lambda: len(gw.runner.unwritten) == 2, what="2 results kept in memory")
        assert (await live_chat(gw, "live2")).status_code == 200
        fresh_redis.start()
        await until(
            lambda: gw.runner.redis_up is True, timeout=15, what="the runner sees Redis again"
        )
        b = await gw.wait(b.id, timeout=15)
        assert b.status == "completed", b
        assert b.request_counts is not None
        assert (b.request_counts.completed, b.request_counts.failed) == (4, 0)
        out = await gw.content(b.output_file_id)
        assert ids_of(out) == ids
        assert gw.runner.unwritten == []
        assert Counter(c for c in gate.calls if c.startswith("b")) == Counter(ids)
        metrics = (await gw.http.get("/metrics")).text
        assert re.search(r"^hearthgate_redis_up 1(\.0)?$", metrics, re.M)
        assert (await gw.http.get("/readyz")).json()["redis"] == "up"


# ---------------------------------------------------------------- deleting files


async def test_deleting_the_input_of_a_running_batch_is_409(redis_url: str) -> None:
    gate = Gate()
    async with running(with_redis(redis_url), gate) as gw:
        fid = await gw.upload(chat_file(["a", "b"]))
        b = await gw.create(fid)
        await until(lambda: len(gate.waiting) >= 1, what="a line running")
        r = await gw.http.delete(f"/v1/files/{fid}")
        assert r.status_code == 409, r.text
        assert b.id in error_of(r)["message"]
        assert (await gw.http.get(f"/v1/files/{fid}")).status_code == 200
        gate.open()
        assert (await gw.wait(b.id)).status == "completed"
        deleted = await gw.sdk().files.delete(fid)
        assert deleted.deleted is True and deleted.id == fid
        assert (await gw.http.get(f"/v1/files/{fid}")).status_code == 404
        assert (await gw.http.get(f"/v1/files/{fid}/content")).status_code == 404
        assert (await gw.http.delete(f"/v1/files/{fid}")).status_code == 404
        assert fid not in [f.id for f in (await gw.sdk().files.list()).data]


async def test_lines_whose_input_vanished_fail_as_input_missing(redis_url: str) -> None:
    """Input lines gone from Redis while the batch runs (evicted, removed by hand): each
    ends in the error file as input_missing and the batch still completes, nothing stuck."""
    gate = Gate(hold=lambda cid: cid == "a")
    s = with_redis(redis_url, batch={"max_waiting": 1})
    async with running(s, gate) as gw:
        fid = await gw.upload(chat_file(["a", "b", "c"]))
        b = await gw.create(fid)
        await until(lambda: gate.waiting == ["a"], what="the first line running")
        await gw.service.store.r.delete(gw.service.store.keys.lines(fid))
        gate.open()
        b = await gw.wait(b.id)
        assert b.status == "completed", b
        assert ids_of(await gw.content(b.output_file_id)) == ["a"]
        err = await gw.content(b.error_file_id)
        assert sorted(ln["custom_id"] for ln in err) == ["b", "c"]  # ids are kept per batch
        for ln in err:
            assert ln["error"]["code"] == "input_missing" and ln["response"] is None
        assert b.request_counts is not None
        assert (b.request_counts.completed, b.request_counts.failed) == (1, 2)
        assert gate.calls == ["a"]


async def test_an_input_shared_by_two_batches_stays_while_either_runs(redis_url: str) -> None:
    gate = Gate()
    async with running(with_redis(redis_url, batch={"max_waiting": 2}), gate) as gw:
        fid = await gw.upload(chat_file(["a", "b", "c"]))
        first = await gw.create(fid)
        second = await gw.create(fid)  # the file's in_use_by now names this one
        await until(lambda: len(gate.waiting) == 2, what="2 lines of the first batch running")
        await gw.sdk().batches.cancel(first.id)
        assert (await gw.wait(first.id)).status == "cancelled"
        # The second batch now holds a and b; c is still to be read from the file.
        await until(lambda: len(gate.waiting) == 2, what="2 lines of the second batch running")
        r = await gw.http.delete(f"/v1/files/{fid}")
        assert r.status_code == 409, (
            f"the input of {second.id} (still running) was deleted once the other batch on "
            f"the same file ended: {r.status_code} {r.text}"
        )
        assert second.id in error_of(r)["message"]
        gate.open()
        done = await gw.wait(second.id)
        assert done.status == "completed"
        assert ids_of(await gw.content(done.output_file_id)) == ["a", "b", "c"]
        assert (await gw.http.delete(f"/v1/files/{fid}")).status_code == 200


# ---------------------------------------------------------------- lists


async def test_batch_list_pages(redis_url: str) -> None:
    async with running(with_redis(redis_url)) as gw:
        client = gw.sdk()
        fid = await gw.upload(chat_file(["a"]))
        made = [(await gw.create(fid)).id for _ in range(5)]
        for bid in made:
            await gw.wait(bid)
        full = (await gw.http.get("/v1/batches")).json()
        assert full["object"] == "list" and full["has_more"] is False
        everything = [x["id"] for x in full["data"]]
        assert sorted(everything) == sorted(made)
        assert (full["first_id"], full["last_id"]) == (everything[0], everything[-1])
        page1 = (await gw.http.get("/v1/batches?limit=2")).json()
        assert [x["id"] for x in page1["data"]] == everything[:2] and page1["has_more"] is True
        page2 = (await gw.http.get(f"/v1/batches?limit=2&after={page1['last_id']}")).json()
        assert [x["id"] for x in page2["data"]] == everything[2:4] and page2["has_more"] is True
        page3 = (await gw.http.get(f"/v1/batches?limit=2&after={page2['last_id']}")).json()
        assert [x["id"] for x in page3["data"]] == everything[4:] and page3["has_more"] is False
        exact = (await gw.http.get("/v1/batches?limit=5")).json()
        assert len(exact["data"]) == 5 and exact["has_more"] is False
        # The SDK's auto-pagination walks the same pages.
        walked = [b.id async for b in client.batches.list(limit=2)]
        assert walked == everything
        empty = (await gw.http.get(f"/v1/batches?after={everything[-1]}")).json()
        assert empty["data"] == [] and empty["has_more"] is False and empty["first_id"] is None


async def test_file_list_pages_order_and_purpose(redis_url: str) -> None:
    async with running(with_redis(redis_url)) as gw:
        made = [await gw.upload(chat_file([f"x{i}"]), name=f"f{i}.jsonl") for i in range(4)]
        b = await gw.wait((await gw.create(made[0])).id)
        assert b.output_file_id is not None

        async def ids(query: str) -> tuple[list[str], bool]:
            page = (await gw.http.get("/v1/files" + query)).json()
            return [f["id"] for f in page["data"]], page["has_more"]

        desc, more = await ids("")
        assert sorted(desc) == sorted([*made, b.output_file_id]) and more is False
        asc, _ = await ids("?order=asc")
        assert asc == desc[::-1]
        batch_only, _ = await ids("?purpose=batch")
        assert sorted(batch_only) == sorted(made)
        assert await ids("?purpose=batch_output") == ([b.output_file_id], False)
        p1, more1 = await ids("?limit=2&order=asc")
        p2, more2 = await ids(f"?limit=2&order=asc&after={p1[-1]}")
        p3, more3 = await ids(f"?limit=2&order=asc&after={p2[-1]}")
        assert (more1, more2, more3) == (True, True, False)
        assert p1 + p2 + p3 == asc
        walked = [f.id async for f in gw.sdk().files.list(limit=2, order="asc")]
        assert walked == asc
        bp1, more = await ids("?purpose=batch&limit=3")
        assert len(bp1) == 3 and more is True
