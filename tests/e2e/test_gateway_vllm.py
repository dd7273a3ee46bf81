"""The gateway in front of real vLLM CPU workers: same answers, same usage, clean errors."""

from __future__ import annotations

import json
import math
import re
import select
import socket
import time
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import lasting
from tests.support import sse_events

pytestmark = pytest.mark.e2e

GEN = "tiny-llama"
PROMPT = "The family calendar says the soccer practice moved to Thursday because"
MESSAGES = [{"role": "user", "content": "Remind me what is for dinner tonight, please."}]


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=120)


def stream_text(url: str, path: str, body: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    r = post(url, path, {**body, "stream": True})
    assert r.status_code == 200, r.text
    text, usage = [], None
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    for e in events[:-1]:
        obj = json.loads(e)
        if obj.get("usage"):
            usage = obj["usage"]
        for c in obj["choices"]:
            text.append(c.get("text") or (c.get("delta") or {}).get("content") or "")
    return "".join(text), usage


COMPLETION = {
    "model": GEN,
    "prompt": PROMPT,
    "max_tokens": 16,
    "temperature": 0,
    "ignore_eos": True,
}
CHAT = {"model": GEN, "messages": MESSAGES, "max_tokens": 16, "temperature": 0, "ignore_eos": True}


@pytest.mark.parametrize(
    ("path", "body"), [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)]
)
def test_non_stream_same_text_and_usage(
    gateway_url: str, gen_worker_url: str, path: str, body: dict[str, Any]
) -> None:
    via = post(gateway_url, path, body)
    direct = post(gen_worker_url, path, body)
    assert via.status_code == direct.status_code == 200
    v, d = via.json(), direct.json()
    key = "text" if path == "/v1/completions" else "message"
    assert v["choices"][0][key] == d["choices"][0][key]
    assert v["usage"] == d["usage"]
    assert v["usage"]["completion_tokens"] == 16


@pytest.mark.parametrize(
    ("path", "body"), [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)]
)
def test_stream_same_text_and_usage(
    gateway_url: str, gen_worker_url: str, path: str, body: dict[str, Any]
) -> None:
    with_usage = {**body, "stream_options": {"include_usage": True}}
    via_text, via_usage = stream_text(gateway_url, path, with_usage)
    direct_text, direct_usage = stream_text(gen_worker_url, path, with_usage)
    assert via_text == direct_text and via_text
    assert via_usage == direct_usage and via_usage is not None
    # Without include_usage the client sees no usage chunk, though the gateway asked for one.
    plain_text, plain_usage = stream_text(gateway_url, path, body)
    assert plain_text == direct_text
    assert plain_usage is None
    non_stream = post(gen_worker_url, path, body).json()["choices"][0]
    assert via_text == (non_stream.get("text") or non_stream["message"]["content"])


def test_gateway_counts_tokens_from_usage(gateway_url: str) -> None:
    def completion_tokens() -> float:
        text = httpx.get(gateway_url + "/metrics").text
        m = re.search(r'hearthgate_completion_tokens_total\{model="tiny-llama"\} ([0-9.e+]+)', text)
        return float(m.group(1)) if m else 0.0

    before = completion_tokens()
    stream_text(gateway_url, "/v1/completions", {**COMPLETION, "max_tokens": 7})
    assert completion_tokens() - before == 7


def test_embeddings_match_direct(gateway_url: str, embed_worker_url: str) -> None:
    body = {"model": "minilm", "input": ["pasta with tomato sauce", "the dog needs a walk"]}
    via = post(gateway_url, "/v1/embeddings", body)
    direct = post(embed_worker_url, "/v1/embeddings", body)
    assert via.status_code == direct.status_code == 200
    for a, b in zip(via.json()["data"], direct.json()["data"], strict=True):
        assert len(a["embedding"]) == 384
        dot = sum(x * y for x, y in zip(a["embedding"], b["embedding"], strict=True))
        na = math.sqrt(sum(x * x for x in a["embedding"]))
        nb = math.sqrt(sum(x * x for x in b["embedding"]))
        assert dot / (na * nb) > 0.9999
    assert via.json()["usage"] == direct.json()["usage"]


def error_of(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body["error"]) >= {"message", "type", "code"}, body
    err: dict[str, Any] = body["error"]
    return err


def test_malformed_json_is_400(gateway_url: str) -> None:
    r = httpx.post(gateway_url + "/v1/chat/completions", content=b'{"model": "tiny-llama",')
    assert r.status_code == 400
    assert "not valid JSON" in error_of(r)["message"]


def test_wrong_types_are_400(gateway_url: str) -> None:
    for body in (
        {**CHAT, "max_tokens": "lots"},
        {**CHAT, "messages": "hello"},
        {**CHAT, "stream": "yes"},
        {**CHAT, "temperature": "hot"},  # not checked by the gateway: vLLM's 400 passes through
    ):
        r = post(gateway_url, "/v1/chat/completions", body)
        assert r.status_code == 400, (body, r.text)
        error_of(r)


def test_unknown_model_is_404(gateway_url: str) -> None:
    r = post(gateway_url, "/v1/completions", {**COMPLETION, "model": "gpt-9"})
    assert r.status_code == 404
    assert error_of(r)["code"] == "model_not_found"


def test_oversized_body_is_413(gateway_url: str) -> None:
    r = post(gateway_url, "/v1/completions", {**COMPLETION, "prompt": "word " * 50_000})
    assert r.status_code == 413
    assert error_of(r)["code"] == "request_too_large"


def test_worker_error_passes_through(gateway_url: str, gen_worker_url: str) -> None:
    too_long = {**COMPLETION, "prompt": "hello " * 6000}  # beyond --max-model-len 4096
    via = post(gateway_url, "/v1/completions", too_long)
    direct = post(gen_worker_url, "/v1/completions", too_long)
    assert via.status_code == direct.status_code == 400
    assert error_of(via)["message"] == error_of(direct)["message"]


def test_models_lists_the_union(gateway_url: str) -> None:
    ids = [m["id"] for m in httpx.get(gateway_url + "/v1/models").json()["data"]]
    assert ids == ["tiny-llama", "minilm"]
    assert httpx.get(gateway_url + "/readyz").status_code == 200
    status = httpx.get(gateway_url + "/status").json()
    assert {w["name"]: w["up"] for w in status["workers"]} == {"gen0": True, "emb0": True}


def generated_tokens(worker_url: str) -> float:
    text = httpx.get(worker_url + "/metrics", timeout=60).text
    values = re.findall(r"^vllm:generation_tokens_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    assert values, "the worker exports no generation token counter"
    return sum(float(v) for v in values)


def _leases_closed_within(gateway_url: str, seconds: float) -> bool:
    """Whether the gateway gave back every lease within ``seconds`` (it saw the client go)."""
    deadline = time.monotonic() + seconds
    while httpx.get(gateway_url + "/status", timeout=30).json()["leases"]["open"]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _send_and_leave(base_url: str, path: str, body: dict[str, Any]) -> bytes:
    """POST ``body`` over a plain socket and close the connection as soon as the gateway
    has the request on a worker (``/status``: one in flight): whatever the server had sent
    by then (nothing, if it had not answered)."""
    url = httpx.URL(base_url)
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    with socket.create_connection((url.host, url.port), timeout=10) as sock:
        sock.sendall(head.encode() + payload)
        deadline = time.monotonic() + 30
        while httpx.get(base_url + "/status", timeout=30).json()["in_flight"] == 0:
            assert time.monotonic() < deadline, "the request never reached the worker"
            if select.select([sock], [], [], 0.01)[0]:
                return sock.recv(65536)
        return b""


def _abandon(
    gateway_url: str, gen_worker_url: str, body: dict[str, Any]
) -> tuple[float, bool | str]:
    """Send ``body``, leave early, wait until the worker stops producing: the tokens
    generated, and whether the gateway noticed the client leave within 3 s (so a failure
    says which side missed the disconnect: the gateway, or vLLM after the gateway hung up)."""
    before = generated_tokens(gen_worker_url)
    if body["stream"]:
        with httpx.stream("POST", gateway_url + "/v1/completions", json=body, timeout=60) as r:
            assert next(r.iter_lines()).startswith("data: ")
    else:
        # The client closes its connection once the gateway has forwarded the request,
        # over a plain socket so that no client library's timeouts decide when (one CI run
        # saw httpx's 1 s read timeout not fire while the gateway took 7.5 s to answer,
        # three tries in a row). Not after a fixed time: in a fast hour the worker wrote
        # all 3,500 tokens before a 0.3 s wait was over (2026-12-06 CI, three tries). An
        # answer by then means the request was never abandoned: the try says what came
        # back instead of counting tokens.
        answer = _send_and_leave(gateway_url, "/v1/completions", body)
        if answer:
            return math.inf, f"answered before it was abandoned: {answer[:300]!r}"
    noticed = _leases_closed_within(gateway_url, 3.0)
    # Wait until the worker stops producing tokens (two equal reads a second apart).
    last, deadline = generated_tokens(gen_worker_url), time.monotonic() + 60
    while True:
        time.sleep(1)
        now = generated_tokens(gen_worker_url)
        if now == last:
            return now - before, noticed
        assert time.monotonic() < deadline, "vLLM still generates for the abandoned request"
        last = now


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "non-streaming"])
def test_client_disconnect_aborts_on_the_worker(
    gateway_url: str, gen_worker_url: str, stream: bool
) -> None:
    # A counter, not the running gauge: on a busy CPU worker /metrics can answer slower than
    # the whole request runs, and a gauge read then misses it. If the abort did not reach
    # vLLM, the counter grows by the full max_tokens.
    # Up to three tries: on this shared 2-core box a starved gateway has been seen to notice
    # a disconnect only after the worker finished (once in about six tries; see the session
    # note). A gateway that never aborts fails all three.
    # The request is sized so that the worker takes at least 3 s to write it all (more
    # sequences on a fast box), or the abort could only ever come too late.
    body = lasting(gen_worker_url, {**COMPLETION, "max_tokens": 3500}, 3.0)
    body["stream"] = stream
    whole = body["max_tokens"] * body["n"]
    tries = []
    for _ in range(3):
        tries.append(_abandon(gateway_url, gen_worker_url, body))
        if tries[-1][0] < whole / 2:
            break
    assert tries[-1][0] < whole / 2, (
        f"(tokens generated, gateway noticed the client leave) per try: {tries}"
    )
    status = httpx.get(gateway_url + "/status").json()
    assert status["in_flight"] == 0 and status["leases"]["open"] == 0
