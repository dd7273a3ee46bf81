"""Routing and failover through a real gateway process in front of instant upstreams.

Cheap checks of the mechanics (which worker a request reaches, failover before the first
byte, the error event after it, model aliases); the same against real vLLM workers is
tests/e2e/test_routing_vllm.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import gateway, instant_upstream, sse_events

LONG = "word " * 400  # 2000 characters: an estimate of 500 tokens
ROUTING = {"long_prefill_min_tokens": 200}


def worker(name: str, url: str, role: str = "general", **extra: Any) -> dict[str, Any]:
    return {"name": name, "url": url, "models": ["m"], "role": role, **extra}


def completion(prompt: str = "x", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": prompt, "max_tokens": 3, **extra}


def post(url: str, body: dict[str, Any], path: str = "/v1/completions") -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=30)


def workers_status(url: str) -> dict[str, dict[str, Any]]:
    return {w["name"]: w for w in httpx.get(url + "/status").json()["workers"]}


@pytest.fixture(scope="module")
def two() -> Iterator[tuple[str, str]]:
    with instant_upstream() as a, instant_upstream() as b:
        yield a, b


def test_long_prompts_to_the_long_prefill_worker_short_ones_to_the_general(
    two: tuple[str, str],
) -> None:
    a, b = two
    cfg = {
        "workers": [worker("lp", a, "long_prefill"), worker("gen", b)],
        "routing": ROUTING,
        "health": {"interval_s": 0.2},
    }
    with gateway(cfg) as url:
        for stream in (False, True):
            assert post(url, completion(stream=stream)).headers["x-hearthgate-worker"] == "gen"
            r = post(url, completion(LONG, stream=stream))
            assert r.status_code == 200 and r.headers["x-hearthgate-worker"] == "lp"
        chat = {"model": "m", "messages": [{"role": "user", "content": LONG}], "max_tokens": 2}
        assert post(url, chat, "/v1/chat/completions").headers["x-hearthgate-worker"] == "lp"
        served = {n: w["served"] for n, w in workers_status(url).items()}
        assert served == {"lp": 3, "gen": 2}
        metrics = httpx.get(url + "/metrics").text
        assert 'hearthgate_worker_info{role="long_prefill",worker="lp"} 1.0' in metrics
        assert 'hearthgate_worker_served_total{worker="lp"} 3.0' in metrics


def test_long_prompts_stay_on_a_general_worker_when_no_long_prefill_one_is_up(
    two: tuple[str, str],
) -> None:
    a, _ = two
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    cfg = {
        "workers": [worker("lp", dead, "long_prefill"), worker("gen", a)],
        "routing": ROUTING,
        "health": {"interval_s": 0.2},
    }
    with gateway(cfg) as url:
        r = post(url, completion(LONG))
        assert r.status_code == 200 and r.headers["x-hearthgate-worker"] == "gen"


def test_a_worker_dropping_connections_fails_over_to_another(two: tuple[str, str]) -> None:
    _, b = two
    with instant_upstream(args=["--drop-before-headers"]) as bad:
        # "a-bad" wins the tie between two idle workers, so each request tries it first.
        cfg = {
            "workers": [worker("a-bad", bad), worker("b-ok", b)],
            "health": {"interval_s": 60},
        }
        with gateway(cfg) as url:
            for stream in (False, True, False):
                r = post(url, completion(stream=stream, max_tokens=4))
                assert r.status_code == 200, r.text
                assert r.headers["x-hearthgate-worker"] == "b-ok"
                if stream:
                    assert sse_events(r.text)[-1] == "[DONE]"
            st = workers_status(url)
            assert st["a-bad"]["failovers"] >= 1
            # Dropped twice in a row: marked down until its health check passes again.
            assert st["a-bad"]["up"] is False
            assert (
                'hearthgate_worker_failovers_total{worker="a-bad"}'
                in httpx.get(url + "/metrics").text
            )


def test_a_worker_answering_500_fails_over_and_alone_passes_its_error_on(
    two: tuple[str, str],
) -> None:
    a, _ = two
    with instant_upstream(args=["--fail-status", "500"]) as broken:
        cfg = {"workers": [worker("broken", broken), worker("ok", a)], "health": {"interval_s": 5}}
        with gateway(cfg) as url:
            for stream in (False, True):
                r = post(url, completion(stream=stream))
                assert r.status_code == 200, r.text
                assert r.headers["x-hearthgate-worker"] == "ok"
        # With no other worker to try, the worker's own error reaches the client unchanged.
        with gateway({"workers": [worker("broken", broken)]}) as url:
            r = post(url, completion())
            assert r.status_code == 500
            assert "EngineCore" in r.json()["error"]["message"]
            assert workers_status(url)["broken"]["served"] == 1  # tried once, not three times


def test_a_stopped_worker_fails_over_before_the_health_check_notices(
    two: tuple[str, str],
) -> None:
    _, b = two
    doomed_cm = instant_upstream()
    doomed = doomed_cm.__enter__()
    stopped = False
    try:
        cfg = {"workers": [worker("a", doomed), worker("b", b)], "health": {"interval_s": 60}}
        with gateway(cfg) as url:
            assert post(url, completion()).headers["x-hearthgate-worker"] == "a"
            # Stop it; the gateway still believes it healthy (next check in a minute).
            doomed_cm.__exit__(None, None, None)
            stopped = True
            for stream in (False, True):
                r = post(url, completion(stream=stream))
                assert r.status_code == 200, r.text
                assert r.headers["x-hearthgate-worker"] == "b"
            st = workers_status(url)
            assert st["a"]["up"] is False and st["a"]["failovers"] == 1
    finally:
        if not stopped:
            doomed_cm.__exit__(None, None, None)


def test_after_the_first_byte_the_client_gets_an_error_event(two: tuple[str, str]) -> None:
    a, b = two
    cfg = {"workers": [worker("a", a), worker("b", b)], "health": {"interval_s": 0.2}}
    with gateway(cfg) as url:
        r = post(url, completion(stream=True, max_tokens=6, test_break_after=2))
        assert r.status_code == 200
        events = sse_events(r.text)
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"]["code"] == "upstream_failed"
        assert len(events) == 4  # two tokens, the error event, [DONE]: not retried


def test_logical_model_is_renamed_for_the_worker_and_back(two: tuple[str, str]) -> None:
    _, b = two
    with instant_upstream(args=["--served-model", "m-upstream"]) as up:
        cfg = {
            "workers": [
                worker("aliased", up, upstream_models={"m": "m-upstream"}),
                worker("plain", b, limits={"max_in_flight": 1}),
            ],
            "health": {"interval_s": 0.2},
        }
        with gateway(cfg) as url:
            assert [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]] == ["m"]
            r = post(url, completion())
            assert r.status_code == 200, r.text
            assert r.headers["x-hearthgate-worker"] == "aliased"
            assert r.json()["model"] == "m"
            r = post(url, completion(stream=True))
            assert r.headers["x-hearthgate-worker"] == "aliased"
            events = sse_events(r.text)
            assert {json.loads(e)["model"] for e in events[:-1]} == {"m"}
            # The upstream answers 404 to any other name: the gateway did rename it.
            assert post(up, completion()).status_code == 404
            assert post(up, {**completion(), "model": "m-upstream"}).status_code == 200
