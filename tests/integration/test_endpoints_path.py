"""The new endpoints on the request path in-process: stored responses go back to the
worker that holds them, pooling work to the embeddings worker, Anthropic's key header, and
every way out gives back what the request held."""

from __future__ import annotations

import json
import os
from typing import Any

from hearthgate.gateway.multipart import Form, Upload, encode_form
from hearthgate.gateway.upstream import UpstreamResponse
from tests.inprocess import FakeResponse, until
from tests.integration.test_request_path import idle, post, running
from tests.unit.test_endpoints import wav

TWO = [
    {"name": "w0", "url": "http://w0", "models": ["m"]},
    {"name": "w1", "url": "http://w1", "models": ["m"]},
]


def named(kind: str, obj: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


def response_stream(ident: str, tokens: int) -> list[bytes]:
    """A vLLM-like streamed Responses answer of ``tokens`` deltas."""
    out = [named("response.created", {"type": "response.created", "response": {"id": ident}})]
    out += [
        named("response.output_text.delta", {"type": "response.output_text.delta", "delta": "w"})
        for _ in range(tokens)
    ]
    usage = {"input_tokens": 5, "output_tokens": tokens}
    done = {"type": "response.completed", "response": {"id": ident, "usage": usage}}
    return [*out, named("response.completed", done)]


async def stored_by_worker(worker: str, path: str, body: dict[str, Any]) -> UpstreamResponse:
    """Each worker names its responses after itself, streamed or not."""
    ident = f"resp_{worker}_{len(body.get('input', ''))}"
    if body.get("stream"):
        return FakeResponse(chunks=response_stream(ident, 3), content_type="text/event-stream")
    usage = {"input_tokens": 5, "output_tokens": 2}
    return FakeResponse(chunks=[json.dumps({"id": ident, "usage": usage}).encode()])


async def test_a_follow_up_goes_to_the_worker_that_stored_its_response() -> None:
    async with running(stored_by_worker, workers=TWO) as (gw, _):
        first = await post(gw, {"model": "m", "input": "hi"}, "/v1/responses").done()
        home = first.headers["x-hearthgate-worker"]
        ident = first.json()["id"]
        for _ in range(4):  # whatever the load, each follow-up goes home
            body = {"model": "m", "input": "and?", "previous_response_id": ident}
            ex = await post(gw, body, "/v1/responses").done()
            assert ex.status == 200 and ex.headers["x-hearthgate-worker"] == home
        # Streamed answers are remembered too (their id arrives in response.created).
        streamed = {"model": "m", "input": "stream me", "stream": True}
        ex = await post(gw, streamed, "/v1/responses").done()
        worker = ex.headers["x-hearthgate-worker"]
        assert gw.homes.home(f"resp_{worker}_9") == worker
        assert idle(gw)


async def test_a_follow_up_whose_worker_is_gone_gets_a_clear_400() -> None:
    async with running(stored_by_worker, workers=TWO) as (gw, _):
        first = await post(gw, {"model": "m", "input": "hi"}, "/v1/responses").done()
        home = first.headers["x-hearthgate-worker"]
        gw.pool.mark_down(gw.pool.by_name[home], "test: stopped")
        body = {"model": "m", "input": "and?", "previous_response_id": first.json()["id"]}
        ex = await post(gw, body, "/v1/responses").done()
        assert ex.status == 400
        error = ex.json()["error"]
        assert error["code"] == "previous_response_not_found"
        assert error["param"] == "previous_response_id" and home in error["message"]
        unknown = {"model": "m", "input": "x", "previous_response_id": "resp_never"}
        ex = await post(gw, unknown, "/v1/responses").done()
        assert ex.status == 400 and "unknown to this gateway" in ex.json()["error"]["message"]
        assert idle(gw)


async def test_responses_stream_is_charged_and_a_client_leaving_mid_stream_frees_all() -> None:
    async def slow(worker: str, path: str, body: dict[str, Any]) -> UpstreamResponse:
        # Two deltas, then nothing until the client leaves (no response.completed).
        return FakeResponse(chunks=response_stream("resp_x", 2)[:-1], hang=True)

    async with running(slow) as (gw, _):
        ex = post(gw, {"model": "m", "input": "hi", "stream": True}, "/v1/responses")
        await until(lambda: ex.body.count(b"event: response.output_text.delta") == 2, what="deltas")
        ex.disconnect()
        await ex.done()
        await until(lambda: idle(gw), what="everything given back")
        # Cut short before any usage: what was streamed is charged (2 deltas).
        assert gw.app_tokens["anonymous"][1] == 2


async def test_pooling_work_goes_to_the_embeddings_worker_on_the_clients_path() -> None:
    workers = [
        {"name": "gen", "url": "http://gen", "models": ["r"]},
        {"name": "emb", "url": "http://emb", "models": ["r"], "role": "embeddings"},
    ]

    async def ranked(worker: str, path: str, body: dict[str, Any]) -> UpstreamResponse:
        answer = {"id": "x", "results": [], "usage": {"prompt_tokens": 7, "total_tokens": 7}}
        return FakeResponse(chunks=[json.dumps(answer).encode()])

    async with running(ranked, workers=workers) as (gw, up):
        for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
            body = {"model": "r", "query": "q", "documents": ["a", "b"]}
            ex = await post(gw, body, path).done()
            assert ex.status == 200 and ex.headers["x-hearthgate-worker"] == "emb"
            assert up.posts[-1][:2] == ("emb", path)
        ex = await post(gw, {"model": "r", "text_1": "a", "text_2": "b"}, "/score").done()
        assert ex.status == 200 and up.posts[-1][:2] == ("emb", "/score")
        assert gw.app_tokens["anonymous"] == [28, 0]
        assert idle(gw)


async def test_anthropic_clients_key_header_is_an_app_key() -> None:
    async def message(worker: str, path: str, body: dict[str, Any]) -> UpstreamResponse:
        answer = {"id": "msg", "type": "message", "usage": {"input_tokens": 4, "output_tokens": 1}}
        return FakeResponse(chunks=[json.dumps(answer).encode()])

    apps = [{"name": "coder", "key_env": "HG_TEST_KEY_CODER"}]
    os.environ["HG_TEST_KEY_CODER"] = "key-coder"
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    async with running(message, apps=apps) as (gw, _):
        ex = await post(gw, body, "/v1/messages", **{"x-api-key": "key-coder"}).done()
        assert ex.status == 200 and gw.app_tokens["coder"] == [4, 1]
        ex = await post(gw, body, "/v1/messages", **{"x-api-key": "wrong"}).done()
        assert ex.status == 401
        # In Anthropic's shape, as vLLM answers its own errors there and its clients expect.
        assert ex.json() == {
            "type": "error",
            "error": {"type": "authentication_error", "message": "invalid API key"},
        }
        unknown = {**body, "model": "nope"}
        ex = await post(gw, unknown, "/v1/messages", **{"x-api-key": "key-coder"}).done()
        assert ex.status == 404 and ex.json()["error"]["type"] == "not_found_error"
        ex = await post(gw, body, "/v1/messages").done()
        assert ex.status == 401
        assert idle(gw)


async def test_a_broken_stream_ends_in_its_own_kinds_error_event() -> None:
    """A worker that breaks off mid-stream: each kind of stream ends as its clients expect
    (OpenAI's chunks with an error and [DONE]; the Responses API's and Anthropic's named
    ``error`` events, no [DONE])."""
    from hearthgate.gateway.errors import UpstreamFailed

    first = {
        "/v1/responses": named("response.created", {"type": "response.created", "response": {}}),
        "/v1/messages": named("message_start", {"type": "message_start", "message": {}}),
        "/v1/chat/completions": b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n',
    }

    async def breaks(worker: str, path: str, body: dict[str, Any]) -> UpstreamResponse:
        return FakeResponse(chunks=[first[path]], fail=UpstreamFailed("engine died"))

    base = {"model": "m", "stream": True, "max_tokens": 4}
    bodies = {
        "/v1/responses": {"model": "m", "stream": True, "input": "hi"},
        "/v1/messages": {**base, "messages": [{"role": "user", "content": "hi"}]},
        "/v1/chat/completions": {**base, "messages": [{"role": "user", "content": "hi"}]},
    }
    async with running(breaks) as (gw, _):
        for path, body in bodies.items():
            ex = await post(gw, body, path).done()
            tail = ex.body.decode().strip().split("\n\n")[-1]
            if path == "/v1/chat/completions":
                assert tail == "data: [DONE]"
            else:
                kind, data = tail.split("\n")
                assert kind == "event: error" and json.loads(data[6:])["type"] == "error"
                assert "[DONE]" not in ex.body.decode()
        assert idle(gw)


# ------------------------------------------------------------------ speech in and out


def upload(seconds: float = 3.0, **fields: str) -> tuple[bytes, str]:
    """A transcription form as the OpenAI SDK sends it: fields and a WAV file."""
    audio = wav(seconds)
    form = Form({"model": "whisper", "response_format": "json", **fields})
    form.files.append(Upload("file", "a.wav", "audio/wav", audio))
    return encode_form(form)


SPEECH_WORKERS = [
    {"name": "gen", "url": "http://gen", "models": ["m"]},
    {"name": "stt", "url": "http://stt", "models": ["whisper"]},
    {"name": "tts", "url": "http://tts", "models": ["tts-1"], "role": "speech"},
]
VOICE_APP = [{"name": "assistant", "key_env": "HG_TEST_KEY_VOICE", "default_class": "voice"}]


async def audio_worker(worker: str, path: str, body: dict[str, Any]) -> UpstreamResponse:
    if path == "/v1/audio/speech":
        return FakeResponse(chunks=[b"RIFF", b"....", b"WAVE"], content_type="audio/wav")
    form = body["form"]
    if form.fields.get("stream") == "true":
        chunks = [
            b'data: {"object":"transcription.chunk","choices":[{"delta":{"content":"hi"}}]}\n\n',
            b'data: {"choices":[],"usage":{"prompt_tokens":300,"completion_tokens":1}}\n\n',
            b"data: [DONE]\n\n",
        ]
        return FakeResponse(chunks=chunks, content_type="text/event-stream")
    text = {"text": f"{len(form.files[0].data)} bytes", "usage": {"type": "duration"}}
    return FakeResponse(chunks=[json.dumps(text).encode()])


async def test_a_voice_apps_transcription_is_voice_and_charged_by_its_seconds() -> None:
    os.environ["HG_TEST_KEY_VOICE"] = "key-voice"
    key = {"authorization": "Bearer key-voice"}
    async with running(audio_worker, workers=SPEECH_WORKERS, apps=VOICE_APP) as (gw, up):
        raw, ctype = upload(3.0, language="en")
        ex = await post(
            gw, raw, "/v1/audio/transcriptions", **key, **{"content-type": ctype}
        ).done()
        assert ex.status == 200, ex.body
        assert ex.headers["x-hearthgate-worker"] == "stt"
        assert ex.headers["x-hearthgate-class"] == "voice"  # the app's default class
        _, path, sent = up.posts[-1]
        assert path == "/v1/audio/transcriptions"
        assert sent["form"].fields["language"] == "en" and sent["form"].fields["model"] == "whisper"
        assert ex.json()["text"] == f"{len(wav(3.0))} bytes"  # the audio arrived whole
        # No usage in tokens from the worker: the estimate stands (3 s x 50 positions).
        assert gw.scheduler.tenant_counters()["voice"]["assistant"] == 150
        assert idle(gw)


async def test_a_streamed_transcription_asks_for_usage_and_hides_it_unless_asked() -> None:
    async with running(audio_worker, workers=SPEECH_WORKERS) as (gw, up):
        raw, ctype = upload(stream="true")
        ex = await post(gw, raw, "/v1/audio/transcriptions", **{"content-type": ctype}).done()
        assert ex.status == 200 and up.posts[-1][2]["form"].fields["stream_include_usage"] == "true"
        assert ex.events()[-1] == "[DONE]" and not any("usage" in e for e in ex.events())
        assert gw.app_tokens["anonymous"] == [300, 1]
        raw, ctype = upload(stream="true", stream_include_usage="true")
        ex = await post(gw, raw, "/v1/audio/transcriptions", **{"content-type": ctype}).done()
        assert any('"usage"' in e for e in ex.events())
        assert idle(gw)


async def test_bad_uploads_get_clear_errors() -> None:
    async with running(
        audio_worker, workers=SPEECH_WORKERS, limits={"max_upload_bytes": 50_000}
    ) as (
        gw,
        up,
    ):
        raw, ctype = upload(3.0)  # 96 kB of audio
        cases = {
            "too large": (raw, ctype, 413),
            "not multipart": (b'{"model": "whisper"}', "application/json", 400),
            "no boundary": (b"x", "multipart/form-data", 400),
            "cut short": (upload(0.5)[0][:-30], upload(0.5)[1], 400),
        }
        form = Form({"model": "whisper"})
        cases["no file"] = (*encode_form(form), 400)
        for what, (body, kind, status) in cases.items():
            ex = await post(gw, body, "/v1/audio/transcriptions", **{"content-type": kind}).done()
            assert ex.status == status, (what, ex.body)
            assert "error" in ex.json(), what
        assert not up.posts and idle(gw)


async def test_speech_audio_is_relayed_as_it_arrives_from_the_speech_worker() -> None:
    async with running(audio_worker, workers=SPEECH_WORKERS) as (gw, _):
        body = {"model": "tts-1", "input": "The lights are off.", "voice": "alloy"}
        ex = await post(gw, body, "/v1/audio/speech").done()
        assert ex.status == 200 and ex.body == b"RIFF....WAVE"
        assert ex.headers["content-type"] == "audio/wav"
        assert ex.headers["x-hearthgate-worker"] == "tts"
        # Charged by the characters to speak; the first audio byte is its first token.
        assert gw.scheduler.tenant_counters()["chat"]["anonymous"] == len(body["input"])
        assert len(gw.metrics.recent_ttft["/v1/audio/speech"]) == 1
        assert idle(gw)


async def test_a_client_leaving_mid_audio_frees_everything() -> None:
    async def slow(worker: str, path: str, body: dict[str, Any]) -> UpstreamResponse:
        return FakeResponse(chunks=[b"RIFF"], hang=True, content_type="audio/wav")

    async with running(slow, workers=SPEECH_WORKERS) as (gw, _):
        ex = post(gw, {"model": "tts-1", "input": "hi"}, "/v1/audio/speech")
        await until(lambda: ex.body == b"RIFF", what="first audio")
        ex.disconnect()
        await ex.done()
        await until(lambda: idle(gw), what="everything given back")
