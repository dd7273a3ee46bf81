"""``POST /v1/responses``: OpenAI's Responses API (Home Assistant's conversation agent).

Streamed as named events (``event: response.output_text.delta`` then its ``data:``); usage
arrives in the final ``response.completed`` (``input_tokens``, ``output_tokens``). The worker
stores a response by its id: ``GET /v1/responses/{id}``, its cancel and a follow-up naming it
in ``previous_response_id`` go back to the worker that answered (gateway/stored.py).
"""

from __future__ import annotations

from typing import Any

from hearthgate.gateway.endpoints.spec import (
    NOTHING,
    Endpoint,
    FieldType,
    Seen,
    count,
    named_event,
)
from hearthgate.gateway.errors import GatewayError

_TOKENS = (
    b'"type":"response.output_text.delta"',
    b'"type":"response.reasoning_text.delta"',
    b'"type":"response.function_call_arguments.delta"',
    b'"type":"response.refusal.delta"',
)
_READ = (
    b'"type":"response.created"',
    b'"type":"response.completed"',
    b'"type":"response.incomplete"',
    b'"type":"response.failed"',
    b'"type":"error"',
)
_TOKEN_TYPES = frozenset(t.split(b":")[1].strip(b'"').decode() for t in _TOKENS)
_FINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


class ResponseEvents:
    """Reads the Responses API's streamed events."""

    def fast(self, data: bytes) -> bool | None:
        if any(m in data for m in _TOKENS):
            return True
        if any(m in data for m in _READ) or b'"type": "' in data:
            return None  # what the gateway reads, or spacing the byte checks do not know
        return False

    def read(self, event: dict[str, Any]) -> Seen:
        kind = event.get("type")
        if kind in _TOKEN_TYPES:
            return Seen(token=True)
        if kind == "error":
            return Seen(error=event)
        response = event.get("response")
        if not isinstance(response, dict):
            return NOTHING
        ident = response.get("id") if isinstance(response.get("id"), str) else None
        if kind == "response.created":
            return Seen(ident=ident)
        if kind in _FINAL:
            usage = response.get("usage")
            if not isinstance(usage, dict):
                usage = {}
            error = response.get("error") if kind == "response.failed" else None
            return Seen(
                prompt_tokens=count(usage.get("input_tokens")),
                completion_tokens=count(usage.get("output_tokens")),
                error=error if isinstance(error, dict) else None,
                ident=ident,
            )
        return NOTHING


def stream_error(error: GatewayError) -> bytes:
    """The Responses API's ``error`` event (it has no ``[DONE]``)."""
    data = {"type": "error", "code": error.code, "message": error.message, "param": None}
    return named_event("error", data)


RESPONSES = Endpoint(
    name="responses",
    paths=("/v1/responses",),
    required=(("input",),),
    types=(
        FieldType("input", (str, list), "a string or an array of input items"),
        FieldType("previous_response_id", (str,), "a string"),
    ),
    text_fields=("input", "instructions", "tools"),
    max_tokens_keys=("max_output_tokens",),
    reader=ResponseEvents,
    stream_error=stream_error,
    usage_keys=("input_tokens", "output_tokens"),
    batch=True,
    stores_answers=True,
)
