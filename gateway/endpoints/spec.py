"""What one kind of endpoint is, as the gateway needs to know it: one frozen value per kind.

Each kind lives in its own module of this package and is listed once in
``gateway/endpoints/__init__.py``; nothing else in the gateway lists endpoints. A spec says
how the body is checked (required fields and their types), what the budgets charge for it
(the fields whose text is prompt, the field that bounds the output), the name classification
rules match, how a streamed answer is read (its :class:`EventReader`; none: it never
streams), where usage is read from, which workers it prefers (pooling work goes to an
``embeddings`` worker when one is up) and whether the Batch API accepts it.

A client that leaves is handled alike for every kind: the lease closes the upstream
connection and vLLM aborts the request (gateway/lease.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from hearthgate.gateway.errors import ErrorShape, GatewayError, sse_error_event


@dataclass(frozen=True, slots=True)
class Seen:
    """What one streamed event told the gateway."""

    token: bool = False  # it carries output (a token, a tool call, reasoning)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None  # the total so far, where the event says
    error: dict[str, Any] | None = None  # the stream reported an error
    usage_only: bool = False  # OpenAI's usage chunk (no choices): the gateway asked for it
    ident: str | None = None  # the answer's id (a stored response's, for follow-ups)


NOTHING = Seen()


class EventReader(Protocol):
    """Reads the data of one server-sent event of a kind of stream."""

    def fast(self, data: bytes) -> bool | None:
        """From the bytes alone: True for a token event, False for an event that carries
        nothing the gateway reads, None when only a JSON parse can tell."""
        ...

    def read(self, event: dict[str, Any]) -> Seen:
        """What the decoded event says."""
        ...


def count(value: Any) -> int | None:
    """A token count as the worker sent it: a non-negative int, else None."""
    return value if type(value) is int and value >= 0 else None


@dataclass(frozen=True, slots=True)
class FieldType:
    """A body field the gateway checks the type of (when present and not null)."""

    key: str
    types: tuple[type, ...]
    what: str  # "an array of messages": for the error message


def openai_stream_error(error: GatewayError) -> bytes:
    """How an OpenAI chunk stream ends when it breaks off: an error event, then ``[DONE]``."""
    return sse_error_event(error) + b"data: [DONE]\n\n"


def named_event(kind: str, data: dict[str, Any]) -> bytes:
    """One named server-sent event (``event:`` then ``data:``)."""
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


class Costed(Protocol):
    """What a cost function reads of a parsed request (``gateway.parse.ParsedRequest``)."""

    @property
    def body(self) -> dict[str, Any]: ...

    @property
    def max_tokens(self) -> int | None: ...

    @property
    def audio_s(self) -> float | None: ...


# What a request costs the budgets when its text does not say: (prompt tokens, most output
# tokens), from the parsed request (speech-to-text: the seconds of audio).
Cost = Callable[[Costed], tuple[int, int]]

# A check of the whole body beyond field types: raises BadRequest. Arguments: the body and
# the most inputs one request may hold (limits.max_embedding_inputs).
BodyCheck = Callable[[dict[str, Any], int], None]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One kind of endpoint. ``name`` is what classification rules match (``endpoint:``)
    and what metrics and the scheduler see; ``paths`` are the client's paths, each served
    by the worker under the same path."""

    name: str
    paths: tuple[str, ...]
    # Each group: at least one of its fields must be present (the request's input).
    required: tuple[tuple[str, ...], ...]
    types: tuple[FieldType, ...] = ()
    # Fields whose text the worker reads as prompt (the first is the main input).
    text_fields: tuple[str, ...] = ()
    # Fields that bound the output per sequence, the first present wins; () never generates.
    max_tokens_keys: tuple[str, ...] = ()
    # How a streamed answer is read; None: ``stream`` is refused.
    reader: Callable[[], EventReader] | None = None
    # The last bytes of a stream that broke off (the worker failed, the gateway shut down).
    stream_error: Callable[[GatewayError], bytes] = openai_stream_error
    # The body of the gateway's own errors (None: OpenAI's).
    error_shape: ErrorShape | None = None
    # Where a whole answer's ``usage`` keeps its counts (prompt, output).
    usage_keys: tuple[str, str | None] = ("prompt_tokens", "completion_tokens")
    # Streamed answers carry usage only when asked (OpenAI's ``stream_options``).
    ask_usage: bool = False
    # Pooling work (embeddings, rerank, score): routed to an ``embeddings`` worker first.
    pooling: bool = False
    # The Batch API accepts it as a batch's endpoint.
    batch: bool = False
    # vLLM's /tokenize takes this field for an exact count (None: the estimate stands).
    tokenize_key: str | None = None
    # The worker stores answers by id (the Responses API): follow-ups go back to it.
    stores_answers: bool = False
    check: BodyCheck | None = None
    # The body is a multipart form with a file (speech-to-text), bounded by
    # limits.max_upload_bytes and parsed in a thread.
    form: bool = False
    # The answer is audio, relayed as it arrives (its first byte is the first "token").
    audio_out: bool = False
    cost: Cost | None = None

    @property
    def path(self) -> str:
        """The main path (for messages and the Batch API)."""
        return self.paths[0]

    @property
    def generates(self) -> bool:
        return bool(self.max_tokens_keys)
