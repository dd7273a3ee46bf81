"""One voice turn as a client sends it (loadtests/voice_turn.py runs them): speech to text
of ~3 s of audio, a streamed Responses API turn read to its first sentence, that sentence
spoken; each request timed."""

from __future__ import annotations

import asyncio
import io
import json
import time
import wave
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

FIRST_SENTENCE_CHARS = 60  # Home Assistant starts speaking after ~60 streamed characters
TURN_PROMPT = "Turn on the kitchen lights and tell me tomorrow's weather."


def speech_wav(seconds: float = 3.0, rate: int = 16000) -> bytes:
    """A square-wave tone as 16-bit mono WAV (the tiny Whisper transcribes anything)."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        half = rate // 400
        frames = bytearray()
        for i in range(int(seconds * rate)):
            frames += (6000 if (i // half) % 2 else -6000).to_bytes(2, "little", signed=True)
        w.writeframes(bytes(frames))
    return out.getvalue()


@dataclass(frozen=True)
class TurnUrls:
    """Where a target takes each of the turn's three requests, and its headers."""

    stt: str
    gen: str
    tts: str
    headers: Mapping[str, str]


@dataclass
class Turn:
    """One voice turn's times (seconds; None: did not happen)."""

    target: str
    phase: str  # idle | loaded
    round: int
    started_s: float
    stt_s: float | None = None  # upload start -> transcript
    ttft_s: float | None = None  # Responses request -> first token
    itl_mean_s: float | None = None
    sentence_s: float | None = None  # Responses request -> the first sentence's text
    tts_first_byte_s: float | None = None  # speech request -> first audio byte
    total_s: float | None = None  # upload start -> first audio byte
    error: str | None = None

    def on_target(self, ttft_s: float, itl_s: float) -> bool:
        parts = (self.stt_s, self.ttft_s, self.tts_first_byte_s)
        if self.error is not None or any(p is None or p > ttft_s for p in parts):
            return False
        return self.itl_mean_s is None or self.itl_mean_s <= itl_s


async def _transcribe(session: aiohttp.ClientSession, urls: TurnUrls, audio: bytes) -> str:
    form = aiohttp.FormData()
    form.add_field("model", "tiny-whisper")
    form.add_field("response_format", "json")
    form.add_field("language", "en")
    form.add_field("max_completion_tokens", "16")
    form.add_field("file", audio, filename="a.wav", content_type="audio/wav")
    async with session.post(urls.stt, data=form, headers=dict(urls.headers)) as r:
        body = await r.read()
        if r.status != 200:
            raise RuntimeError(f"transcription: HTTP {r.status}: {body[:200]!r}")
        text = json.loads(body).get("text")
        return text if isinstance(text, str) else ""


async def _respond(session: aiohttp.ClientSession, urls: TurnUrls, heard: str, turn: Turn) -> str:
    """Stream the turn; return its first sentence (the turn is read to its end, as a
    speaker keeps reading while the first sentence is spoken: here it is, before speech
    starts, so the sentence's timing is kept apart in ``sentence_s``)."""
    body = {
        "model": "tiny-llama",
        "input": f"{TURN_PROMPT} {heard}".strip(),
        "max_output_tokens": 32,
        "stream": True,
        "ignore_eos": True,
    }
    sent = time.perf_counter()
    text: list[str] = []
    stamps: list[float] = []
    sentence: str | None = None
    async with session.post(urls.gen, json=body, headers=dict(urls.headers)) as r:
        if r.status != 200:
            raise RuntimeError(f"responses: HTTP {r.status}: {(await r.read())[:200]!r}")
        async for raw in r.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            event = json.loads(line[5:])
            if event.get("type") != "response.output_text.delta":
                continue
            stamps.append(time.perf_counter())
            text.append(str(event.get("delta", "")))
            if sentence is None and sum(map(len, text)) >= FIRST_SENTENCE_CHARS:
                sentence = "".join(text)
                turn.sentence_s = stamps[-1] - sent
    if not stamps:
        raise RuntimeError("responses: no text")
    turn.ttft_s = stamps[0] - sent
    if len(stamps) > 1:
        turn.itl_mean_s = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
    if sentence is None:
        sentence = "".join(text)
        turn.sentence_s = stamps[-1] - sent
    return sentence


async def _speak(session: aiohttp.ClientSession, urls: TurnUrls, sentence: str) -> float:
    body = {"model": "tts-1", "voice": "alloy", "input": sentence, "response_format": "wav"}
    sent = time.perf_counter()
    first: float | None = None
    async with session.post(urls.tts, json=body, headers=dict(urls.headers)) as r:
        if r.status != 200:
            raise RuntimeError(f"speech: HTTP {r.status}: {(await r.read())[:200]!r}")
        async for chunk in r.content.iter_any():
            if chunk and first is None:
                first = time.perf_counter()
    if first is None:
        raise RuntimeError("speech: no audio")
    return first - sent


async def voice_turn(
    session: aiohttp.ClientSession, urls: TurnUrls, audio: bytes, turn: Turn
) -> Turn:
    """Run one turn, filling ``turn`` (also on failure: ``error``)."""
    start = time.perf_counter()
    try:
        heard = await _transcribe(session, urls, audio)
        turn.stt_s = time.perf_counter() - start
        sentence = await _respond(session, urls, heard, turn)
        turn.tts_first_byte_s = await _speak(session, urls, sentence or "Okay.")
        # The turn's answer as heard: up to the first sentence, then its first audio byte.
        assert turn.sentence_s is not None
        turn.total_s = turn.stt_s + turn.sentence_s + turn.tts_first_byte_s
    except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError) as exc:
        turn.error = f"{type(exc).__name__}: {exc}"[:300]
    return turn


async def turns_every(
    session: aiohttp.ClientSession,
    urls: TurnUrls,
    audio: bytes,
    *,
    target: str,
    phase: str,
    round_: int,
    count: int,
    every_s: float,
    start_after_s: float = 0.0,
) -> list[Turn]:
    """``count`` turns started ``every_s`` apart (open loop), after ``start_after_s``."""
    t0 = time.perf_counter() + start_after_s
    tasks = []
    for i in range(count):
        await asyncio.sleep(max(0.0, t0 + i * every_s - time.perf_counter()))
        turn = Turn(target, phase, round_, round(time.perf_counter() - t0, 3))
        tasks.append(asyncio.create_task(voice_turn(session, urls, audio, turn)))
    return list(await asyncio.gather(*tasks))
