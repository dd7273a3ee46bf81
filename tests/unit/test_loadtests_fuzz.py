"""The fuzzer's judging, rendering, generation and report logic on plain values (no servers)."""

from __future__ import annotations

import json
from collections.abc import Callable

import h11
import httpx
import pytest

from hearthgate.loadtests.cli import build_parser
from hearthgate.loadtests.fuzz import (
    WORKER_HEADER,
    Answer,
    Case,
    FuzzConfig,
    Tally,
    Verdict,
    classify,
    error_shape_problem,
    generate,
    judge,
    render_markdown,
    run,
    sse_problem,
)
from hearthgate.loadtests.fuzz_cases import padded
from hearthgate.loadtests.fuzz_values import Raw, render

GOOD_ERROR = {
    "error": {
        "message": "bad",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_request",
    }
}
JSON_CT = {"content-type": "application/json"}
SSE_CT = {"content-type": "text/event-stream"}


def body(obj: object) -> bytes:
    return json.dumps(obj).encode()


@pytest.mark.parametrize(
    ("obj", "problem"),
    [
        (GOOD_ERROR, None),
        ({"error": {"message": "m", "type": "t", "param": "x", "code": 400}}, None),
        ({"error": {"message": "m", "type": "t", "code": None}}, "'error.param' is missing"),
        ({"error": {"message": "m", "type": "t", "param": None}}, "'error.code' is missing"),
        ({"error": {"message": 5, "type": "t", "param": None, "code": None}}, "message"),
        ({"error": {"message": "m", "param": None, "code": None}}, "'error.type'"),
        ({"error": {"message": "m", "type": "t", "param": 1, "code": None}}, "param"),
        ({"error": {"message": "m", "type": "t", "param": None, "code": True}}, "code"),
        ({"detail": "Not Found"}, "no 'error' object"),
        ({"error": "bad"}, "no 'error' object"),
        ([GOOD_ERROR], "not a JSON object"),
    ],
)
def test_error_shape(obj: object, problem: str | None) -> None:
    got = error_shape_problem(body(obj))
    if problem is None:
        assert got is None
    else:
        assert got is not None and problem in got


def test_error_shape_not_json() -> None:
    assert error_shape_problem(b"Invalid HTTP request received.") == "not JSON"
    assert error_shape_problem(b"") == "not JSON"


CHUNK = 'data: {"choices": [{"text": "a"}]}\n\n'


@pytest.mark.parametrize(
    ("text", "problem", "saw_error"),
    [
        (CHUNK + "data: [DONE]\n\n", None, False),
        (": ping\n\n" + CHUNK + "data: [DONE]\n\n", None, False),
        (CHUNK.replace("\n", "\r\n") + "data: [DONE]\r\n\r\n", None, False),
        ("data: " + json.dumps(GOOD_ERROR) + "\n\ndata: [DONE]\n\n", None, True),
        ('data: {"error": "x"}\n\ndata: [DONE]\n\n', "error event", True),
        (CHUNK, "does not end with data: [DONE]", False),
        (CHUNK + "data: [DONE]", "not terminated", False),
        ("data: [DONE]\n\n" + CHUNK + "data: [DONE]\n\n", "before the end", False),
        ("data: {oops\n\ndata: [DONE]\n\n", "not JSON", False),
        ("data: [1]\n\ndata: [DONE]\n\n", "not a JSON object", False),
        ("hello\n\ndata: [DONE]\n\n", "not an SSE line", False),
        ("", "empty stream", False),
    ],
)
def test_sse(text: str, problem: str | None, saw_error: bool) -> None:
    got, saw = sse_problem(text.encode())
    if problem is None:
        assert got is None
    else:
        assert got is not None and problem in got
    assert saw == saw_error


def test_sse_not_utf8() -> None:
    assert sse_problem(b"data: \xff\n\ndata: [DONE]\n\n")[0] == "stream is not UTF-8"


def test_classify_origin_and_5xx() -> None:
    relayed = {WORKER_HEADER: "gen0", **JSON_CT}
    assert classify(500, relayed, b"{}", False) == Verdict("worker", None, "worker 5xx")
    assert classify(500, JSON_CT, body(GOOD_ERROR), False) == Verdict("gateway", "gateway 500")
    assert classify(503, JSON_CT, body(GOOD_ERROR), False).problem == "gateway 503"


def test_classify_4xx() -> None:
    assert classify(400, JSON_CT, body(GOOD_ERROR), False) == Verdict("gateway")
    relayed = {WORKER_HEADER: "gen0", **JSON_CT}
    assert classify(404, relayed, body(GOOD_ERROR), False) == Verdict("worker")
    bad = classify(422, JSON_CT, body({"detail": []}), False)
    assert bad.origin == "gateway" and bad.problem is not None and bad.problem.startswith("422")
    bad = classify(400, relayed, b"plain", False)
    assert bad.origin == "worker" and bad.problem is not None


def test_classify_200() -> None:
    relayed = {WORKER_HEADER: "gen0"}
    ok_stream = (CHUNK + "data: [DONE]\n\n").encode()
    assert classify(200, {**relayed, **SSE_CT}, ok_stream, True) == Verdict("worker")
    cut = classify(200, {**relayed, **SSE_CT}, CHUNK.encode(), True)
    assert cut.problem is not None and "[DONE]" in cut.problem
    asked = classify(200, {**relayed, **JSON_CT}, b"{}", True)
    assert asked.problem is not None and "stream asked for" in asked.problem
    assert classify(200, {**relayed, **JSON_CT}, b'{"data": []}', False) == Verdict("worker")
    assert classify(200, relayed, b"[]", False).problem == "200 answer is not a JSON object"
    assert classify(200, relayed, b"nope", False).problem == "200 answer is not JSON"
    assert classify(307, {}, b"", False) == Verdict("gateway", None, "status 307")


def case(kind: str = "valid", body: bytes = b"{}", stream: bool = False) -> Case:
    return Case("chat", kind, "d", "POST", "/v1/chat/completions", (), body, stream=stream)


def test_judge_no_answer() -> None:
    v = judge(case(), Answer(None, {}, b"", 61.0, "timeout after 61 s (ReadTimeout)"))
    assert v == Verdict("none", "no answer: timeout after 61 s (ReadTimeout)")


def test_tally_and_markdown() -> None:
    tally = Tally(examples_per_group=1)
    relayed = {WORKER_HEADER: "gen0", **JSON_CT}
    answers = [
        (case(), Answer(200, relayed, b"{}", 0.1)),
        (case(), Answer(400, JSON_CT, body(GOOD_ERROR), 0.1)),
        (case("nested", b"[[[["), Answer(500, JSON_CT, body(GOOD_ERROR), 0.1)),
        (case("nested", b"[[[[[["), Answer(500, JSON_CT, body(GOOD_ERROR), 0.1)),
        (case("mutate"), Answer(500, relayed, b'{"error": "x"}', 0.1)),
        (case(), Answer(None, {}, b"", 60.0, "timeout after 60 s (ReadTimeout)")),
        (case("mutate", b'{"n": 8}'), Answer(200, relayed, b"{}", 12.5)),
    ]
    for i, (c, a) in enumerate(answers):
        tally.add(i, c, a, judge(c, a))
    assert tally.sent["chat"] == 7
    assert tally.counts[("chat", "500", "gateway")] == 2
    assert tally.counts[("chat", "500", "worker")] == 1
    assert tally.counts[("chat", "none", "none")] == 1
    assert tally.failed == 3  # two gateway 500s and the hang; the worker's 500 is apart
    group = tally.failures[("chat", "gateway 500", "nested")]
    assert group.count == 2 and len(group.examples) == 1 and group.examples[0].index == 2
    assert sum(g.count for g in tally.worker_5xx.values()) == 1
    assert tally.kinds[("chat", "valid", "2xx")] == 1
    md = render_markdown(tally, {"command": "`x`"}, seed=7)
    assert "| chat | 7 | 2 | 1 | 0 | 1 | 2 | 1 | 0 | 3 |" in md
    assert "FAIL (3 failures)" in md
    assert "### chat: gateway 500 (kind nested): 2 requests" in md
    assert "case #2 (seed 7)" in md and "b'[[[['" in md
    assert "5xx relayed from the worker (1;" in md
    assert "## Slow answers (1 over 10 s; not failures)" in md
    assert "### chat: 200 after more than 10 s (kind mutate): 1 requests" in md


def test_markdown_pass() -> None:
    assert "**PASS**" in render_markdown(Tally(), {}, seed=1)


def test_render_writes_what_json_cannot() -> None:
    value = {"a": Raw("9" * 5000), "b": float("nan"), "c": [Raw("[" * 3 + "]" * 3)], "d": "é"}
    text = render(value)
    assert text == b'{"a": ' + b"9" * 5000 + b', "b": NaN, "c": [[[[]]]], "d": "\\u00e9"}'
    assert render({"s": "é\ud800"}, ascii_only=False) == b'{"s": "\xc3\xa9\xed\xa0\x80"}'


@pytest.mark.parametrize("filler", ["a", "lorem ", "é", "💥", "\x01"])
@pytest.mark.parametrize("ascii_only", [True, False])
@pytest.mark.parametrize("key", ["prompt", "messages", "user"])
def test_padded_hits_the_target(filler: str, ascii_only: bool, key: str) -> None:
    base = {"model": "m", "prompt": "x", "max_tokens": 1}
    for target in (5000, 5001, 5002, 5003):
        raw = padded(base, key, target, filler, ascii_only)
        assert len(raw) == target
        assert isinstance(json.loads(raw), dict)


def collect(endpoint: str, n: int, seed: int) -> list[Case]:
    out: list[Case] = []
    generate(endpoint, n, seed, FuzzConfig(key="k", body_limit=20_000), out.append, chunk=20)
    return out


def test_generation_is_seeded() -> None:
    first = collect("completions", 40, seed=3)
    assert len(first) == 40
    assert first == collect("completions", 40, seed=3)
    assert first != collect("completions", 40, seed=4)
    assert {c.endpoint for c in first} == {"completions"}


@pytest.mark.parametrize("endpoint", ["chat", "completions", "embeddings"])
def test_generated_cases_are_sendable(endpoint: str) -> None:
    for c in collect(endpoint, 60, seed=1):
        assert c.method in {"POST", "GET", "PUT", "PATCH", "DELETE", "OPTIONS"}
        hdrs = [(k.encode("ascii"), v.encode("latin-1")) for k, v in c.headers]
        h11.Request(method=c.method, target=c.path, headers=[(b"host", b"gw"), *hdrs])
        if c.stream and c.method == "POST" and c.kind != "method":
            assert b'"stream": true' in c.body


def test_no_seed_field() -> None:
    cfg = FuzzConfig(body_limit=20_000, send_seed=False)
    for endpoint in ("chat", "completions"):
        out: list[Case] = []
        generate(endpoint, 200, 5, cfg, out.append, chunk=100)
        assert not any(b'"seed": ' in c.body for c in out)
    seeded: list[Case] = []
    generate("completions", 200, 5, FuzzConfig(body_limit=20_000), seeded.append, chunk=100)
    assert any(b'"seed": ' in c.body for c in seeded)


def fake_gateway(request: httpx.Request) -> httpx.Response:
    """500 from the gateway for a body nested three deep, 503 relayed from the worker for
    temperature 7, OpenAI-shaped 400 otherwise."""
    raw = request.content
    if b"[[[" in raw:
        return httpx.Response(500, json=GOOD_ERROR)
    if b'"temperature": 7' in raw:
        return httpx.Response(503, json=GOOD_ERROR, headers={WORKER_HEADER: "gen0"})
    return httpx.Response(400, json=GOOD_ERROR)


def test_run_with_a_mock_transport() -> None:
    def factory() -> httpx.Client:
        return httpx.Client(base_url="http://gw", transport=httpx.MockTransport(fake_gateway))

    seen: list[int] = []
    record: Callable[[int, Case, Answer, Verdict], None] = lambda i, *_: seen.append(i)  # noqa: E731
    tally = run(
        "http://gw",
        30,
        seed=2,
        cfg=FuzzConfig(body_limit=20_000),
        endpoints=["completions", "embeddings"],
        concurrency=3,
        client_factory=factory,
        on_result=record,
    )
    assert tally.sent == {"completions": 30, "embeddings": 30}
    assert sorted(seen) == sorted(list(range(30)) * 2)
    nested = sum(n for (_, s, o), n in tally.counts.items() if s == "500" and o == "gateway")
    assert tally.failed == nested
    assert all(what == "gateway 500" for (_, what, _) in tally.failures)


def test_cli_parses_fuzz() -> None:
    args = build_parser().parse_args(
        ["fuzz", "--url", "http://127.0.0.1:1", "--per-endpoint", "5", "--seed", "9"]
    )
    assert (args.url, args.per_endpoint, args.seed, args.start) == (
        "http://127.0.0.1:1",
        5,
        9,
        False,
    )
    with pytest.raises(SystemExit):
        build_parser().parse_args(["fuzz", "--url", "x", "--start"])


def test_named_event_streams_end_in_their_last_event() -> None:
    from hearthgate.loadtests.fuzz_judge import sse_problem

    created = b'{"type": "response.created", "response": {"error": null}}'
    done = b"event: response.created\ndata: " + created + b"\n\n"
    done += b'event: response.completed\ndata: {"type": "response.completed"}\n\n'
    assert sse_problem(done, named=True) == (None, False)
    cut = done.rsplit(b"event:", 1)[0]
    assert sse_problem(cut, named=True)[0] is not None
    # An OpenAI chunk stream still needs its [DONE].
    assert sse_problem(done)[0] == "stream does not end with data: [DONE]"
    failed = b'event: error\ndata: {"type": "error", "error": {"type": "api_error"}}\n\n'
    assert sse_problem(failed, named=True) == (None, True)


def test_anthropic_errors_are_a_valid_shape_only_where_asked() -> None:
    from hearthgate.loadtests.fuzz_judge import error_shape_problem

    body = b'{"type": "error", "error": {"type": "invalid_request_error", "message": "x"}}'
    assert error_shape_problem(body, anthropic=True) is None
    assert error_shape_problem(body) is not None
    openai = b'{"error": {"message": "x", "type": "t", "param": null, "code": null}}'
    assert error_shape_problem(openai, anthropic=True) is None
