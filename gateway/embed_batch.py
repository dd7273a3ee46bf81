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
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
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


def split_answer(
    content: bytes, parts: Sequence[Sequence[Item]], model: str | None = None
) -> list[dict[str, Any]]:
    """One response body per caller from a merged call's answer (with ``model`` as the
    answer's model name when given). Raises ValueError when the answer does not hold one
    embedding per item."""
    answer = json.loads(content)
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list) or len(data) != sum(len(p) for p in parts):
        raise ValueError("the answer does not hold one embedding per input")
    data = sorted(data, key=lambda d: int(d["index"]))
    if model is not None and "model" in answer:
        answer["model"] = model  # the name the client asked for, if the worker's differs
    usage = answer.get("usage") or {}
    total = int(usage.get("prompt_tokens") or 0)
    tokens = apportion(total, parts)
    out: list[dict[str, Any]] = []
    start = 0
    for items, n in zip(parts, tokens, strict=True):
        mine = [{**d, "index": k} for k, d in enumerate(data[start : start + len(items)])]
        start += len(items)
        completion = int(usage.get("completion_tokens") or 0)
        own_usage = {**usage, "prompt_tokens": n, "total_tokens": n + completion}
        out.append({**answer, "data": mine, "usage": own_usage})
    return out
