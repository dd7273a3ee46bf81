"""Reading and checking a client's request body before anything else happens.

The gateway does not re-validate the whole OpenAI schema (the worker does that and its 400s
are passed through); it checks what it relies on itself: a JSON object no larger than the
limit, a string ``model``, and the types of the fields it reads or rewrites.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from starlette.requests import ClientDisconnect, Request

from hearthgate.gateway.audio import audio_seconds
from hearthgate.gateway.endpoints import ENDPOINTS, Endpoint
from hearthgate.gateway.errors import BadRequest, ClientGone, PayloadTooLarge
from hearthgate.gateway.multipart import Form, parse_form

# Integers the gateway reads or forwards must fit a 32-bit signed int, as vLLM's do.
_MAX_INT = 2**31 - 1


@dataclass(frozen=True)
class ParsedRequest:
    """A validated body and the fields the gateway uses from it."""

    endpoint: str  # the endpoint's name (gateway/endpoints): "chat", "responses", ...
    body: dict[str, Any]
    model: str
    stream: bool
    wants_usage: bool  # the client itself asked for the streaming usage chunk
    max_tokens: int | None
    path: str = ""  # the client's path (the worker serves the same); "": the endpoint's main
    query: str = ""  # the client's query string, passed on
    form: Form | None = None  # a multipart body's fields and files (``body``: its fields)
    audio_s: float | None = None  # the uploaded audio's length (speech-to-text)

    @property
    def spec(self) -> Endpoint:
        return ENDPOINTS[self.endpoint]

    @property
    def upstream_path(self) -> str:
        """The path and query the worker is asked on."""
        path = self.path or self.spec.path
        return f"{path}?{self.query}" if self.query else path


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
    try:
        async for chunk in request.stream():
            total += len(chunk)
            if total > limit:
                raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone() from None  # left while uploading: nothing to answer
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


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def json_depth(value: Any) -> int:
    """How deeply arrays and objects nest in a decoded JSON value (iterative)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            deepest = max(deepest, depth)
            stack.extend((x, depth + 1) for x in v.values())
        elif isinstance(v, list):
            deepest = max(deepest, depth)
            stack.extend((x, depth + 1) for x in v)
    return deepest


def decode_json(raw: bytes, max_depth: int = 64) -> Any:
    """Decode a JSON body or raise BadRequest: invalid JSON, ``NaN``/``Infinity``,
    integers too long to convert, nesting deeper than ``max_depth``."""
    try:
        value = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise BadRequest(f"request body nests deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if json_depth(value) > max_depth:
        raise BadRequest(f"request body nests deeper than {max_depth} levels")
    return value


def parse_body(
    raw: bytes,
    endpoint: str,
    max_depth: int = 64,
    max_n: int = 8,
    max_inputs: int = 2048,
    path: str = "",
    query: str = "",
) -> ParsedRequest:
    """Decode and check a request body for ``endpoint`` (a name of gateway/endpoints); raise
    BadRequest with a clear reason. ``max_n`` bounds ``n``, ``max_inputs`` the items of an
    embeddings ``input``; ``path`` and ``query``: where the client sent it."""
    if not raw.strip():
        raise BadRequest("request body is empty; expected a JSON object")
    body = decode_json(raw, max_depth)
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, got {_type_name(body)}")

    model = body.get("model")
    if model is None:
        raise BadRequest("'model' is required")
    if not isinstance(model, str) or not model:
        raise BadRequest(f"'model' must be a non-empty string, got {_type_name(model)}")

    spec = ENDPOINTS[endpoint]
    for group in spec.required:
        if all(body.get(key) is None for key in group):
            raise BadRequest(
                f"'{group[0]}' is required"
                if len(group) == 1
                else f"one of {', '.join(repr(k) for k in group)} is required"
            )
    for field in spec.types:
        _check(body, field.key, field.types, field.what)
    _check(body, "stream", (bool,), "a boolean")
    _check(body, "stream_options", (dict,), "an object")
    _check(body, "priority", (int,), "an integer")
    _check(body, "n", (int,), "an integer")
    for key in spec.max_tokens_keys:
        _check(body, key, (int,), "an integer")
    for key in (*spec.max_tokens_keys, "priority", "n"):
        v = body.get(key)
        if isinstance(v, int) and not -_MAX_INT <= v <= _MAX_INT:
            raise BadRequest(f"'{key}' is out of range")
    n = body.get("n")
    if n is not None and not 1 <= n <= max_n:
        raise BadRequest(f"'n' must be between 1 and {max_n}")
    if spec.check is not None:
        spec.check(body, max_inputs)

    stream = bool(body.get("stream") or False)
    if stream and spec.reader is None:
        raise BadRequest(f"'stream' is not supported for {endpoint}")
    opts = body.get("stream_options") or {}
    if opts and not stream:
        raise BadRequest("'stream_options' is only allowed when 'stream' is true")
    # Audio is relayed as it arrives, whatever the body says: ``stream`` means that here.
    stream = stream or spec.audio_out
    wants_usage = bool(opts.get("include_usage") or False)
    max_tokens = next((body[k] for k in spec.max_tokens_keys if body.get(k) is not None), None)
    if max_tokens is not None and max_tokens < 1:
        key = next(k for k in spec.max_tokens_keys if body.get(k) is not None)
        raise BadRequest(f"'{key}' must be at least 1")
    return ParsedRequest(
        endpoint=endpoint,
        body=body,
        model=model,
        stream=stream,
        wants_usage=wants_usage,
        max_tokens=max_tokens,
        path=path,
        query=query,
    )


_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no", ""})


def _form_flag(form: Form, key: str) -> bool:
    value = form.fields.get(key, "").strip().lower()
    if value not in _TRUE | _FALSE:
        raise BadRequest(f"'{key}' must be true or false, got {value!r}")
    return value in _TRUE


def parse_upload(
    raw: bytes, content_type: str | None, endpoint: str, path: str = "", query: str = ""
) -> ParsedRequest:
    """Read and check a multipart speech-to-text upload (run it in a thread: it parses the
    whole body and reads the audio's header). Needs ``model`` and one ``file``."""
    form = parse_form(raw, content_type)
    model = form.fields.get("model", "")
    if not model:
        raise BadRequest("'model' is required (a form field)")
    files = [f for f in form.files if f.name == "file"]
    if len(files) != 1:
        raise BadRequest(f"expected one 'file' part with the audio, got {len(files)}")
    if not files[0].data:
        raise BadRequest("the uploaded 'file' is empty")
    stream = _form_flag(form, "stream")
    wants_usage = _form_flag(form, "stream_include_usage")
    max_tokens: int | None = None
    spec = ENDPOINTS[endpoint]
    for key in spec.max_tokens_keys:
        if key in form.fields:
            try:
                max_tokens = int(form.fields[key])
            except ValueError:
                raise BadRequest(f"'{key}' must be an integer") from None
            if not 1 <= max_tokens <= _MAX_INT:
                raise BadRequest(f"'{key}' must be at least 1")
    return ParsedRequest(
        endpoint=endpoint,
        body=dict(form.fields),
        model=model,
        stream=stream,
        wants_usage=wants_usage,
        max_tokens=max_tokens,
        path=path,
        query=query,
        form=form,
        audio_s=audio_seconds(files[0].data),
    )
