"""Embeddings batches on plain values: which requests may merge (their ``input`` checked and
its items listed), and the merged answer split back into one body per caller, with each
caller's share of the prompt tokens. The coalescer (``gateway/coalesce.py``) uses these.

**Usage.** vLLM reports only the call's total prompt tokens (the sum over its items). Each
caller gets an exact share where it can be known: a token-id item counts its length (vLLM
adds no special tokens to token inputs). The rest of the total is shared among the text
items in proportion to their characters, by largest remainders, so the callers' numbers add
up exactly to the worker's total. A caller alone in its call (or the only one with text
items) gets the worker's exact count.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from json.decoder import scanstring  # type: ignore[attr-defined]  # the C string scanner
from typing import Any

from hearthgate.gateway.errors import BadRequest
from hearthgate.gateway.parse import ParsedRequest

Item = str | list[int]
# Encodings whose items are JSON values that can be split per item.
_SPLITTABLE = (None, "float", "base64")


# ------------------------------------------------------------------ validation


def _is_token_ids(v: object) -> bool:
    return isinstance(v, list) and all(type(t) is int for t in v)


def _has_object(v: object) -> bool:
    return isinstance(v, dict) or (isinstance(v, list) and any(_has_object(x) for x in v))


def input_items(value: object) -> list[Item] | None:
    """The items of an embeddings ``input``: one per embedding vLLM will return.

    ``None`` for chat-style inputs (message objects), which are forwarded alone as they
    are. Raises BadRequest for an input that is no valid text or token batch: an empty
    array or token array, a mix of kinds, or a value of the wrong type.
    """
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise BadRequest("'input' must be a string, an array of strings or of token ids")
    if _has_object(value):
        return None
    if not value:
        raise BadRequest("'input' must not be an empty array")
    if all(isinstance(v, str) for v in value):
        return list(value)
    if _is_token_ids(value):
        if any(t < 0 for t in value):
            raise BadRequest("'input' token ids must be non-negative integers")
        return [list(value)]
    if all(isinstance(v, list) for v in value):
        for i, v in enumerate(value):
            if not v:
                raise BadRequest(f"'input[{i}]' must not be an empty token array")
            if not _is_token_ids(v) or any(t < 0 for t in v):
                raise BadRequest(f"'input[{i}]' must be an array of non-negative token ids")
        return [list(v) for v in value]
    raise BadRequest(
        "'input' must be a string, an array of strings, an array of token ids or an array "
        "of token-id arrays (not a mix)"
    )


@dataclass(frozen=True, slots=True)
class Plan:
    """An embeddings request the coalescer takes: its items and what must match to merge."""

    parsed: ParsedRequest
    items: list[Item]
    params: str  # every body key but ``input``, and the input's kind, as canonical JSON


def mergeable(parsed: ParsedRequest) -> Plan | None:
    """A Plan for a mergeable embeddings request, None for anything forwarded alone.
    Raises BadRequest for a malformed ``input`` (before the request is queued)."""
    if parsed.endpoint != "embeddings":
        return None
    items = input_items(parsed.body.get("input"))
    if items is None or parsed.body.get("encoding_format") not in _SPLITTABLE:
        return None
    rest = {k: v for k, v in parsed.body.items() if k != "input"}
    # vLLM takes texts or token arrays in one call, not a mix of both.
    rest["input"] = "tokens" if isinstance(items[0], list) else "text"
    return Plan(parsed, items, json.dumps(rest, sort_keys=True, separators=(",", ":")))


# ------------------------------------------------------------------ splitting


def apportion(total: int, parts: Sequence[Sequence[Item]]) -> list[int]:
    """Split ``total`` prompt tokens between callers: token-id items count their length,
    the rest goes to text items in proportion to their characters (each counts one more,
    so empty ones share too), rounded by largest remainders (ties: earlier caller).
    The result always sums to ``total`` (when it is >= 0)."""
    exact = [sum(len(i) for i in items if isinstance(i, list)) for items in parts]
    weights = [sum(len(i) + 1 for i in items if isinstance(i, str)) for items in parts]
    rest = total - sum(exact)
    if rest < 0 or (rest > 0 and not any(weights)):
        # The worker counted differently: share everything by the known sizes instead.
        weights = [e + w for e, w in zip(exact, weights, strict=True)]
        exact = [0] * len(parts)
        rest = total
    if not any(weights):
        return exact
    wsum = sum(weights)
    shares = [Fraction(rest * w, wsum) for w in weights]
    out = [int(s) for s in shares]
    left = rest - sum(out)
    order = sorted(range(len(parts)), key=lambda k: (-(shares[k] - out[k]), k))
    for k in order[:left]:
        out[k] += 1
    return [e + o for e, o in zip(exact, out, strict=True)]


@dataclass(frozen=True, slots=True)
class Share:
    """One caller's part of a merged answer: its response body and its prompt tokens."""

    body: bytes
    prompt_tokens: int


def split_answer(
    content: bytes, parts: Sequence[Sequence[Item]], model: str | None = None
) -> list[Share]:
    """One response body per caller from a merged call's answer (with ``model`` as the
    answer's model name when given). Raises ValueError when the answer is malformed or does
    not hold one embedding per item.

    Each vector is copied as the worker wrote it, never parsed into floats and printed
    again: that round trip was most of the gateway's CPU per embeddings request (a
    384-float vector is ~8 KB of JSON)."""
    answer, entries = _scan_answer(content.decode())
    if len(entries) != sum(len(p) for p in parts):
        raise ValueError("the answer does not hold one embedding per input")
    entries.sort(key=lambda e: int(e[0]["index"]))
    if model is not None and "model" in answer:
        answer["model"] = model  # the name the client asked for, if the worker's differs
    usage = answer.get("usage") or {}
    if not isinstance(usage, dict):
        raise ValueError("the answer's usage is not an object")
    total = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    out: list[Share] = []
    start = 0
    for items, n in zip(parts, apportion(total, parts), strict=True):
        mine = entries[start : start + len(items)]
        start += len(items)
        data = ",".join(
            _with_raw({**fields, "index": k}, "embedding", raw)
            for k, (fields, raw) in enumerate(mine)
        )
        own = {**answer, "usage": {**usage, "prompt_tokens": n, "total_tokens": n + completion}}
        out.append(Share(_with_raw(own, "data", f"[{data}]").encode(), n))
    return out


def _with_raw(fields: dict[str, Any], key: str, raw: str | None) -> str:
    """``fields`` as compact JSON, with ``key`` last holding the JSON text ``raw`` as is."""
    text = json.dumps(fields, separators=(",", ":"))
    if raw is None:
        return text
    return f"{text[:-1]}{',' if len(text) > 2 else ''}{json.dumps(key)}:{raw}}}"


# ------------------------------------------------------------------ reading an answer

_DECODE = json.JSONDecoder()
# What a flat array of JSON numbers holds besides its brackets: a vector found by its closing
# bracket and checked with this one class, not parsed number by number (a full grammar check
# cost as much as parsing). vLLM writes plain floats; anything else goes through the parser.
_NOT_NUMBERS = re.compile(r"[^-+.0-9eE, \t\n\r]")


def _skip(text: str, at: int) -> int:
    """The first index at or after ``at`` that is not JSON whitespace."""
    while at < len(text) and text[at] in " \t\n\r":
        at += 1
    return at


Entry = tuple[dict[str, Any], str | None]
"""A ``data`` entry: its fields but ``embedding``, and the embedding's JSON text."""


def _scan_answer(text: str) -> tuple[dict[str, Any], list[Entry]]:
    """An embeddings answer's top-level fields (without ``data``) and its ``data`` entries,
    each vector kept as JSON text. Raises ValueError for anything but an object whose
    ``data`` is an array of objects."""
    entries: list[Entry] | None = None

    def value(key: str, at: int) -> tuple[Any, int]:
        nonlocal entries
        if key == "data" and text[at] == "[":
            entries, at = _scan_array(text, at)
            return None, at
        return _DECODE.raw_decode(text, at)

    try:
        top, end = _scan_object(text, _skip(text, 0), value)
        if text[_skip(text, end) :]:
            raise ValueError("extra data after the answer")
    except (IndexError, StopIteration) as exc:
        raise ValueError("the answer is not complete JSON") from exc
    if entries is None:
        raise ValueError("the answer has no data array")
    top.pop("data", None)
    return top, entries


def _scan_array(text: str, at: int) -> tuple[list[Entry], int]:
    entries: list[Entry] = []
    at = _skip(text, at + 1)
    if text[at] == "]":
        return entries, at + 1
    while True:
        entry, at = _scan_entry(text, at)
        entries.append(entry)
        done, at = _next_item(text, at, "]")
        if done:
            return entries, at


def _scan_entry(text: str, at: int) -> tuple[Entry, int]:
    raw: str | None = None

    def field(key: str, i: int) -> tuple[Any, int]:
        nonlocal raw
        if key != "embedding":
            return _DECODE.raw_decode(text, i)
        close = text.find("]", i) + 1 if text[i] == "[" else 0
        if not close or _NOT_NUMBERS.search(text, i + 1, close - 1):
            close = _DECODE.raw_decode(text, i)[1]
        raw = text[i:close]
        return None, close

    fields, at = _scan_object(text, at, field)
    fields.pop("embedding", None)
    return (fields, raw), at


def _scan_object(
    text: str, at: int, value: Callable[[str, int], tuple[Any, int]]
) -> tuple[dict[str, Any], int]:
    """The object starting at ``at`` (each value read by ``value(key, index)``) and the
    index after it."""
    if text[at] != "{":
        raise ValueError(f"expected an object at {at}")
    out: dict[str, Any] = {}
    at = _skip(text, at + 1)
    if text[at] == "}":
        return out, at + 1
    while True:
        if text[at] != '"':
            raise ValueError(f"expected a key at {at}")
        key, at = scanstring(text, at + 1)
        at = _skip(text, at)
        if text[at] != ":":
            raise ValueError(f"expected ':' at {at}")
        out[key], at = value(key, _skip(text, at + 1))
        done, at = _next_item(text, at, "}")
        if done:
            return out, at


def _next_item(text: str, at: int, close: str) -> tuple[bool, int]:
    """After an array's or object's item: (True, the index after ``close``) at its end, else
    (False, the index of the next item)."""
    at = _skip(text, at)
    if text[at] == close:
        return True, at + 1
    if text[at] != ",":
        raise ValueError(f"expected ',' or '{close}' at {at}")
    return False, _skip(text, at + 1)
