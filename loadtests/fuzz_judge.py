"""Judging one answer of the fuzzer (``loadtests/fuzz.py``): who made it, and whether it
keeps the gateway's contract (no 5xx of its own, OpenAI-shaped 4xx, well-formed streams)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from hearthgate.loadtests.fuzz_cases import ANTHROPIC_ERRORS, NAMED_EVENTS, Case
from hearthgate.loadtests.fuzz_values import clip

WORKER_HEADER = "x-hearthgate-worker"
Origin = Literal["gateway", "worker", "none"]


def anthropic_error_problem(obj: dict[str, object]) -> str | None:
    """Why ``obj`` is not Anthropic's error shape (``{"type": "error", "error": {"type",
    "message"}}``), or None when it is."""
    err = obj.get("error")
    if obj.get("type") != "error" or not isinstance(err, dict):
        return "not Anthropic's error shape"
    for key in ("type", "message"):
        if not isinstance(err.get(key), str):
            return f"'error.{key}' is not a string"
    return None


def error_shape_problem(body: bytes, anthropic: bool = False) -> str | None:
    """Why ``body`` is not OpenAI's error shape (``anthropic``: nor Anthropic's; vLLM
    answers /v1/messages in both, its request validation in OpenAI's), or None when it
    is."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return "not JSON"
    if not isinstance(obj, dict):
        return "not a JSON object"
    if anthropic and anthropic_error_problem(obj) is None:
        return None
    err = obj.get("error")
    if not isinstance(err, dict):
        return "no 'error' object"
    for key in ("message", "type"):
        if not isinstance(err.get(key), str):
            return f"'error.{key}' is not a string"
    for key in ("param", "code"):
        if key not in err:
            return f"'error.{key}' is missing"
    if err["param"] is not None and not isinstance(err["param"], str):
        return "'error.param' is neither a string nor null"
    code = err["code"]
    if code is not None and (isinstance(code, bool) or not isinstance(code, str | int)):
        return "'error.code' is neither a string, an integer nor null"
    return None


# Streams of named events (the Responses API, Anthropic's messages) end with one of these
# events instead of ``data: [DONE]``.
_LAST_EVENTS = (
    "response.completed",
    "response.incomplete",
    "response.failed",
    "message_stop",
    "error",
)


def sse_problem(body: bytes, named: bool = False) -> tuple[str | None, bool]:
    """(why ``body`` is not a well-formed SSE answer ending in ``data: [DONE]`` (``named``:
    in a last named event such as ``response.completed``), or None; whether it carried an
    error event)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "stream is not UTF-8", False
    text = text.replace("\r\n", "\n")
    if not text.strip():
        return "empty stream", False
    if not text.endswith("\n\n"):
        return "stream cut: the last event is not terminated", False
    payloads = []
    kinds = []
    for event in (e for e in text.split("\n\n") if e.strip()):
        data = []
        for line in event.split("\n"):
            if line.startswith("event:"):
                kinds.append(line[6:].strip())
            if line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            elif not line.startswith((":", "event:", "id:", "retry:")):
                return f"not an SSE line: {clip(line, 60)!r}", False
        if not data:
            if all(line.startswith(":") for line in event.split("\n")):
                continue  # a comment (keep-alive) only
            return "an event without data", False
        payloads.append("\n".join(data))
    if named:
        if not kinds or kinds[-1] not in _LAST_EVENTS:
            return f"stream does not end with one of {', '.join(_LAST_EVENTS)}", False
        payloads.append("[DONE]")  # judged alike from here
    if payloads[-1] != "[DONE]":
        return "stream does not end with data: [DONE]", False
    saw_error = False
    for p in payloads[:-1]:
        if p == "[DONE]":
            return "data: [DONE] before the end", False
        try:
            obj = json.loads(p)
        except ValueError:
            return f"event is not JSON: {clip(p, 60)!r}", False
        if not isinstance(obj, dict):
            return "event is not a JSON object", False
        if named and obj.get("type") in ("error", "response.failed"):
            saw_error = True
        elif "error" in obj and not named:
            saw_error = True
            bad = error_shape_problem(p.encode())
            if bad:
                return f"error event not in OpenAI error shape: {bad}", True
    return None, saw_error


@dataclass(frozen=True)
class Verdict:
    """How one answer is judged: who made it, the failure (None: fine), a remark."""

    origin: Origin
    problem: str | None = None
    note: str | None = None


def classify(
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    stream_requested: bool,
    named: bool = False,
    anthropic: bool = False,
) -> Verdict:
    """Judge one answer. ``headers`` keys are lower-case; ``named``: a stream of named
    events (see :func:`sse_problem`); ``anthropic``: errors in Anthropic's shape."""
    origin: Origin = "worker" if WORKER_HEADER in headers else "gateway"
    if status >= 500:
        if origin == "worker":
            return Verdict(origin, note="worker 5xx")
        return Verdict(origin, f"gateway {status}")
    if 400 <= status < 500:
        bad = error_shape_problem(body, anthropic)
        return Verdict(origin, f"{status} not in the error shape: {bad}" if bad else None)
    if status == 200:
        ctype = headers.get("content-type", "")
        if ctype.startswith("text/event-stream"):
            bad, saw_error = sse_problem(body, named)
            return Verdict(origin, bad, "error event in stream" if saw_error else None)
        if stream_requested:
            return Verdict(origin, f"stream asked for, got a 200 of {ctype or 'no type'}")
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):
            return Verdict(origin, "200 answer is not JSON")
        if not isinstance(obj, dict):
            return Verdict(origin, "200 answer is not a JSON object")
        return Verdict(origin)
    return Verdict(origin, note=f"status {status}")


def no_answer(reason: str) -> Verdict:
    return Verdict("none", f"no answer: {reason}")


@dataclass(frozen=True)
class Answer:
    """What one request got back (``status`` None: no answer, ``error`` says why)."""

    status: int | None
    headers: dict[str, str]  # lower-case names
    body: bytes
    elapsed_s: float
    error: str | None = None


def judge(case: Case, answer: Answer) -> Verdict:
    if answer.status is None:
        return no_answer(answer.error or "?")
    named = case.endpoint in NAMED_EVENTS
    anthropic = case.endpoint in ANTHROPIC_ERRORS
    return classify(answer.status, answer.headers, answer.body, case.stream, named, anthropic)
