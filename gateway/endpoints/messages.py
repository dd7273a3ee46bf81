"""``POST /v1/messages``: Anthropic's Messages API (coding tools pointed at a local model).

Streamed as named events: ``message_start`` carries the prompt's ``input_tokens``, each
``content_block_delta`` a piece of output, ``message_delta`` the ``output_tokens`` so far.
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

_TOKEN = b'"type":"content_block_delta"'
_READ = (b'"type":"message_start"', b'"type":"message_delta"', b'"type":"error"')


class MessageEvents:
    """Reads Anthropic's streamed message events."""

    def fast(self, data: bytes) -> bool | None:
        if _TOKEN in data:
            return True
        if any(m in data for m in _READ) or b'"type": "' in data:
            return None
        return False

    def read(self, event: dict[str, Any]) -> Seen:
        kind = event.get("type")
        if kind == "content_block_delta":
            return Seen(token=True)
        if kind == "error":
            error = event.get("error")
            return Seen(error=error if isinstance(error, dict) else event)
        if kind == "message_start":
            message = event.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            if isinstance(usage, dict):
                ident = message.get("id") if isinstance(message, dict) else None
                return Seen(
                    prompt_tokens=count(usage.get("input_tokens")),
                    ident=ident if isinstance(ident, str) else None,
                )
        if kind == "message_delta":
            usage = event.get("usage")
            if isinstance(usage, dict):
                return Seen(completion_tokens=count(usage.get("output_tokens")))
        return NOTHING


# Anthropic's error types by status (its clients raise a typed exception from them).
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_shape(error: GatewayError) -> dict[str, object]:
    """Anthropic's error body (vLLM's /v1/messages answers its own errors so too)."""
    kind = _ERROR_TYPES.get(error.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def stream_error(error: GatewayError) -> bytes:
    """Anthropic's ``error`` event."""
    return named_event("error", error_shape(error))


MESSAGES = Endpoint(
    name="messages",
    paths=("/v1/messages",),
    required=(("messages",),),
    types=(
        FieldType("messages", (list,), "an array of messages"),
        FieldType("system", (str, list), "a string or an array of text blocks"),
    ),
    text_fields=("messages", "system", "tools"),
    max_tokens_keys=("max_tokens",),
    reader=MessageEvents,
    stream_error=stream_error,
    error_shape=error_shape,
    usage_keys=("input_tokens", "output_tokens"),
)
