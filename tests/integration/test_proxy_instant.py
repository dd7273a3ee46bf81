"""The gateway as a real process in front of a small instant upstream, on loopback.

These cover relay mechanics and failure paths cheaply; the same behaviour against real vLLM
is in tests/e2e.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.inprocess import until_sync
from tests.support import free_port, gateway, instant_upstream, sse_events


def settings(*urls: str, **extra: object) -> dict[str, object]:
    workers = [{"name": f"w{i}", "url": u, "models": ["m"]} for i, u in enumerate(urls)]
    return {"workers": workers, "health": {"interval_s": 0.2}, **extra}


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with instant_upstream() as url:
        yield url


@pytest.fixture(scope="module")
def gw(upstream: str) -> Iterator[str]:
    with gateway(settings(upstream, limits={"max_body_bytes": 2048})) as url:
        yield url


def test_stream_relays_every_event_and_hides_usage(gw: str) -> None:
    body = {"model": "m", "prompt": "x", "max_tokens": 4, "stream": True}
    r = httpx.post(gw + "/v1/completions", json=body)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["text"] for c in chunks] == ["t0 ", "t1 ", "t2 ", "t3 "]


def test_stream_keeps_usage_when_asked(gw: str) -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = sse_events(httpx.post(gw + "/v1/chat/completions", json=body).text)
    last = json.loads(events[-2])
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 3


def test_non_stream_passes_through(gw: str, upstream: str) -> None:
    body = {"model": "m", "prompt": "x", "max_tokens": 2}
    via = httpx.post(gw + "/v1/completions", json=body)
    direct = httpx.post(upstream + "/v1/completions", json=body)
    assert via.status_code == 200 and via.json() == direct.json()
    assert via.headers["x-hearthgate-worker"] == "w0"


def test_body_over_limit_is_413(gw: str) -> None:
    big = {"model": "m", "prompt": "x" * 5000}
    r = httpx.post(gw + "/v1/completions", json=big)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while reading
        yield b'{"model": "m", "prompt": "'
        for _ in range(10):
            yield b"x" * 500
        yield b'"}'

    r = httpx.post(gw + "/v1/completions", content=chunks())
    assert r.status_code == 413


def test_wrong_method_and_route(gw: str) -> None:
    r = httpx.get(gw + "/v1/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    assert httpx.post(gw + "/v2/x", json={}).status_code == 404


def test_metrics_count_requests_and_tokens(gw: str) -> None:
    body = {"model": "m", "prompt": "x", "max_tokens": 5}
    httpx.post(gw + "/v1/completions", json=body)
    httpx.post(gw + "/v1/completions", json={**body, "stream": True})  # a first token: TTFT
    text = httpx.get(gw + "/metrics").text
    assert 'hearthgate_requests_total{model="m",route="/v1/completions",status="200"}' in text
    assert "hearthgate_completion_tokens_total" in text
    assert "hearthgate_ttft_seconds_bucket" in text
    assert "_created" not in text  # no creation-time series per counter and histogram


def test_mid_stream_failure_ends_with_error_event(gw: str) -> None:
    body = {"model": "m", "prompt": "x", "max_tokens": 6, "stream": True, "test_break_after": 2}
    r = httpx.post(gw + "/v1/completions", json=body)
    assert r.status_code == 200
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "upstream_failed"
    assert len(events) == 4  # two tokens, the error, [DONE]


def test_worker_down_gives_503_with_retry_after() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with gateway(settings(dead)) as url:
        r = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "x"})
        assert r.status_code == 503
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "no_worker_available"
        assert httpx.get(url + "/readyz").status_code == 503
        assert httpx.get(url + "/healthz").status_code == 200


def test_connection_failure_retries_on_another_worker(upstream: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with gateway(settings(dead, upstream, health={"interval_s": 60})) as url:
        for _ in range(3):
            r = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "x"})
            assert r.status_code == 200
            assert r.headers["x-hearthgate-worker"] == "w1"


def test_worker_closing_after_a_500_is_not_marked_down(upstream: str) -> None:
    """vLLM's server (uvicorn) closes its connection right after a 500 raised by an
    exception, without saying so in a header. The gateway does not pool such a connection,
    so the next requests are not dropped on it and the worker is not marked down (two drops
    in a row would; the 60 s health interval would keep it down)."""
    fail = {"model": "m", "prompt": "x", "max_tokens": 1, "test_fail_and_close": True}
    ok = {"model": "m", "prompt": "x", "max_tokens": 1}
    with gateway(settings(upstream, health={"interval_s": 60})) as url:
        for _ in range(4):
            r = httpx.post(url + "/v1/completions", json=fail)
            assert r.status_code == 500  # the worker's own answer, passed on
            assert r.json()["error"]["type"] == "InternalServerError"
            r = httpx.post(url + "/v1/completions", json=ok)
            assert r.status_code == 200, r.text
        (worker,) = httpx.get(url + "/status").json()["workers"]
        assert worker["up"] is True
        assert worker["failovers"] == 4  # one per 500; none for a dropped connection


def test_client_disconnect_releases_the_slot() -> None:
    with instant_upstream(delay_ms=50) as up, gateway(settings(up)) as url:
        body = {"model": "m", "prompt": "x", "max_tokens": 200, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            assert httpx.get(url + "/status").json()["in_flight"] == 1
        until_sync(
            lambda: httpx.get(url + "/status").json()["in_flight"] == 0,
            timeout=5,
            what="slot released after disconnect",
        )


def test_worker_tokenizer_count_drives_classification(upstream: str) -> None:
    rules = [{"min_prompt_tokens": 100, "class": "rag"}]
    prompt = " ".join(["a"] * 150)  # 299 characters: about 75 by the heuristic, 150 words
    for use, expected in ((False, "chat"), (True, "rag")):
        tokens = {"use_worker_tokenizer": use, "tokenizer_min_chars": 10}
        with gateway(settings(upstream, rules=rules, tokens=tokens)) as url:
            r = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": prompt})
            assert r.status_code == 200
            text = httpx.get(url + "/metrics").text
            assert f'hearthgate_admitted_total{{app="anonymous",cls="{expected}"}} 1.0' in text
