"""Counting a request's prompt tokens before it is admitted.

One interface, :class:`TokenCounter`, two implementations: :class:`HeuristicCounter`
(characters / ``tokens.chars_per_token``, rounded up; exact for token ids) and
:class:`WorkerTokenizer` (vLLM's own ``/tokenize`` for long prompts, the heuristic for the
rest or when the worker does not answer). Every field that carries prompt text counts:
message contents and names, tool calls, ``tools``, ``functions`` and ``documents`` (chat
templates render them into the prompt), ``prompt`` and ``suffix``, every embeddings input.
The worker's usage numbers correct the estimate when the request ends.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any, Protocol

from hearthgate.gateway.parse import ParsedRequest
from hearthgate.gateway.settings import Tokens
from hearthgate.gateway.upstream import UpstreamClient
from hearthgate.gateway.workers import WorkerPool

log = logging.getLogger("hearthgate.tokens")

# Message keys that are markup, not text (the template adds a few tokens for them).
_MARKUP = frozenset({"role", "type"})


def _json_len(value: Any) -> int:
    try:
        return len(json.dumps(value, separators=(",", ":")))
    except (TypeError, ValueError, RecursionError):
        return 0


def text_len(value: Any) -> tuple[int, int]:
    """(characters of text, count of explicit token ids) in a prompt-like value."""
    if isinstance(value, str):
        return len(value), 0
    if isinstance(value, list):
        if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return 0, len(value)
        chars = ids = 0
        for v in value:
            c, i = text_len(v)
            chars, ids = chars + c, ids + i
        return chars, ids
    if isinstance(value, dict):
        # chat messages ({"role", "content", "name", "tool_calls"...}) and content parts
        # ({"type": "text", "text": ...}); other values count by their JSON length
        chars = ids = 0
        for key, v in value.items():
            if key in _MARKUP:
                continue
            if key in ("content", "text") or isinstance(v, str | list):
                c, i = text_len(v)
            elif isinstance(v, dict):
                c, i = _json_len(v), 0
            else:
                continue
            chars, ids = chars + c, ids + i
        return chars, ids
    return 0, 0


def prompt_chars(parsed: ParsedRequest) -> tuple[int, int]:
    """(characters, token ids) over every field of the request that carries prompt text."""
    if not parsed.spec.text_fields:
        return 0, 0
    main, *extra = parsed.spec.text_fields
    chars, ids = text_len(parsed.body.get(main))
    for key in extra:
        value = parsed.body.get(key)
        if value is None:
            continue
        chars += len(value) if isinstance(value, str) else _json_len(value)
    return chars, ids


def embedding_items(parsed: ParsedRequest) -> int:
    """How many inputs an embeddings request holds (each is one sequence on the worker)."""
    value = parsed.body.get("input")
    if isinstance(value, list) and value and not all(type(v) is int for v in value):
        return len(value)
    return 1


class TokenCounter(Protocol):
    async def count(self, parsed: ParsedRequest) -> int:
        """The prompt-token estimate of ``parsed``."""
        ...


class HeuristicCounter:
    """Characters / ``chars_per_token``, rounded up, plus explicit token ids. Each
    embeddings input counts at least one token (its special tokens), so a list of empty
    strings is not free."""

    def __init__(self, tokens: Tokens) -> None:
        self._per_token = tokens.chars_per_token

    def estimate(self, parsed: ParsedRequest) -> int:
        if parsed.spec.cost is not None:
            return parsed.spec.cost(parsed)[0]
        chars, ids = prompt_chars(parsed)
        n = ids + math.ceil(chars / self._per_token)
        if parsed.endpoint == "embeddings":
            n += embedding_items(parsed)
        return n

    async def count(self, parsed: ParsedRequest) -> int:
        return self.estimate(parsed)


class WorkerTokenizer:
    """The worker's own count from vLLM's ``/tokenize`` for prompts of at least
    ``tokens.tokenizer_min_chars`` characters (a few ms, paid only where a prefill costs far
    more); the heuristic for shorter ones, embeddings, and whenever the worker fails."""

    def __init__(self, tokens: Tokens, pool: WorkerPool, client: UpstreamClient) -> None:
        self._heuristic = HeuristicCounter(tokens)
        self._min_chars = tokens.tokenizer_min_chars
        self._pool = pool
        self._client = client

    async def count(self, parsed: ParsedRequest) -> int:
        estimate = self._heuristic.estimate(parsed)
        key = parsed.spec.tokenize_key
        if key is None:
            return estimate
        chars, _ = prompt_chars(parsed)
        if chars < self._min_chars:
            return estimate
        worker = self._pool.pick(parsed.model)
        if worker is None:
            return estimate
        body: dict[str, Any] = {"model": worker.spec.upstream_model(parsed.model)}
        body[key] = parsed.body[key]
        for extra in ("tools", "documents"):
            if parsed.body.get(extra) is not None and key == "messages":
                body[extra] = parsed.body[extra]
        try:
            resp = await self._client.post(
                worker.name, worker.spec.url + "/tokenize", json.dumps(body).encode(), 2.0
            )
            try:
                if resp.status != 200:
                    return estimate
                return int(json.loads(await resp.read())["count"])
            finally:
                resp.close()
        except Exception as exc:  # any failure (WorkerUnreachable...): the estimate stands
            log.debug("tokenize on %s failed: %r", worker.name, exc)
            return estimate


def token_counter(tokens: Tokens, pool: WorkerPool, client: UpstreamClient) -> TokenCounter:
    """The counter the settings ask for."""
    if tokens.use_worker_tokenizer:
        return WorkerTokenizer(tokens, pool, client)
    return HeuristicCounter(tokens)
