"""SSE relay pieces: event splitting across arbitrary chunk borders, usage handling."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from hearthgate.gateway.endpoints.chunks import ChunkReader
from hearthgate.gateway.sse import SseSplitter, StreamObserver


def ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


TOKENS = [ev({"choices": [{"index": 0, "text": f"w{i}"}]}) for i in range(5)]
USAGE = ev({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}})
STREAM = b"".join(TOKENS) + USAGE + b"data: [DONE]\n\n"


@given(st.lists(st.integers(min_value=1, max_value=len(STREAM)), max_size=20))
def test_split_at_any_borders_gives_whole_events(cuts: list[int]) -> None:
    s = SseSplitter()
    events: list[bytes] = []
    last = 0
    for c in [*sorted(set(cuts)), len(STREAM)]:
        events += s.feed(STREAM[last:c])
        last = c
    assert b"".join(events) == STREAM
    assert events == [*TOKENS, USAGE, b"data: [DONE]\n\n"]
    assert s.rest() == b""


def test_observer_strips_usage_only_when_client_did_not_ask() -> None:
    for strip in (True, False):
        obs = StreamObserver(ChunkReader(), strip_usage=strip)
        shown = [e for i, e in enumerate([*TOKENS, USAGE]) if obs.observe(e, float(i))]
        assert (USAGE in shown) is (not strip)
        assert (obs.prompt_tokens, obs.completion_tokens) == (3, 5)
        assert obs.token_events == 5
        assert obs.first_token_at == 0.0
        assert obs.gaps == [1.0, 1.0, 1.0, 1.0]


def test_chat_deltas_and_role_only_chunks() -> None:
    obs = StreamObserver(ChunkReader(), strip_usage=True)
    role = ev({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    tok = ev({"choices": [{"index": 0, "delta": {"content": "hi"}}]})
    assert obs.observe(role, 1.0) and obs.first_token_at is None
    assert obs.observe(tok, 2.0) and obs.first_token_at == 2.0


def test_error_event_is_kept_and_recorded() -> None:
    obs = StreamObserver(ChunkReader(), strip_usage=True)
    assert obs.observe(ev({"error": {"message": "boom", "code": 500}}), 0.0)
    assert obs.error == {"message": "boom", "code": 500}


def test_fast_path_agrees_with_json_on_vllm_chunks() -> None:
    fast_token = ChunkReader().fast

    compact = [
        b'{"id":"c","choices":[{"index":0,"text":" shar","logprobs":null,"finish_reason":null}]}',
        b'{"id":"c","choices":[{"index":0,"delta":{"content":"ater"},"finish_reason":null}]}',
        b'{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}',
        b'{"id":"c","choices":[{"index":0,"text":"","finish_reason":"length"}]}',
        b'{"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5}}',
        b'{"id":"c","choices":[{"index":0,"text":"say \\"usage\\":{ here"}]}',
        b'{"error":{"message":"boom"}}',
    ]
    for payload in compact:
        slow = StreamObserver(ChunkReader(), strip_usage=False)
        spaced = json.dumps(json.loads(payload)).encode()  # ": " spacing: parsed as JSON
        slow_seen = slow.observe(b"data: " + spaced + b"\n\n", 0.0)
        fast = StreamObserver(ChunkReader(), strip_usage=False)
        fast_seen = fast.observe(b"data: " + payload + b"\n\n", 0.0)
        assert (fast.token_events, fast_seen) == (slow.token_events, slow_seen), payload
    assert fast_token(compact[0]) is True
    assert fast_token(compact[2]) is None  # an empty content needs the parser
