"""Embeddings coalescing (gateway/coalesce.py): validation, merge and split logic, and the
coalescer's bookkeeping against a fake upstream function. The real thing against MiniLM is
tests/e2e/test_coalesce_vllm.py."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from typing import Any

import pytest

from hearthgate.gateway.coalesce import Answer, Coalescer
from hearthgate.gateway.embed_batch import Plan, apportion, input_items, mergeable, split_answer
from hearthgate.gateway.errors import BadRequest, UpstreamFailed
from hearthgate.gateway.metrics import GatewayMetrics
from hearthgate.gateway.parse import parse_body
from hearthgate.gateway.proxy import Result
from hearthgate.gateway.settings import Worker
from hearthgate.gateway.upstream import WorkerUnreachable
from hearthgate.gateway.workers import WorkerState
from hearthgate.policies.windows import WindowPolicy
from tests.inprocess import until

# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("value", "items"),
    [
        ("hello", ["hello"]),
        ("", [""]),  # vLLM embeds the empty string (2 special tokens)
        (["a", "b"], ["a", "b"]),
        ([101, 7592, 102], [[101, 7592, 102]]),
        ([[101, 102], [7]], [[101, 102], [7]]),
    ],
)
def test_valid_inputs_and_their_items(value: object, items: list[object]) -> None:
    assert input_items(value) == items


@pytest.mark.parametrize(
    "value",
    [[], [[]], ["a", 1], ["a", [1]], [1.5], [True], [-1], [[1, "x"]], [[1], []], 5, None, {}],
)
def test_malformed_inputs_are_400(value: object) -> None:
    with pytest.raises(BadRequest):
        input_items(value)


def test_chat_style_inputs_are_not_merged() -> None:
    assert input_items([{"role": "user", "content": "hi"}]) is None
    assert input_items([[{"role": "user", "content": "hi"}]]) is None


def plan(**body: Any) -> Plan:
    p = mergeable(parse_body(json.dumps({"model": "m", **body}).encode(), "embeddings"))
    assert p is not None
    return p


def test_mergeable_only_for_equal_parameters_and_input_kinds() -> None:
    a = plan(input="x")
    assert plan(input=["y", "z"]).params == a.params
    assert plan(input="x", encoding_format="float").params != a.params
    assert plan(input="x", encoding_format="base64").params != a.params
    assert plan(input="x", user="u").params != a.params
    assert plan(input="x", truncate_prompt_tokens=3).params != a.params
    assert plan(input=[1, 2]).params != a.params  # token ids never mixed with texts
    raw = b'{"model": "m", "input": "x", "encoding_format": "bytes"}'
    bytes_enc = parse_body(raw, "embeddings")
    assert mergeable(bytes_enc) is None
    chat = parse_body(b'{"model": "m", "messages": [{"role": "user"}]}', "chat")
    assert mergeable(chat) is None


# ------------------------------------------------------------------ split


def test_apportion_is_exact_for_token_ids_and_sums_to_the_total() -> None:
    assert apportion(7, [[[1, 2, 3]], [[4, 5, 6, 7]]]) == [3, 4]
    shares = apportion(100, [["aaaa"], ["aaaa"], ["aaaaaaaa"], [[1, 2]]])
    assert sum(shares) == 100 and shares[3] == 2
    assert shares[2] > shares[0] == shares[1]
    assert apportion(5, [["x"]]) == [5]  # alone: the worker's own count
    assert sum(apportion(10, [["a"], ["b"], ["c"]])) == 10
    # The worker counted fewer than the token ids: shared by size instead.
    assert apportion(3, [[[1, 2, 3, 4]], ["x"]]) == [2, 1]


def answer(items: list[Any], encoding: str = "float", tokens: int | None = None) -> bytes:
    data = []
    for i, item in enumerate(items):
        vec = [float(len(json.dumps(item))), float(i)]
        emb: Any = vec
        if encoding == "base64":
            emb = base64.b64encode(struct.pack("<2f", *vec)).decode()
        data.append({"index": i, "object": "embedding", "embedding": emb})
    data.reverse()  # order must come from the index, not the position
    n = tokens if tokens is not None else 3 * len(items)
    usage = {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0}
    body = {"id": "e", "object": "list", "created": 1, "model": "up", "data": data, "usage": usage}
    return json.dumps(body).encode()


def split(content: bytes, parts: list[list[Any]], model: str | None = None) -> list[Any]:
    """The split bodies as parsed JSON (checking each share's tokens match its body)."""
    shares = split_answer(content, parts, model)
    bodies = [json.loads(s.body) for s in shares]
    assert [s.prompt_tokens for s in shares] == [b["usage"]["prompt_tokens"] for b in bodies]
    return bodies


def test_split_reindexes_per_caller_in_order() -> None:
    parts = [["a"], ["bb", "ccc"], [[1, 2]]]
    merged = [i for p in parts for i in p]
    bodies = split(answer(merged, tokens=9), parts, model="m")
    assert [[d["index"] for d in b["data"]] for b in bodies] == [[0], [0, 1], [0]]
    assert [d["embedding"][1] for d in bodies[1]["data"]] == [1.0, 2.0]
    assert bodies[2]["data"][0]["embedding"][1] == 3.0
    assert sum(b["usage"]["prompt_tokens"] for b in bodies) == 9
    assert bodies[2]["usage"] == {"prompt_tokens": 2, "total_tokens": 2, "completion_tokens": 0}
    assert all(b["model"] == "m" and b["object"] == "list" for b in bodies)


def test_split_passes_base64_items_through() -> None:
    bodies = split(answer(["a", "b"], "base64"), [["a"], ["b"]])
    raw = base64.b64decode(bodies[1]["data"][0]["embedding"])
    assert struct.unpack("<2f", raw) == (3.0, 1.0)


def test_split_copies_each_vector_as_the_worker_wrote_it() -> None:
    # Whitespace, exponents, negative zero and digits past a double's precision survive
    # byte for byte: the vector text is copied, not parsed and printed again.
    vec = "[ -0.0, 1e-07,\n 0.12345678901234567890 , -3E+2 ]"
    body = (
        '{"id":"e","data":[{"embedding":' + vec + ',"index":1,"object":"embedding"},'
        ' {"index":0,"object":"embedding","embedding":[1, 2]}],'
        '"model":"up","usage":{"prompt_tokens":4,"total_tokens":4}}'
    )
    shares = split_answer(body.encode(), [["a"], ["b"]])
    assert vec.encode() in shares[1].body
    assert json.loads(shares[0].body)["data"] == [
        {"index": 0, "object": "embedding", "embedding": [1, 2]}
    ]
    assert json.loads(shares[1].body)["data"][0]["index"] == 0


def test_split_keeps_unusual_vectors_and_fields() -> None:
    # Nested arrays, NaN (Python's json writes it) and extra fields go through the parser.
    data = [
        {"index": 0, "embedding": [[1.5, 2.0]], "extra": {"k": [1]}},
        {"index": 1, "embedding": [float("nan")]},
        {"index": 2},
    ]
    content = json.dumps({"data": data, "usage": {"prompt_tokens": 3}}).encode()
    bodies = [json.loads(s.body) for s in split_answer(content, [["a"], ["b"], ["c"]])]
    assert bodies[0]["data"] == [data[0]]
    assert str(bodies[1]["data"][0]["embedding"]) == "[nan]"
    assert bodies[2]["data"] == [{"index": 0}]
    assert [b["usage"] for b in bodies] == [{"prompt_tokens": 1, "total_tokens": 1}] * 3


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"[]",
        b'{"data": 5}',
        b'{"object": "list"}',
        b'{"data": [1]}',
        b'{"data": [{"index": 0, "embedding": [1, 2]}',
        b'{"data": [{"index": 0, "embedding": [1, 2]}]} trailing',
        b'{"data": [{"index": 0 "embedding": [1]}]}',
        b'{"data": [{"index": 0, "embedding": [1, 2}]}',
        b'{"data": [{"embedding": [1]}]}',
        b'{"data": [{"index": 0}], "usage": 3}',
    ],
)
def test_split_refuses_malformed_answers(content: bytes) -> None:
    with pytest.raises((ValueError, KeyError)):
        split_answer(content, [["a"]])


def test_split_refuses_a_short_answer() -> None:
    with pytest.raises(ValueError):
        split_answer(answer(["a"]), [["a"], ["b"]])


# ------------------------------------------------------------------ the coalescer


class Ticket:
    def __init__(self) -> None:
        self.finished: list[tuple[int | None, int | None]] = []

    def first_token(self, observed: bool = True) -> None: ...

    def expect_no_stream(self) -> None: ...

    def expect_stream(self) -> None: ...

    def progress(self, output_tokens_so_far: int) -> None: ...

    def finish(self, prompt_tokens: int | None, output_tokens: int | None) -> None:
        self.finished.append((prompt_tokens, output_tokens))


class Pool:
    def __init__(self) -> None:
        self.in_flight = 0
        self.down: list[str] = []

    def acquire(self, worker: WorkerState) -> None:
        self.in_flight += 1

    def release(self, worker: WorkerState) -> None:
        self.in_flight -= 1

    def mark_down(self, worker: WorkerState, reason: str) -> None:
        self.down.append(worker.name)


class Upstream:
    """Answers like the embeddings endpoint; an item "BAD" fails the whole call with 400."""

    def __init__(self, delay: float = 0.0, fail: BaseException | None = None) -> None:
        self.calls: list[dict[str, Any]] = []
        self.delay = delay
        self.fail = fail

    async def __call__(self, worker: WorkerState, body: bytes) -> Answer:
        b = json.loads(body)
        self.calls.append(b)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        items = input_items(b["input"])
        assert items is not None
        if "BAD" in items:
            return Answer(400, b'{"error": {"message": "bad input"}}')
        return Answer(200, answer(items, b.get("encoding_format", "float")))


WORKER = WorkerState(Worker(name="w0", url="http://127.0.0.1:1", models=["m"]))
DENSE = WindowPolicy(max_wait_s=0.05, max_batch_size=64)


def make(
    upstream: Upstream, policy: WindowPolicy = DENSE, busy: bool = False
) -> tuple[Coalescer, Pool]:
    pool = Pool()
    metrics = GatewayMetrics(["m"], classes=["embed"])

    def activity(worker: str) -> tuple[int, bool]:
        return (10**6 if busy else 0), False

    return Coalescer(upstream, pool, {"embed": policy}, activity, metrics), pool


async def call(
    co: Coalescer, p: Plan, ticket: Ticket | None = None, **kw: Any
) -> tuple[int, dict[str, Any]]:
    results: list[Result] = []
    co_pool = co._pool
    assert isinstance(co_pool, Pool)
    co_pool.acquire(WORKER)  # the caller's lease holds one in-flight count, handed over
    resp = await co.forward(p, WORKER, ticket or Ticket(), "embed", 5, 0.0, results.append, **kw)
    body = bytes(resp.body)
    assert len(results) == (0 if resp.status_code == 499 else 1)
    return resp.status_code, (json.loads(body) if body else {})


async def test_concurrent_callers_share_one_upstream_call() -> None:
    up = Upstream()
    co, pool = make(up)
    tickets = [Ticket() for _ in range(10)]
    out = await asyncio.gather(
        *(call(co, plan(input=f"text {i}"), t) for i, t in enumerate(tickets))
    )
    assert len(up.calls) == 1 and len(up.calls[0]["input"]) == 10
    for i, (status, body) in enumerate(out):
        assert status == 200
        assert [d["index"] for d in body["data"]] == [0]
        assert body["data"][0]["embedding"][1] == float(i)  # its own item
    assert sum(b["usage"]["prompt_tokens"] for _, b in out) == 30
    assert all(len(t.finished) == 1 for t in tickets) and pool.in_flight == 0


async def test_a_caller_with_several_items_keeps_them_together() -> None:
    up = Upstream()
    co, _ = make(up)
    (s1, b1), (s2, b2) = await asyncio.gather(
        call(co, plan(input=["a", "b", "c"])), call(co, plan(input="d"))
    )
    assert s1 == s2 == 200
    assert len(up.calls) == 1 and up.calls[0]["input"] == ["a", "b", "c", "d"]
    assert [d["embedding"][1] for d in b1["data"]] == [0.0, 1.0, 2.0]
    assert [d["index"] for d in b1["data"]] == [0, 1, 2]
    assert b2["data"][0]["embedding"][1] == 3.0


async def test_different_parameters_are_never_merged() -> None:
    up = Upstream()
    co, _ = make(up)
    out = await asyncio.gather(
        call(co, plan(input="a")),
        call(co, plan(input="b", encoding_format="base64")),
        call(co, plan(input="c", user="someone")),
        call(co, plan(input=[1, 2, 3])),
        call(co, plan(input="d")),
    )
    assert all(s == 200 for s, _ in out)
    inputs = sorted(json.dumps(c["input"]) for c in up.calls)
    assert inputs == sorted(['["a", "d"]', '"b"', '"c"', "[1, 2, 3]"])
    assert isinstance(out[1][1]["data"][0]["embedding"], str)


async def test_a_bad_member_fails_alone_after_a_split_retry() -> None:
    up = Upstream()
    co, pool = make(up)
    tickets = [Ticket() for _ in range(3)]
    out = await asyncio.gather(
        call(co, plan(input="good"), tickets[0]),
        call(co, plan(input="BAD"), tickets[1]),
        call(co, plan(input="fine"), tickets[2]),
    )
    assert [s for s, _ in out] == [200, 400, 200]
    assert out[1][1]["error"]["message"] == "bad input"
    # The merged call, then its halves ("good" | "BAD", "fine"), then "BAD" and "fine".
    assert len(up.calls) == 5
    assert all(len(t.finished) == 1 for t in tickets) and pool.in_flight == 0


async def test_one_bad_member_among_many_costs_few_extra_calls() -> None:
    up = Upstream()
    co, pool = make(up)
    inputs = [f"ok {i}" for i in range(32)]
    inputs[19] = "BAD"
    out = await asyncio.gather(*(call(co, plan(input=x)) for x in inputs))
    assert [s for s, _ in out] == [400 if x == "BAD" else 200 for x in inputs]
    assert len(up.calls) == 1 + 2 * 5  # bisection: two halves per level, five levels
    assert pool.in_flight == 0


async def test_batch_size_caps_each_call() -> None:
    up = Upstream()
    co, _ = make(up, WindowPolicy(max_wait_s=0.05, max_batch_size=4))
    await asyncio.gather(*(call(co, plan(input=f"t{i}")) for i in range(10)))
    assert sorted(len(c["input"]) if isinstance(c["input"], list) else 1 for c in up.calls) == [
        2,
        4,
        4,
    ]


async def test_busy_worker_and_dense_arrivals_wait_to_fill_the_batch() -> None:
    up = Upstream()
    co, _ = make(up, WindowPolicy(max_wait_s=0.2, max_batch_size=8), busy=True)
    tasks = []
    for i in range(8):  # arrivals 5 ms apart: dense for a 200 ms window
        tasks.append(asyncio.create_task(call(co, plan(input=f"t{i}"))))
        await asyncio.sleep(0.005)
    await asyncio.gather(*tasks)
    # The first arrivals (no rate measured yet) go at once; then the window gathers.
    assert len(up.calls) < 8
    assert max(len(c["input"]) if isinstance(c["input"], list) else 1 for c in up.calls) > 2


async def test_a_caller_that_leaves_before_the_call_drops_its_part() -> None:
    up = Upstream()
    co, pool = make(up, WindowPolicy(min_wait_s=0.05, max_wait_s=0.05, max_batch_size=8))
    gone = asyncio.Event()
    leaving = Ticket()

    async def disconnected() -> None:
        await gone.wait()

    stay = asyncio.create_task(call(co, plan(input="stay")))
    leave = asyncio.create_task(call(co, plan(input="leave"), leaving, disconnected=disconnected))
    # Both callers gather in the open batch (its window is 50 ms), nothing sent yet.
    await until(lambda: co._waiting.get(WORKER.name) == 2 or bool(up.calls))
    gone.set()
    assert (await leave)[0] == 499
    assert leaving.finished == [(0, 0)]
    status, _ = await stay
    assert status == 200 and up.calls[0]["input"] == "stay"
    assert pool.in_flight == 0


async def test_a_caller_that_leaves_during_the_call_is_finished_by_the_batch() -> None:
    up = Upstream(delay=0.05)
    co, pool = make(up)
    gone = asyncio.Event()
    leaving = Ticket()

    async def disconnected() -> None:
        await gone.wait()

    stay = asyncio.create_task(call(co, plan(input="stay")))
    leave = asyncio.create_task(call(co, plan(input="leave"), leaving, disconnected=disconnected))
    await until(lambda: bool(up.calls))  # the merged call is under way (it takes 50 ms)
    assert up.calls[0]["input"] == ["stay", "leave"]
    gone.set()
    assert (await leave)[0] == 499
    assert (await stay)[0] == 200
    assert len(up.calls) == 1 and len(leaving.finished) == 1 and pool.in_flight == 0


async def test_unreachable_worker_fails_every_member_for_a_retry() -> None:
    up = Upstream(fail=WorkerUnreachable("w0", refused=True))
    co, pool = make(up)
    tickets = [Ticket(), Ticket()]
    out = await asyncio.gather(
        *(call(co, plan(input=f"x{i}"), t) for i, t in enumerate(tickets)),
        return_exceptions=True,
    )
    assert all(isinstance(o, WorkerUnreachable) for o in out)
    assert pool.down == ["w0"] and pool.in_flight == 0
    assert all(t.finished == [(0, 0)] for t in tickets)


async def test_upstream_failure_is_a_gateway_error_for_every_member() -> None:
    up = Upstream(fail=UpstreamFailed("broke"))
    co, pool = make(up)
    out = await asyncio.gather(
        call(co, plan(input="a")), call(co, plan(input="b")), return_exceptions=True
    )
    assert all(isinstance(o, UpstreamFailed) for o in out) and pool.in_flight == 0
