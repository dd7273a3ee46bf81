"""Request body checks: what the gateway relies on is validated with clear messages."""

from __future__ import annotations

import json

import pytest

from hearthgate.gateway.errors import BadRequest
from hearthgate.gateway.parse import parse_body


def raw(**body: object) -> bytes:
    return json.dumps(body).encode()


def test_chat_stream_flags() -> None:
    p = parse_body(raw(model="m", messages=[], stream=True, max_tokens=5), "chat")
    assert p.stream and not p.wants_usage and p.max_tokens == 5 and p.model == "m"
    p = parse_body(
        raw(model="m", prompt="x", stream=True, stream_options={"include_usage": True}),
        "completions",
    )
    assert p.wants_usage
    p = parse_body(raw(model="m", messages=[], max_completion_tokens=7, max_tokens=3), "chat")
    assert p.max_tokens == 7
    # vLLM's completions read max_tokens only (max_completion_tokens is chat's).
    p = parse_body(raw(model="m", prompt="x", max_completion_tokens=7, max_tokens=3), "completions")
    assert p.max_tokens == 3


@pytest.mark.parametrize(
    ("body", "endpoint", "needle"),
    [
        (b"", "chat", "empty"),
        (b"{not json", "chat", "not valid JSON"),
        (b"\xff\xfe", "chat", "not valid JSON"),
        (b"[1, 2]", "chat", "JSON object"),
        (raw(messages=[]), "chat", "'model' is required"),
        (raw(model=3, messages=[]), "chat", "'model' must be"),
        (raw(model="m"), "chat", "'messages' is required"),
        (raw(model="m", messages="hi"), "chat", "'messages' must be"),
        (raw(model="m", prompt=5), "completions", "'prompt' must be"),
        (raw(model="m", input={"a": 1}), "embeddings", "'input' must be"),
        (raw(model="m", prompt="x", stream="yes"), "completions", "'stream' must be a boolean"),
        (raw(model="m", prompt="x", max_tokens="x"), "completions", "'max_tokens' must be"),
        (raw(model="m", prompt="x", max_tokens=True), "completions", "'max_tokens' must be"),
        (raw(model="m", prompt="x", max_tokens=0), "completions", "at least 1"),
        (raw(model="m", prompt="x", stream_options=[1]), "completions", "'stream_options' must"),
        (
            raw(model="m", prompt="x", stream_options={"include_usage": True}),
            "completions",
            "only allowed when 'stream' is true",
        ),
        (raw(model="m", input="x", stream=True), "embeddings", "not supported"),
        (raw(model="m", prompt="x", priority="high"), "completions", "'priority' must be"),
    ],
)
def test_bad_bodies(body: bytes, endpoint: str, needle: str) -> None:
    with pytest.raises(BadRequest) as info:
        parse_body(body, endpoint)
    assert needle in info.value.message
