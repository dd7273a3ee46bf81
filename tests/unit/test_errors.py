"""Error mapping: every gateway error becomes OpenAI-style JSON with the right status."""

from __future__ import annotations

import json

import pytest

from hearthgate.gateway.errors import (
    BadRequest,
    GatewayError,
    ModelNotFound,
    NoWorkerAvailable,
    PayloadTooLarge,
    RateLimited,
    Unauthorized,
    UpstreamFailed,
    error_response,
    sse_error_event,
)


@pytest.mark.parametrize(
    ("exc", "status", "etype"),
    [
        (BadRequest("x"), 400, "invalid_request_error"),
        (Unauthorized("x"), 401, "authentication_error"),
        (ModelNotFound("x"), 404, "invalid_request_error"),
        (PayloadTooLarge("x"), 413, "invalid_request_error"),
        (RateLimited("x", retry_after_s=3), 429, "rate_limit_error"),
        (NoWorkerAvailable("x", retry_after_s=2), 503, "service_unavailable"),
        (UpstreamFailed("x"), 502, "upstream_error"),
    ],
)
def test_status_and_body(exc: GatewayError, status: int, etype: str) -> None:
    resp = error_response(exc)
    assert resp.status_code == status
    body = json.loads(bytes(resp.body))
    assert set(body["error"]) >= {"message", "type", "code"}
    assert body["error"]["type"] == etype
    assert body["error"]["message"] == "x"


def test_retry_after_header_is_whole_seconds_at_least_one() -> None:
    assert error_response(NoWorkerAvailable("x", retry_after_s=0)).headers["retry-after"] == "1"
    assert error_response(RateLimited("x", retry_after_s=7)).headers["retry-after"] == "7"
    assert "retry-after" not in error_response(BadRequest("x")).headers


def test_sse_error_event_is_one_event() -> None:
    ev = sse_error_event(UpstreamFailed("broke"))
    assert ev.startswith(b"data: ") and ev.endswith(b"\n\n") and ev.count(b"\n\n") == 1
    assert json.loads(ev[6:])["error"]["code"] == "upstream_failed"
