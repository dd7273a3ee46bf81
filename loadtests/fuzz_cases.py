"""Generated requests for the fuzzer (``loadtests/fuzz.py``): one :class:`Case` per request.

Each case starts from a valid body, cheap for the worker (``max_tokens`` 1-8, a few short
inputs), then is turned into one kind of odd request: mutated fields, an odd input shape,
dropped fields, raw non-JSON bytes, deep nesting, a huge integer, a body near the size limit,
a duplicate key, another method or path. Headers vary on their own.

The structure (which kind, which optional fields, which header) comes from a ``random.Random``
that Hypothesis seeds per case, so the kinds keep their weights; the odd values come from
Hypothesis strategies, which lean to edges. :func:`generate` runs Hypothesis from a seed:
same seed and Hypothesis version, same cases in the same order.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import hypothesis
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import strategies as st
from hypothesis.strategies import DrawFn, SearchStrategy

from hearthgate.loadtests.fuzz_values import (
    DROP,
    UNKNOWN_FIELDS,
    FuzzConfig,
    Raw,
    big_int,
    clip,
    field_values,
    nested,
    odd_input,
    render,
    weighted,
    weird,
)

T = TypeVar("T")

ENDPOINTS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
    "rerank": "/v1/rerank",
    "score": "/v1/score",
}
INPUT_KEY = {
    "chat": "messages",
    "completions": "prompt",
    "embeddings": "input",
    "responses": "input",
    "messages": "messages",
    "rerank": "documents",
    "score": "text_2",
}
# Their streams are named events that end in a last event, not ``data: [DONE]``.
NAMED_EVENTS = frozenset({"responses", "messages"})
# Their errors come in Anthropic's shape (as vLLM's own answers there).
ANTHROPIC_ERRORS = frozenset({"messages"})


@dataclass(frozen=True)
class Case:
    """One generated request."""

    endpoint: str  # chat | completions | embeddings
    kind: str  # valid, mutate, shape, drop, raw, nested, bigint, oversize, dupkey, method, path
    detail: str  # what was changed, for the report
    method: str
    path: str
    headers: tuple[tuple[str, str], ...]  # values are latin-1 text (sent as those bytes)
    body: bytes
    chunked: bool = False  # sent with Transfer-Encoding: chunked (no Content-Length)
    stream: bool = False  # the body is a JSON object asking for a stream

    def describe(self, limit: int = 300) -> str:
        """The request on one line (the body shown up to ``limit`` bytes)."""
        shown = repr(self.body[:limit])
        if len(self.body) > limit:
            shown += f" ...(+{len(self.body) - limit} bytes)"
        hdrs = ", ".join(f"{k}: {clip(v, 60)!r}" for k, v in self.headers)
        how = " (chunked)" if self.chunked else ""
        return f"{self.method} {self.path}{how} [{hdrs}] body {len(self.body)} B: {shown}"


def pick(rnd: random.Random, options: Sequence[tuple[int, T]]) -> T:
    """One of ``options`` (weight, value) by weight."""
    return rnd.choices([v for _, v in options], weights=[w for w, _ in options])[0]


# ---------------------------------------------------------------- valid bodies

_WORDS = ["the", "family", "calendar", "says", "soccer", "practice", "moved", "thursday"]
_WORDS += ["dinner", "lamp", "notes", "garden", "because", "tonight", "remind", "me"]


def _text(rnd: random.Random, most: int = 8) -> str:
    return " ".join(rnd.choices(_WORDS, k=rnd.randint(1, most)))


def _ids(rnd: random.Random, cfg: FuzzConfig) -> list[int]:
    return [rnd.randrange(cfg.vocab) for _ in range(rnd.randint(1, 16))]


def valid_body(rnd: random.Random, endpoint: str, cfg: FuzzConfig) -> dict[str, Any]:
    """A body the worker accepts, cheap to serve."""
    if endpoint == "embeddings":
        inputs: object = pick(
            rnd,
            [
                (4, _text(rnd)),
                (2, [_text(rnd) for _ in range(rnd.randint(1, 4))]),
                (1, _ids(rnd, cfg)),
                (1, [_ids(rnd, cfg) for _ in range(rnd.randint(1, 3))]),
            ],
        )
        body: dict[str, Any] = {"model": cfg.embed_model, "input": inputs}
        if rnd.random() < 0.2:
            body["encoding_format"] = rnd.choice(["float", "base64"])
        if rnd.random() < 0.1:
            body["user"] = _text(rnd, 2)
        return body
    if endpoint in ("rerank", "score"):
        docs = [_text(rnd) for _ in range(rnd.randint(1, 4))]
        if endpoint == "rerank":
            body = {"model": cfg.rerank_model, "query": _text(rnd), "documents": docs}
            if rnd.random() < 0.3:
                body["top_n"] = rnd.randint(1, len(docs))
        else:
            body = {"model": cfg.rerank_model, "text_1": _text(rnd), "text_2": docs}
        return body
    if endpoint == "responses":
        turn = {"role": "user", "content": _text(rnd)}
        items: object = pick(
            rnd, [(3, _text(rnd)), (2, [turn]), (1, [{"type": "message", **turn}])]
        )
        body = {"model": cfg.gen_model, "input": items, "max_output_tokens": rnd.randint(1, 8)}
        if rnd.random() < 0.3:
            body["instructions"] = _text(rnd)
        if rnd.random() < 0.3:
            body["store"] = rnd.random() < 0.5
        if rnd.random() < 0.4:
            body["stream"] = True
        if rnd.random() < 0.5:
            body["ignore_eos"] = True
        return body
    if endpoint == "messages":
        body = {
            "model": cfg.gen_model,
            "max_tokens": rnd.randint(1, 8),
            "messages": [{"role": "user", "content": _text(rnd)}],
        }
        if rnd.random() < 0.3:
            body["system"] = _text(rnd)
        if rnd.random() < 0.4:
            body["stream"] = True
        if rnd.random() < 0.25:
            body["temperature"] = rnd.choice([0, 0.7, 1.0])
        return body
    if endpoint == "chat":
        roles = ["user", "assistant", "system"]
        messages = [
            {"role": rnd.choice(roles), "content": _text(rnd)} for _ in range(rnd.randint(0, 2))
        ]
        messages.append({"role": "user", "content": _text(rnd)})
        body = {"model": cfg.gen_model, "messages": messages}
        budget = "max_completion_tokens" if rnd.random() < 0.2 else "max_tokens"
        body[budget] = rnd.randint(1, 8)
        if rnd.random() < 0.2:
            body["logprobs"] = True
            body["top_logprobs"] = rnd.randint(0, 3)
    else:
        prompt = pick(
            rnd,
            [
                (5, _text(rnd)),
                (1, [_text(rnd) for _ in range(rnd.randint(1, 2))]),
                (2, _ids(rnd, cfg)),
            ],
        )
        body = {"model": cfg.gen_model, "prompt": prompt, "max_tokens": rnd.randint(1, 8)}
        if rnd.random() < 0.2:
            body["logprobs"] = rnd.randint(0, 2)
        if rnd.random() < 0.1:
            body["echo"] = True
    optional: dict[str, Callable[[], object]] = {
        "temperature": lambda: rnd.choice([0, 0.0, 0.7, 1.0]),
        "seed": lambda: rnd.randrange(2**31),
        "top_p": lambda: rnd.choice([0.5, 0.9, 1.0]),
        "user": lambda: _text(rnd, 2),
        "n": lambda: rnd.randint(1, 2),
    }
    for name, make in optional.items():
        if rnd.random() < 0.25:
            body[name] = make()
    if rnd.random() < 0.5:
        body["ignore_eos"] = True
    if rnd.random() < 0.35:
        body["stream"] = True
        usage = pick(rnd, [(4, None), (3, {"include_usage": rnd.random() < 0.5}), (1, "both")])
        if usage == "both":
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        elif usage is not None:
            body["stream_options"] = usage
    elif rnd.random() < 0.1:
        body["stream"] = False
    return body


# ---------------------------------------------------------------- headers

_CONTENT_TYPES = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; b=x"]
_CONTENT_TYPES += ["application/json; charset=utf-16", "", "*/*", "application/jsoné", "é"]
_EXTRA_HEADERS = [
    ("Accept", "text/event-stream"),
    ("Accept", "application/x-garbage"),
    ("Content-Encoding", "gzip"),
    ("X-Request-Id", "fuzz"),
    ("X-Forwarded-For", "10.0.0.1"),
    ("Accept-Encoding", "br, gzip, zstd"),
    ("X-Hearthgate-Class", "batch"),  # possibly a second class header
    ("X-Odd", "a\tb"),
]
# Not sent: control characters (other than tab) in header values, and values with leading or
# trailing white space. The HTTP client refuses to send the latter; the server's HTTP parser
# (uvicorn with httptools) answers the former with a plain-text "400 Invalid HTTP request
# received." before the gateway sees the request.


def headers(rnd: random.Random, cfg: FuzzConfig) -> tuple[tuple[str, str], ...]:
    """Mostly right headers; now and then a wrong Content-Type, key or class, or extras."""
    k = cfg.key or "k"
    bad_auth: list[str | None] = [None, "", "Bearer", "Bearer\t" + k, "bearer " + k, f"Bearer  {k}"]
    bad_auth += ["Basic dXNlcjpwYXNz", "Bearer wrong", "Token " + k, f"Bearer {k}\tx"]
    bad_auth += ["Bearer " + "x" * 9000, f"Bearer {k}é", f"Bearer {k}, Bearer {k}"]
    auth = f"Bearer {cfg.key}" if cfg.key else None
    if rnd.random() < 0.15:
        auth = rnd.choice(bad_auth)
    ctype: str | None = "application/json"
    if rnd.random() < 0.2:
        ctype = rnd.choice([None, None, *_CONTENT_TYPES])
    cls = None
    if rnd.random() < 0.3:
        cls = rnd.choice([*cfg.classes, "unknown", "", "VOICE", "chat\t1", "x" * 300, "é", "ch at"])
    named = [("Content-Type", ctype), ("Authorization", auth), ("X-Hearthgate-Class", cls)]
    out = [(name, value) for name, value in named if value is not None]
    if rnd.random() < 0.1:
        out += rnd.sample(_EXTRA_HEADERS, rnd.randint(1, 2))
    return tuple(out)


# ---------------------------------------------------------------- odd bodies

_FIXED_RAW = [b"", b" \n\t ", b"[]", b"null", b"1", b'"text"', b"true", b"{}", b"{", b"}"]
_FIXED_RAW += [b"{'model': 'x'}", b"model=tiny-llama&prompt=hi", b"\x00" * 64, b"\xef\xbb\xbf{}"]
_FIXED_RAW += [
    b'{"model": "tiny-llama", /* c */ "prompt": "x"}',
    b'{"model": "tiny-llama", "prompt": "\xff\xfe"}',
    b'{"model": "tiny-llama", "prompt": "x"}\x00',
]


_ONE_EACH = [(1, w) for w in ("utf-16", "utf-8-bom", "trailing", "array of body", "whitespace")]
_ONE_EACH += [(1, "many keys")]


def raw_body(rnd: random.Random, valid: bytes, binary: bytes) -> tuple[str, bytes]:
    """(what, bytes) for a body that is not a JSON object, or not well-formed."""
    what = pick(
        rnd,
        [(3, "binary"), (3, "fixed"), (3, "truncated"), *_ONE_EACH],
    )
    if what == "binary":
        return what, binary
    if what == "fixed":
        return what, rnd.choice(_FIXED_RAW)
    if what == "truncated":
        return what, valid[: rnd.randrange(max(1, len(valid)))]
    if what == "utf-16":
        return what, valid.decode("utf-8", "surrogatepass").encode("utf-16", "surrogatepass")
    if what == "utf-8-bom":
        return what, b"\xef\xbb\xbf" + valid
    if what == "trailing":
        return what, valid + b"}"
    if what == "array of body":
        return what, b"[" + valid + b"]"
    if what == "whitespace":
        return what, b" " * 5000 + valid + b"\n" * 5000
    n = rnd.choice([100, 1000, 20_000])
    return f"{n} keys", ("{" + ", ".join(f'"k{i}": {i}' for i in range(n)) + "}").encode()


def padded(body: dict[str, Any], key: str, target: int, filler: str, ascii_only: bool) -> bytes:
    """``body`` with ``key`` (for ``messages``: one message's content) a string of
    ``filler`` that brings the whole body to ``target`` bytes (or the least above)."""

    def with_value(v: object) -> dict[str, Any]:
        if key == "messages":
            return {**body, key: [{"role": "user", "content": v}]}
        return {**body, key: v}

    base = render(with_value(""), ascii_only)
    unit = json.dumps(filler, ensure_ascii=ascii_only)[1:-1]
    size = len(unit.encode("utf-8", "surrogatepass"))
    reps, rest = divmod(max(0, target - len(base)), size)
    return render(with_value(Raw('"' + unit * reps + "a" * rest + '"')), ascii_only)


# ---------------------------------------------------------------- cases

_KINDS = [(25, "valid"), (35, "mutate"), (10, "shape"), (4, "drop"), (8, "raw"), (4, "nested")]
_KINDS += [(4, "bigint"), (4, "oversize"), (3, "dupkey")]
_METHODS = ["GET", "PUT", "PATCH", "DELETE", "OPTIONS"]


def cases(endpoint: str, cfg: FuzzConfig) -> SearchStrategy[Case]:
    """Requests for one endpoint: every kind by weight, odd headers now and then."""
    if endpoint not in ENDPOINTS:
        raise ValueError(f"unknown endpoint {endpoint!r}")
    values = field_values(endpoint, cfg)
    fields = sorted(values)
    input_key = INPUT_KEY[endpoint]
    any_value = weird(cfg)
    unknown = st.sampled_from(UNKNOWN_FIELDS) | st.text(max_size=10)
    shapes = odd_input(endpoint, cfg)
    deep = nested(cfg)
    big = big_int(cfg)
    deltas = weighted(
        (3, st.sampled_from([-1, 0, 1, 2, -100, 100])),
        (2, st.integers(-2000, 2000)),
        (1, st.integers(-cfg.body_limit // 2, cfg.body_limit)),
    )

    @st.composite
    def gen(draw: DrawFn) -> Case:
        rnd = draw(st.randoms(use_true_random=True))
        kind = pick(rnd, _KINDS)
        ascii_only = rnd.random() < 0.8
        body: dict[str, Any] = valid_body(rnd, endpoint, cfg)
        if not cfg.send_seed:
            body.pop("seed", None)
        stream = body.get("stream") is True
        detail = ""
        raw: bytes | None = None
        if kind == "mutate":
            touched = []
            for _ in range(rnd.randint(1, 3)):
                name = draw(unknown) if rnd.random() < 0.1 else rnd.choice(fields)
                value = draw(values[name]) if name in values else draw(any_value)
                if value is DROP:
                    body.pop(name, None)
                else:
                    body[name] = value
                touched.append(f"{name}={clip(repr(value), 50)}")
            detail = "; ".join(touched)
            stream = body.get("stream") is True
            if not cfg.send_seed:
                body.pop("seed", None)
        elif kind == "shape":
            body[input_key] = draw(shapes)
            detail = f"{input_key}={clip(repr(body[input_key]), 60)}"
        elif kind == "drop":
            droppable = [k for k in body if k not in ("max_tokens", "max_completion_tokens")]
            gone = rnd.sample(droppable, min(len(droppable), rnd.randint(1, 2)))
            for k in gone:
                body.pop(k)
            detail = ", ".join(sorted(gone))
            stream = body.get("stream") is True
        elif kind == "raw":
            detail, raw = raw_body(rnd, render(body), draw(st.binary(max_size=200)))
            stream = False
        elif kind == "nested":
            value = draw(deep)
            where = rnd.choice([input_key, "unknown field", "whole body", "model"])
            detail = f"{where}: {clip(value.text, 24)} ({len(value.text)} chars)"
            if where == "whole body":
                raw, stream = value.text.encode(), False
            else:
                body["nested" if where == "unknown field" else where] = value
        elif kind == "bigint":
            value = draw(big)
            assert isinstance(value, Raw)
            where = rnd.choice(["max_tokens", "n", "seed", "temperature", "priority", "zz"])
            if endpoint == "embeddings" and where != "zz":
                where = rnd.choice(["dimensions", "truncate_prompt_tokens", "priority"])
            if rnd.random() < 0.25:
                where = input_key
                chat = endpoint in ("chat", "messages")
                inner = {"role": "user", "content": value} if chat else value
                body[where] = [inner]
            else:
                body[where] = value
            detail = f"{where}: {len(value.text.lstrip('-'))} digit integer"
        elif kind == "oversize":
            delta = draw(deltas)
            filler = rnd.choice(["a", "lorem ", "é", "💥", "\x01"])
            key = rnd.choice([input_key, input_key, "user", "unknown"])
            raw = padded(body, key, cfg.body_limit + delta, filler, ascii_only)
            detail = f"{key} padded with {filler!r} to limit{delta:+d} ({len(raw)} B)"
        elif kind == "dupkey":
            name = rnd.choice(["model", "stream", "max_tokens", input_key, "n"])
            value = draw(values[name]) if name in values else draw(any_value)
            first = render({name: None if value is DROP else value}, ascii_only)
            raw = first[:-1] + b", " + render(body, ascii_only)[1:]
            detail = f"{name} twice, first {clip(repr(value), 50)}"
        if raw is None:
            raw = render(body, ascii_only)
        method, path = "POST", ENDPOINTS[endpoint]
        if rnd.random() < 0.025:
            method = rnd.choice(_METHODS)
            raw = b"" if method in ("GET", "OPTIONS", "DELETE") else raw
            kind, detail = "method", method
        elif rnd.random() < 0.015:
            path = rnd.choice([path + "/", path + "?stream=true", path.upper(), "/" + path])
            kind, detail = "path", path
        return Case(
            endpoint=endpoint,
            kind=kind,
            detail=detail if ascii_only else f"{detail} (UTF-8)".strip(),
            method=method,
            path=path,
            headers=headers(rnd, cfg),
            body=raw,
            chunked=rnd.random() < 0.1,
            stream=stream,
        )

    return gen()


def _chunk(
    strategy: SearchStrategy[Case], size: int, seed: int, sink: Callable[[Case], None]
) -> int:
    """Run Hypothesis once: ``size`` examples from ``seed`` into ``sink``; return the count."""
    produced = 0

    @settings(
        max_examples=size,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
    )
    @hypothesis.seed(seed)
    @given(strategy)
    def collect(case: Case) -> None:
        nonlocal produced
        if produced < size:
            produced += 1
            sink(case)

    collect()
    return produced


def generate(
    endpoint: str,
    n: int,
    seed: int,
    cfg: FuzzConfig,
    sink: Callable[[Case], None],
    chunk: int = 1000,
) -> int:
    """Feed ``n`` generated cases for ``endpoint`` to ``sink``, in order; return how many.

    Hypothesis runs in chunks of ``chunk`` examples (its bookkeeping grows with every
    example), each chunk from a seed derived from ``seed``: same seed, same cases."""
    strategy = cases(endpoint, cfg)
    done = index = 0
    while done < n:
        produced = _chunk(strategy, min(chunk, n - done), seed * 1_000_003 + index, sink)
        if produced == 0:
            break
        done += produced
        index += 1
    return done
