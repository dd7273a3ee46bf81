"""The endpoint registry (gateway/endpoints): every kind's body checks, streamed-event
readers and usage, on plain values."""

from __future__ import annotations

import io
import json
import wave
from pathlib import Path

import pytest

from hearthgate.gateway.endpoints import BATCH_PATHS, BY_PATH, ENDPOINTS
from hearthgate.gateway.endpoints.messages import MessageEvents
from hearthgate.gateway.endpoints.responses import ResponseEvents
from hearthgate.gateway.errors import BadRequest
from hearthgate.gateway.multipart import Form, Upload, encode_form
from hearthgate.gateway.parse import parse_body, parse_upload
from hearthgate.gateway.proxy import read_answer
from hearthgate.gateway.settings import Rule
from hearthgate.gateway.sse import SseSplitter, StreamObserver, event_data

FIXTURES = Path(__file__).parent.parent / "fixtures" / "home_apps"


def named(kind: str, obj: object) -> bytes:
    """One named event as vLLM writes it (compact JSON)."""
    return f"event: {kind}\ndata: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


def test_every_path_belongs_to_one_endpoint_and_names_are_unique() -> None:
    paths = [p for e in ENDPOINTS.values() for p in e.paths]
    assert len(paths) == len(set(paths)) == len(BY_PATH)
    assert all(BY_PATH[p].name == name for name, e in ENDPOINTS.items() for p in e.paths)
    # OpenAI's Batch API takes these, and so does the gateway's.
    assert set(BATCH_PATHS) == {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
    }


def test_streaming_endpoints_have_readers_and_pooling_ones_never_generate() -> None:
    for e in ENDPOINTS.values():
        if e.pooling:
            assert not e.generates and e.reader is None, e.name
        elif e.audio_out:  # relayed as bytes, charged by its text
            assert e.reader is None and e.cost is not None, e.name
        else:
            assert e.generates and e.reader is not None, e.name


def test_rules_match_endpoint_names_and_refuse_unknown_ones() -> None:
    assert Rule.model_validate({"endpoint": "rerank", "class": "rag"}).endpoint == "rerank"
    with pytest.raises(ValueError, match="unknown endpoint 'speak'"):
        Rule.model_validate({"endpoint": "speak", "class": "rag"})


def test_event_data_reads_plain_and_named_events() -> None:
    assert event_data(b'data: {"a":1}\n\n') == b'{"a":1}'
    assert event_data(b'event: x\ndata: {"a":1}\n\n') == b'{"a":1}'
    assert event_data(b": keep-alive\n\n") is None


RESPONSE_STREAM = [
    named("response.created", {"type": "response.created", "response": {"id": "resp_1"}}),
    named("response.in_progress", {"type": "response.in_progress", "response": {"id": "resp_1"}}),
    named(
        "response.output_text.delta",
        {"type": "response.output_text.delta", "delta": "Hi", "sequence_number": 3},
    ),
    named(
        "response.output_text.delta",
        {"type": "response.output_text.delta", "delta": " there", "sequence_number": 4},
    ),
    named(
        "response.function_call_arguments.delta",
        {"type": "response.function_call_arguments.delta", "delta": "{}"},
    ),
    named(
        "response.completed",
        {
            "type": "response.completed",
            "response": {"id": "resp_1", "usage": {"input_tokens": 12, "output_tokens": 3}},
        },
    ),
]


def test_responses_stream_counts_deltas_usage_and_the_id() -> None:
    obs = StreamObserver(ResponseEvents())
    shown = [e for i, e in enumerate(RESPONSE_STREAM) if obs.observe(e, float(i))]
    assert shown == RESPONSE_STREAM  # nothing of the Responses API is hidden
    assert obs.token_events == 3 and obs.first_token_at == 2.0
    assert (obs.prompt_tokens, obs.completion_tokens, obs.ident) == (12, 3, "resp_1")
    assert obs.error is None


def test_responses_fast_path_agrees_with_parsing_spaced_json() -> None:
    for event in RESPONSE_STREAM:
        payload = event_data(event)
        assert payload is not None
        spaced = b"data: " + json.dumps(json.loads(payload)).encode() + b"\n\n"
        fast, slow = StreamObserver(ResponseEvents()), StreamObserver(ResponseEvents())
        fast.observe(event, 0.0)
        slow.observe(spaced, 0.0)
        assert fast.token_events == slow.token_events, event


def test_responses_failure_is_an_error() -> None:
    obs = StreamObserver(ResponseEvents())
    failed = {"type": "response.failed", "response": {"id": "r", "error": {"message": "x"}}}
    obs.observe(named("response.failed", failed), 0.0)
    assert obs.error == {"message": "x"}


MESSAGE_STREAM = [
    named(
        "message_start",
        {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 9}}},
    ),
    named("content_block_start", {"type": "content_block_start", "index": 0}),
    named(
        "content_block_delta",
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "a"}},
    ),
    named(
        "content_block_delta",
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "b"}},
    ),
    named("message_delta", {"type": "message_delta", "usage": {"output_tokens": 2}}),
    named("message_stop", {"type": "message_stop"}),
]


def test_messages_stream_counts_deltas_and_usage() -> None:
    obs = StreamObserver(MessageEvents())
    splitter = SseSplitter()
    events = splitter.feed(b"".join(MESSAGE_STREAM))
    assert events == MESSAGE_STREAM
    assert all(obs.observe(e, float(i)) for i, e in enumerate(events))
    assert obs.token_events == 2 and obs.gaps == [1.0]
    assert (obs.prompt_tokens, obs.completion_tokens) == (9, 2)


def test_messages_error_event() -> None:
    obs = StreamObserver(MessageEvents())
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    obs.observe(named("error", error), 0.0)
    assert obs.error == {"type": "overloaded_error", "message": "busy"}


@pytest.mark.parametrize(
    ("keys", "usage", "expected"),
    [
        (
            ("prompt_tokens", "completion_tokens"),
            {"prompt_tokens": 4, "completion_tokens": 2},
            (4, 2),
        ),
        (("input_tokens", "output_tokens"), {"input_tokens": 5, "output_tokens": 7}, (5, 7)),
        (("prompt_tokens", None), {"prompt_tokens": 8, "total_tokens": 8}, (8, None)),
    ],
)
def test_whole_answers_read_usage_under_the_endpoints_keys(
    keys: tuple[str, str | None], usage: dict[str, int], expected: tuple[int, int | None]
) -> None:
    prompt, output, ident = read_answer(json.dumps({"id": "x", "usage": usage}).encode(), keys)
    assert (prompt, output, ident) == (*expected, "x")


def body(**kw: object) -> bytes:
    return json.dumps({"model": "m", **kw}).encode()


def test_responses_body_checks() -> None:
    p = parse_body(body(input="hi", max_output_tokens=9, stream=True), "responses")
    assert (p.max_tokens, p.stream, p.spec.name) == (9, True, "responses")
    with pytest.raises(BadRequest, match="'input' is required"):
        parse_body(body(), "responses")
    with pytest.raises(BadRequest, match="'max_output_tokens' must be an integer"):
        parse_body(body(input="x", max_output_tokens="9"), "responses")
    with pytest.raises(BadRequest, match="'previous_response_id' must be a string"):
        parse_body(body(input="x", previous_response_id=3), "responses")


def test_rerank_and_score_body_checks() -> None:
    p = parse_body(body(query="q", documents=["a", "b"]), "rerank", path="/v2/rerank")
    assert p.upstream_path == "/v2/rerank" and p.max_tokens is None and p.spec.pooling
    with pytest.raises(BadRequest, match="'documents' is required"):
        parse_body(body(query="q"), "rerank")
    with pytest.raises(BadRequest, match="'stream' is not supported for rerank"):
        parse_body(body(query="q", documents=["a"], stream=True), "rerank")
    parse_body(body(text_1="a", text_2=["b"]), "score")
    parse_body(body(queries="a", documents=["b"]), "score")
    with pytest.raises(BadRequest, match="one of 'text_2', 'documents'"):
        parse_body(body(text_1="a"), "score")


def test_messages_keep_the_query_string() -> None:
    p = parse_body(
        body(messages=[], max_tokens=5), "messages", path="/v1/messages", query="beta=true"
    )
    assert p.upstream_path == "/v1/messages?beta=true" and p.max_tokens == 5


def wav(seconds: float, rate: int = 16000) -> bytes:
    """Silence as a 16-bit mono WAV file."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\0\0" * int(seconds * rate))
    return out.getvalue()


@pytest.mark.parametrize("fixture", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.stem)
def test_home_app_bodies_pass_the_gateways_checks(fixture: Path) -> None:
    """What Home Assistant, Open WebUI, the Wyoming bridge, Continue and coding tools send
    (tests/fixtures/home_apps, from their public source) is accepted as it is."""
    sent = json.loads(fixture.read_text())
    path = sent["path"].split("?")[0]
    spec = BY_PATH[path]
    if sent.get("multipart"):
        form = sent["multipart"]
        upload = Upload(form["file_field"], form["filename"], "audio/wav", wav(3.0))
        raw, ctype = encode_form(Form(dict(form["fields"]), [upload]))
        p = parse_upload(raw, ctype, spec.name, path)
        assert p.model == form["fields"]["model"] and p.audio_s == 3.0
        assert p.spec.cost is not None and p.spec.cost(p)[0] == 150  # 3 s x 50
    else:
        p = parse_body(json.dumps(sent["body"]).encode(), spec.name, path=path)
        assert p.model == (sent["body"].get("model") or p.model)
