"""Speech in, speech out and rerank through the gateway to real servers, with the official
OpenAI client and the bodies home apps send: a speech-to-text vLLM worker (a tiny Whisper),
a rerank vLLM worker (a tiny cross-encoder) and a Piper text-to-speech server
(deploy/tts_server.py), next to the session's generation worker."""

from __future__ import annotations

import io
import json
import wave
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from hearthgate.deploy.tts_server import TtsServer
from hearthgate.deploy.vllm_worker import VllmWorker, start_all, stop_all
from tests.e2e.conftest import Workers
from tests.support import RUN_DIR, free_port, gateway, sse_events

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).parent.parent / "fixtures" / "home_apps"
VOICE_KEY = "e2e-voice-key"
NOTES_KEY = "e2e-notes-key"


@dataclass
class Speech:
    stt: VllmWorker
    rerank: VllmWorker
    tts: TtsServer
    gateway: str


@pytest.fixture(scope="module")
def speech(workers: Workers, monkeypatch_module: pytest.MonkeyPatch) -> Iterator[Speech]:
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    sp, rp, tp = free_port(), free_port(), free_port()
    stt = VllmWorker("stt", sp, 1, RUN_DIR / f"vllm-stt-{sp}.log")
    rerank = VllmWorker("rerank", rp, 0, RUN_DIR / f"vllm-rerank-{rp}.log")
    tts = TtsServer(tp, RUN_DIR / f"tts-{tp}.log")
    start_all([stt, rerank, tts], timeout=300)
    monkeypatch_module.setenv("HG_E2E_VOICE_KEY", VOICE_KEY)
    monkeypatch_module.setenv("HG_E2E_NOTES_KEY", NOTES_KEY)
    settings = {
        "workers": [
            {"name": "gen0", "url": workers.gen.url, "models": ["tiny-llama"]},
            {"name": "stt0", "url": stt.url, "models": ["tiny-whisper"], "role": "transcription"},
            {"name": "rr0", "url": rerank.url, "models": ["tiny-rerank"], "role": "embeddings"},
            {"name": "tts0", "url": tts.url, "models": ["tts-1"], "role": "speech"},
        ],
        "apps": [
            {"name": "assistant", "key_env": "HG_E2E_VOICE_KEY", "default_class": "voice"},
            {"name": "notes", "key_env": "HG_E2E_NOTES_KEY", "default_class": "chat"},
        ],
        "rules": [
            {"endpoint": "embeddings", "class": "embed"},
            {"endpoint": "rerank", "class": "rag"},
            {"endpoint": "score", "class": "rag"},
        ],
        "health": {"interval_s": 0.5, "retry_after_s": 2},
        "limits": {"max_body_bytes": 200_000},
    }
    try:
        with gateway(settings, name="speech-gateway") as url:
            yield Speech(stt, rerank, tts, url)
    finally:
        stop_all([stt, rerank, tts])


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def wav(seconds: float, rate: int = 16000) -> bytes:
    """A tone as a 16-bit mono WAV file (the tiny Whisper transcribes anything)."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        frames = bytearray()
        for i in range(int(seconds * rate)):
            frames += int(8000 * ((i // 20) % 2 * 2 - 1)).to_bytes(2, "little", signed=True)
        w.writeframes(bytes(frames))
    return out.getvalue()


def client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)


def test_transcription_through_the_sdk_is_voice_for_a_voice_app(speech: Speech) -> None:
    audio = ("a.wav", wav(3.0), "audio/wav")
    extra = {"temperature": 0, "max_completion_tokens": 16}
    via = client(speech.gateway, VOICE_KEY).audio.transcriptions.with_raw_response.create(
        model="tiny-whisper", file=audio, response_format="json", language="en", extra_body=extra
    )
    direct = client(speech.stt.url, "unused").audio.transcriptions.create(
        model="tiny-whisper", file=audio, response_format="json", language="en", extra_body=extra
    )
    assert via.parse().text == direct.text  # the same audio reached the worker
    assert via.headers["x-hearthgate-class"] == "voice"
    assert via.headers["x-hearthgate-worker"] == "stt0"


def test_streamed_transcription(speech: Speech) -> None:
    files = {"file": ("a.wav", wav(2.0), "audio/wav")}
    data = {"model": "tiny-whisper", "stream": "true", "max_completion_tokens": "8"}
    r = httpx.post(
        speech.gateway + "/v1/audio/transcriptions",
        files=files,
        data=data,
        headers={"authorization": f"Bearer {NOTES_KEY}"},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    # The gateway asked for usage to count tokens; the client did not, so it is hidden.
    assert not any('"usage"' in e for e in events)


@pytest.mark.parametrize(
    "name", ["ha_transcription", "openwebui_transcription", "wyoming_transcription"]
)
def test_home_apps_transcriptions_are_answered(speech: Speech, name: str) -> None:
    sent = json.loads((FIXTURES / f"{name}.json").read_text())["multipart"]
    fields = {**sent["fields"], "max_completion_tokens": "8"}
    r = httpx.post(
        speech.gateway + "/v1/audio/transcriptions",
        files={sent["file_field"]: (sent["filename"], wav(1.0), "audio/wav")},
        data=fields,
        headers={"authorization": f"Bearer {VOICE_KEY}"},
        timeout=120,
    )
    assert r.status_code == 200, r.text


def test_speech_streams_audio_through_the_sdk(speech: Speech) -> None:
    with client(speech.gateway, VOICE_KEY).audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input="The kitchen lights are off.", response_format="wav"
    ) as response:
        assert response.headers["x-hearthgate-worker"] == "tts0"
        assert response.headers["content-type"].startswith("audio/wav")
        audio = b"".join(response.iter_bytes())
    assert audio[:4] == b"RIFF" and audio[8:12] == b"WAVE"
    with wave.open(io.BytesIO(audio)) as w:
        assert w.getnframes() / w.getframerate() > 0.5  # real speech, not a stub


@pytest.mark.parametrize("name", ["ha_speech", "openwebui_speech", "wyoming_speech"])
def test_home_apps_speech_is_answered(speech: Speech, name: str) -> None:
    body = json.loads((FIXTURES / f"{name}.json").read_text())["body"]
    # This server speaks wav and pcm only (mp3 needs ffmpeg on its host).
    body = {**body, "model": "tts-1", "response_format": "wav"}
    r = httpx.post(
        speech.gateway + "/v1/audio/speech",
        json=body,
        headers={"authorization": f"Bearer {VOICE_KEY}"},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert r.content[:4] == b"RIFF"


def test_rerank_and_score_match_the_worker(speech: Speech) -> None:
    body = {
        "model": "tiny-rerank",
        "query": "when is soccer practice",
        "documents": ["practice moved to thursday", "dinner is at seven", "the garden"],
    }
    key = {"authorization": f"Bearer {NOTES_KEY}"}
    direct = httpx.post(speech.rerank.url + "/v1/rerank", json=body, timeout=60).json()
    for path in ("/v1/rerank", "/rerank"):
        r = httpx.post(speech.gateway + path, json=body, headers=key, timeout=60)
        assert r.status_code == 200, r.text
        assert r.headers["x-hearthgate-class"] == "rag"  # the rerank rule
        got = r.json()["results"]
        assert [x["index"] for x in got] == [x["index"] for x in direct["results"]]
        assert [x["relevance_score"] for x in got] == pytest.approx(
            [x["relevance_score"] for x in direct["results"]]
        )
    v2 = httpx.post(speech.gateway + "/v2/rerank", json=body, headers=key, timeout=60)
    assert v2.status_code == 200 and len(v2.json()["results"]) == 3
    pairs = {"model": "tiny-rerank", "text_1": body["query"], "text_2": body["documents"]}
    score = httpx.post(speech.gateway + "/v1/score", json=pairs, headers=key, timeout=60)
    assert score.status_code == 200 and len(score.json()["data"]) == 3


@pytest.mark.parametrize("name", ["openwebui_rerank", "continue_rerank"])
def test_home_apps_reranks_get_one_score_per_document(speech: Speech, name: str) -> None:
    body = {**json.loads((FIXTURES / f"{name}.json").read_text())["body"], "model": "tiny-rerank"}
    r = httpx.post(
        speech.gateway + "/v1/rerank",
        json=body,
        headers={"authorization": f"Bearer {NOTES_KEY}"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert sorted(x["index"] for x in results) == list(range(len(body["documents"])))


def test_speech_lists_and_models(speech: Speech) -> None:
    key = {"authorization": f"Bearer {NOTES_KEY}"}
    models = httpx.get(speech.gateway + "/v1/models", headers=key).json()["data"]
    assert [m["id"] for m in models] == ["tiny-llama", "tiny-whisper", "tiny-rerank", "tts-1"]
    assert {m["id"]: m.get("max_model_len") for m in models}["tiny-whisper"] == 448
    assert httpx.get(speech.gateway + "/v1/audio/models", headers=key).status_code == 200
    assert httpx.get(speech.gateway + "/v1/audio/voices").status_code == 401  # keys are on


@pytest.mark.parametrize("endpoint", ["rerank", "score"])
def test_fuzz_rerank_and_score(speech: Speech, endpoint: str) -> None:
    """The fuzzer's odd bodies on the pooling endpoints (tests/e2e/test_fuzz_vllm.py has
    the others): no 5xx of the gateway's own, every 4xx in OpenAI's shape, nothing hangs."""
    from hearthgate.loadtests.fuzz import FuzzConfig, render_markdown, run

    count = 100
    cfg = FuzzConfig(key=NOTES_KEY, body_limit=200_000, send_seed=False)
    tally = run(speech.gateway, count, 13, cfg, endpoints=[endpoint], concurrency=4)
    assert tally.sent[endpoint] == count
    if tally.failed:
        report = render_markdown(tally, {"test": f"{endpoint}, seed 13"}, 13)
        pytest.fail(report[report.index("## Failures") :][:6000])
    relayed = sum(n for (_, s, o), n in tally.counts.items() if o == "worker" and s == "200")
    assert relayed > count // 20
