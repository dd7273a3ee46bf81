"""Reading and checking a client's request body before anything else happens.

The gateway does not re-validate the whole OpenAI schema (the worker does that and its 400s
are passed through); it checks what it relies on itself: a JSON object no larger than the
limit, a string ``model``, and the types of the fields it reads or rewrites.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from gateway.errors import BadRequest, PayloadTooLarge

_ENDPOINT_INPUT = {
    "chat": "messages",
    "completions": "prompt",
    "embeddings": "input",
}


@dataclass(frozen=True)
class ParsedRequest:
    """A validated body and the fields the gateway uses from it."""

    endpoint: str  # "chat" | "completions" | "embeddings"
    body: dict[str, Any]
    model: str
    stream: bool
    wants_usage: bool  # the client itself asked for the streaming usage chunk
    max_tokens: int | None


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refusing anything over ``limit`` bytes without reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise BadRequest("Content-Length header is not a number") from None
        if size > limit:
            raise PayloadTooLarge(f"request body is {size} bytes; the limit is {limit} bytes")
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _type_name(v: object) -> str:
    return "null" if v is None else type(v).__name__


def _check(body: dict[str, Any], key: str, types: tuple[type, ...], what: str) -> None:
    if key not in body or body[key] is None:
        return
    v = body[key]
    # bool is an int in Python; JSON true is never a valid integer here.
    if isinstance(v, bool) and bool not in types:
        raise BadRequest(f"'{key}' must be {what}, got {_type_name(v)}")
    if not isinstance(v, types):
        raise BadRequest(f"'{key}' must be {what}, got {_type_name(v)}")


def parse_body(raw: bytes, endpoint: str) -> ParsedRequest:
    """Decode and check a request body for ``endpoint``; raise BadRequest with a clear reason."""
    if not raw.strip():
        raise BadRequest("request body is empty; expected a JSON object")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, got {_type_name(body)}")

    model = body.get("model")
    if model is None:
        raise BadRequest("'model' is required")
    if not isinstance(model, str) or not model:
        raise BadRequest(f"'model' must be a non-empty string, got {_type_name(model)}")

    input_key = _ENDPOINT_INPUT[endpoint]
    if body.get(input_key) is None:
        raise BadRequest(f"'{input_key}' is required")
    if endpoint == "chat":
        _check(body, "messages", (list,), "an array of messages")
    elif endpoint == "completions":
        _check(body, "prompt", (str, list), "a string or an array")
    else:
        _check(body, "input", (str, list), "a string or an array")

    _check(body, "stream", (bool,), "a boolean")
    _check(body, "stream_options", (dict,), "an object")
    _check(body, "max_tokens", (int,), "an integer")
    _check(body, "max_completion_tokens", (int,), "an integer")
    _check(body, "priority", (int,), "an integer")
    _check(body, "n", (int,), "an integer")

    stream = bool(body.get("stream") or False)
    if endpoint == "embeddings" and stream:
        raise BadRequest("'stream' is not supported for embeddings")
    opts = body.get("stream_options") or {}
    if opts and not stream:
        raise BadRequest("'stream_options' is only allowed when 'stream' is true")
    wants_usage = bool(opts.get("include_usage") or False)
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if max_tokens is not None and max_tokens < 1:
        raise BadRequest("'max_tokens' must be at least 1")
    return ParsedRequest(
        endpoint=endpoint,
        body=body,
        model=model,
        stream=stream,
        wants_usage=wants_usage,
        max_tokens=max_tokens,
    )
