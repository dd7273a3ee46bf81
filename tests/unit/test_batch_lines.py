"""Batch API input checks (gateway/batches/lines.py): pure functions of a file's bytes and
the limits. Every problem with a line names that line (1-based)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from hearthgate.gateway.batches.lines import (
    BATCH_ENDPOINTS,
    BatchLine,
    InvalidFile,
    LineProblem,
    check_batch,
    split_lines,
)
from hearthgate.gateway.errors import BadRequest

CHAT = "/v1/chat/completions"
MODELS = ["m", "m2"]
BIG = 10**9


def chat_line(custom_id: Any = "c1", **overrides: Any) -> dict[str, Any]:
    line: dict[str, Any] = {
        "custom_id": custom_id,
        "method": "POST",
        "url": CHAT,
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
    }
    line.update(overrides)
    return line


def body_with(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body.update(fields)
    return body


def text(*lines: dict[str, Any] | str) -> list[str]:
    return [ln if isinstance(ln, str) else json.dumps(ln) for ln in lines]


def split(content: bytes, max_bytes: int = BIG, max_lines: int = BIG) -> tuple[list[str], bool]:
    return split_lines(content, max_bytes, max_lines)


def check(lines: list[str], endpoint: str = CHAT, max_body_bytes: int = BIG) -> list[BatchLine]:
    return check_batch(lines, endpoint, MODELS, max_body_bytes)


def problems_of(exc: pytest.ExceptionInfo[InvalidFile]) -> dict[int, str]:
    return {p.line: p.message for p in exc.value.problems}


# ---------------------------------------------------------------- split_lines


@pytest.mark.parametrize("trailing", [True, False])
def test_split_keeps_lines_in_order_with_or_without_trailing_newline(trailing: bool) -> None:
    content = b'{"a": 1}\n{"b": 2}\n{"c": 3}' + (b"\n" if trailing else b"")
    lines, ended = split(content)
    assert lines == ['{"a": 1}', '{"b": 2}', '{"c": 3}']
    assert ended is trailing


def test_split_keeps_crlf_line_endings_so_the_file_reads_back_the_same() -> None:
    content = b'{"a": 1}\r\n{"b": 2}\r\n'
    lines, ended = split(content)
    assert lines == ['{"a": 1}\r', '{"b": 2}\r']
    assert ended is True
    assert ("\n".join(lines) + "\n").encode() == content
    lines, ended = split(b'{"a": 1}\r\n{"b": 2}')
    assert lines == ['{"a": 1}\r', '{"b": 2}']
    assert ended is False


@pytest.mark.parametrize("content", [b"", b"\n", b"\r\n"])
def test_split_refuses_an_empty_file(content: bytes) -> None:
    with pytest.raises(BadRequest, match="file is empty") as exc:
        split(content)
    assert exc.value.status == 400


def test_split_names_an_empty_line_in_the_middle() -> None:
    with pytest.raises(InvalidFile) as exc:
        split(b'{"a": 1}\n\n{"c": 3}\n   \n{"e": 5}\n')
    assert problems_of(exc) == {2: "empty line", 4: "empty line"}
    assert "line 2: empty line" in exc.value.message
    assert "line 4: empty line" in exc.value.message
    assert exc.value.status == 400
    assert exc.value.code == "invalid_batch_file"


def test_split_refuses_text_that_is_not_utf8() -> None:
    with pytest.raises(BadRequest, match=r"not UTF-8 text \(byte 9\)"):
        split(b'{"a": 1}\n\xff\xfe{"b": 2}\n')


def test_split_names_a_line_that_is_not_json() -> None:
    with pytest.raises(InvalidFile) as exc:
        split(b'{"a": 1}\n{"b": \n{"c": 3}\n')
    problems = problems_of(exc)
    assert list(problems) == [2]
    assert problems[2].startswith("not valid JSON")
    assert exc.value.message.startswith("the file is not valid batch input: line 2: not valid JSON")


@pytest.mark.parametrize("value", ["[1, 2]", '"text"', "42", "null", "true"])
def test_split_names_json_that_is_not_an_object(value: str) -> None:
    with pytest.raises(InvalidFile) as exc:
        split(f'{{"a": 1}}\n{value}\n'.encode())
    assert problems_of(exc) == {2: "not a JSON object"}
    assert "line 2: not a JSON object" in exc.value.message


def test_split_names_a_line_nested_too_deep_for_the_json_parser() -> None:
    # json.loads raises RecursionError (not ValueError) for this: it must still be a 400
    # naming the line, not an unexpected exception (a 500 at upload).
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(InvalidFile) as exc:
        split(f'{{"a": 1}}\n{deep}\n'.encode())
    assert problems_of(exc) == {2: "not valid JSON (nests too deep)"}


def test_split_refuses_too_many_lines() -> None:
    content = b'{"a": 1}\n' * 4
    assert len(split(content, max_lines=4)[0]) == 4
    with pytest.raises(BadRequest) as exc:
        split(content, max_lines=3)
    assert exc.value.code == "too_many_lines"
    assert exc.value.message == "file has 4 lines; batch.max_lines is 3"


def test_split_refuses_too_many_bytes_before_reading_lines() -> None:
    content = b'{"a": 1}\n' * 4  # 36 bytes
    assert len(split(content, max_bytes=36)[0]) == 4
    with pytest.raises(BadRequest) as exc:
        split(content + b"\xff", max_bytes=36)  # not even decoded: the size comes first
    assert exc.value.code == "file_too_large"
    assert exc.value.message == "file is 37 bytes; batch.max_file_bytes is 36"


def test_split_lists_at_most_five_problems_then_how_many_more() -> None:
    content = b"\n".join([b'{"ok": 1}'] + [b"nope"] * 8) + b"\n"
    with pytest.raises(InvalidFile) as exc:
        split(content)
    assert sorted(problems_of(exc)) == list(range(2, 10))
    msg = exc.value.message
    assert [int(n) for n in re.findall(r"line (\d+): ", msg)] == [2, 3, 4, 5, 6]
    assert msg.endswith("(and 3 more)")


# ---------------------------------------------------------------- check_batch


def test_check_accepts_good_lines_with_compact_bodies_in_order() -> None:
    lines = text(chat_line("a"), chat_line("b", body=body_with(model="m2", n=2)))
    got = check(lines)
    assert [(b.index, b.custom_id) for b in got] == [(0, "a"), (1, "b")]
    assert json.loads(got[1].body) == body_with(model="m2", n=2)
    assert " " not in got[0].body.replace('"hi"', "")  # compact separators


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("/v1/completions", {"model": "m", "prompt": "hello", "max_tokens": 3}),
        ("/v1/embeddings", {"model": "m", "input": ["a", "b"]}),
        ("/v1/embeddings", {"model": "m", "input": "a"}),
    ],
)
def test_check_accepts_every_endpoint(endpoint: str, body: dict[str, Any]) -> None:
    line = {"custom_id": "x", "method": "POST", "url": endpoint, "body": body}
    (got,) = check(text(line), endpoint)
    assert got.custom_id == "x" and json.loads(got.body) == body


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ({k: v for k, v in chat_line().items() if k != "custom_id"}, "'custom_id'"),
        (chat_line(""), "'custom_id'"),
        (chat_line(7), "'custom_id'"),
        (chat_line(None), "'custom_id'"),
        (chat_line(["a"]), "'custom_id'"),
        (chat_line(method="GET"), '\'method\' must be "POST", got "GET"'),
        (chat_line(method=None), "'method' must be \"POST\", got null"),
        (
            chat_line(url="/v1/embeddings"),
            f"'url' is \"/v1/embeddings\"; this batch's endpoint is {CHAT}",
        ),
        (chat_line(url="/v1/chat/completions/"), "'url' is"),
        (chat_line(body="hi"), "'body' must be a JSON object"),
        (chat_line(body=None), "'body' must be a JSON object"),
        (chat_line(body=[1]), "'body' must be a JSON object"),
        (chat_line(body=body_with(stream=True)), "'stream': true is not supported in a batch"),
        (chat_line(body=body_with(model="nope")), "model 'nope' does not exist; available: m, m2"),
        (chat_line(body=body_with(n=99)), "'n' must be between 1 and 8"),
        (chat_line(body=body_with(max_tokens=0)), "'max_tokens' must be at least 1"),
        (chat_line(body=body_with(max_tokens="5")), "'max_tokens' must be an integer"),
        (chat_line(body={"model": "m"}), "'messages' is required"),
        (chat_line(body=body_with(stream_options={"include_usage": True})), "'stream_options'"),
    ],
)
def test_check_names_the_line_of_each_problem(line: dict[str, Any], needle: str) -> None:
    with pytest.raises(InvalidFile) as exc:
        check(text(chat_line("ok"), line, chat_line("ok2")))
    problems = problems_of(exc)
    assert list(problems) == [2], problems
    assert needle in problems[2]
    assert exc.value.message.startswith("the input file cannot run as a batch: line 2: ")
    assert needle in exc.value.message
    assert exc.value.status == 400 and exc.value.code == "invalid_batch_file"


def test_check_refuses_streaming_embeddings_too() -> None:
    line: dict[str, Any] = {"custom_id": "e", "method": "POST", "url": "/v1/embeddings"}
    line["body"] = {"model": "m", "input": "x", "stream": True}
    with pytest.raises(InvalidFile, match=r"line 1: .*'stream'"):
        check(text(line), "/v1/embeddings")


def test_check_refuses_a_body_over_max_body_bytes() -> None:
    small = chat_line("s")
    raw = json.dumps(small["body"], separators=(",", ":"))
    size = len(raw.encode())
    assert check(text(small), max_body_bytes=size)  # exactly at the limit: fine
    with pytest.raises(InvalidFile) as exc:
        check(text(chat_line("x"), small), max_body_bytes=size - 1)
    problems = problems_of(exc)
    assert problems == {
        1: f"'body' is {size} bytes; limits.max_body_bytes is {size - 1}",
        2: f"'body' is {size} bytes; limits.max_body_bytes is {size - 1}",
    }


def test_check_counts_body_bytes_as_utf8() -> None:
    body = body_with(messages=[{"role": "user", "content": "é" * 100}])
    raw = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    assert len(raw.encode()) > len(raw)
    with pytest.raises(InvalidFile, match=r"line 1: 'body' is \d+ bytes"):
        check(text(chat_line(body=body)), max_body_bytes=len(raw))


def test_check_names_both_lines_of_a_repeated_custom_id() -> None:
    lines = text(chat_line("a"), chat_line("b"), chat_line("a"), chat_line("a"))
    with pytest.raises(InvalidFile) as exc:
        check(lines)
    assert problems_of(exc) == {
        3: "custom_id 'a' repeats line 1",
        4: "custom_id 'a' repeats line 1",
    }
    assert "line 3: custom_id 'a' repeats line 1" in exc.value.message


def test_check_applies_the_live_request_limits() -> None:
    line = chat_line(body=body_with(n=3))
    assert check_batch(text(line), CHAT, MODELS, BIG, max_n=3)
    with pytest.raises(InvalidFile, match=r"line 1: 'n' must be between 1 and 2"):
        check_batch(text(line), CHAT, MODELS, BIG, max_n=2)
    emb: dict[str, Any] = {"custom_id": "e", "method": "POST", "url": "/v1/embeddings"}
    emb["body"] = {"model": "m", "input": ["a", "b", "c"]}
    with pytest.raises(InvalidFile, match=r"line 1: 'input' holds 3 items; at most 2"):
        check_batch(text(emb), "/v1/embeddings", MODELS, BIG, max_inputs=2)
    deep = chat_line(body=body_with(extra=[[[[["x"]]]]]))
    with pytest.raises(InvalidFile, match=r"line 1: .*nests deeper than 5 levels"):
        check_batch(text(deep), CHAT, MODELS, BIG, max_json_depth=5)


def test_check_names_lines_that_are_not_objects_or_not_json() -> None:
    # check_batch gets lines from Redis; it does not trust them to be what split_lines let in.
    with pytest.raises(InvalidFile) as exc:
        check(["[1]", "{nope", "NaN", json.dumps(chat_line("ok"))])
    problems = problems_of(exc)
    assert sorted(problems) == [1, 2, 3]
    assert problems[1] == "not a JSON object"
    assert "not valid JSON" in problems[2] and "not valid JSON" in problems[3]


def test_check_lists_every_problem_in_one_error_with_and_n_more() -> None:
    lines = text(
        chat_line("ok"),
        chat_line(""),  # 2
        chat_line("b", method="PUT"),  # 3
        chat_line("c", url="/v1/embeddings"),  # 4
        chat_line("d", body=body_with(stream=True)),  # 5
        chat_line("e", body=body_with(model="x")),  # 6
        chat_line("f", body=body_with(n=100)),  # 7
        chat_line("ok"),  # 8
    )
    with pytest.raises(InvalidFile) as exc:
        check(lines)
    assert sorted(problems_of(exc)) == [2, 3, 4, 5, 6, 7, 8]
    msg = exc.value.message
    assert [int(n) for n in re.findall(r"line (\d+): ", msg)] == [2, 3, 4, 5, 6]
    assert msg.endswith(" (and 2 more)")
    assert "line 7" not in msg


def test_check_with_exactly_five_problems_says_no_more() -> None:
    lines = text(*(chat_line(str(i), method="GET") for i in range(5)))
    with pytest.raises(InvalidFile) as exc:
        check(lines)
    assert len(exc.value.problems) == 5
    assert "more)" not in exc.value.message


@pytest.mark.parametrize("endpoint", ["/v1/audio/speech", "/v1/chat/completions/", "", "chat"])
def test_check_refuses_an_unsupported_endpoint(endpoint: str) -> None:
    with pytest.raises(BadRequest) as exc:
        check(text(chat_line()), endpoint)
    assert not isinstance(exc.value, InvalidFile)
    assert exc.value.code == "invalid_endpoint"
    for supported in BATCH_ENDPOINTS:
        assert supported in exc.value.message


def test_line_problem_reads_as_its_line() -> None:
    assert str(LineProblem(12, "empty line")) == "line 12: empty line"
