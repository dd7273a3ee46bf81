"""One error hierarchy for the gateway, mapped to OpenAI-style JSON in one place.

Every error a client can see is a :class:`GatewayError`; :func:`error_response` turns it into
``{"error": {"message", "type", "code"}}`` with the right status and headers. Anything else
that escapes a handler becomes a 500 with a generic message (never a traceback).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from typing import ClassVar

from starlette.responses import Response


class Outcome(enum.StrEnum):
    """Small, bounded set of request outcomes used as a metrics label."""

    OK = "ok"
    CLIENT_ERROR = "client_error"
    UPSTREAM_ERROR = "upstream_error"
    UNAVAILABLE = "unavailable"
    REJECTED = "rejected"
    DISCONNECTED = "disconnected"
    INTERNAL = "internal"


class ClientGone(Exception):
    """The client closed its connection: not an error to answer, a signal to stop work."""


class GatewayError(Exception):
    """Base of every error the gateway reports to a client."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "internal_error"
    code: str = "internal_error"
    outcome: ClassVar[Outcome] = Outcome.INTERNAL

    def __init__(
        self,
        message: str,
        *,
        retry_after_s: int | None = None,
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, int(self.retry_after_s)))}


class BadRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"
    outcome = Outcome.CLIENT_ERROR


class Unauthorized(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"
    outcome = Outcome.CLIENT_ERROR


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"
    outcome = Outcome.CLIENT_ERROR


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"
    outcome = Outcome.CLIENT_ERROR


class ModelNotFound(NotFound):
    code = "model_not_found"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"
    outcome = Outcome.CLIENT_ERROR


class RateLimited(GatewayError):
    status = 429
    type = "rate_limit_error"
    code = "queue_full"
    outcome = Outcome.REJECTED


class NoWorkerAvailable(GatewayError):
    status = 503
    type = "service_unavailable"
    code = "no_worker_available"
    outcome = Outcome.UNAVAILABLE


def class_gone(cls: str, retry_after_s: int) -> NoWorkerAvailable:
    """A request classified into a class that a settings reload removed before it queued."""
    return NoWorkerAvailable(
        f"class {cls} was removed by a settings reload while this request arrived; retry",
        retry_after_s=retry_after_s,
        code="class_removed",
    )


class UpstreamFailed(GatewayError):
    """The worker broke the connection or timed out after it had accepted the request."""

    status = 502
    type = "upstream_error"
    code = "upstream_failed"
    outcome = Outcome.UPSTREAM_ERROR


class InternalError(GatewayError):
    pass


ErrorShape = Callable[[GatewayError], dict[str, object]]


def error_response(exc: GatewayError, shape: ErrorShape | None = None) -> Response:
    """``exc`` as an answer: OpenAI's error body, or ``shape``'s (an endpoint whose clients
    expect another, such as Anthropic's)."""
    return Response(
        content=json.dumps(exc.body() if shape is None else shape(exc)),
        status_code=exc.status,
        headers=exc.headers(),
        media_type="application/json",
    )


def sse_error_event(exc: GatewayError) -> bytes:
    """The error as one server-sent event, for failures after streaming has begun."""
    return b"data: " + json.dumps(exc.body()).encode() + b"\n\n"
