"""A voice turn under load (issue 55): time from the start of the upload to the first byte
of speech, through the gateway and with vLLM alone, on an idle box and under home-mix x4.

One turn is what Home Assistant's Assist sends: speech to text of ~3 s of audio
(``/v1/audio/transcriptions``), a streamed Responses API turn on the transcript
(``/v1/responses``) read until its first sentence (60 characters, where Home Assistant starts
speaking), then text to speech of that sentence (``/v1/audio/speech``) until its first byte.
Through the gateway every request carries the voice app's key (its default class: voice);
vLLM alone gets the same requests at the same workers directly.

A turn is on target when each of its three requests meets the voice class's first-token
target (the transcript, the turn's first token, the first audio byte: each within
``ttft_s``) and the turn's mean gap between tokens is within ``itl_s``.

What runs where (a 2-core box, as the matrix): the generation worker's whole session on
core 1 at nice 5; the embeddings, speech-to-text and speech servers on core 0 at nice 15;
the gateway and the load generator on core 0. Rounds alternate the targets (vLLM alone,
then the gateway); each round measures idle turns first, then turns every ``every_s``
seconds while home-mix x4 runs.

``hearthgate bench voice-turn`` runs it; results go to ``loadtests/results/<tag>.md`` and
``<tag>.summary.json``.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import os
import time
import wave
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from hearthgate.deploy import box
from hearthgate.deploy.gateway_process import GatewayProcess
from hearthgate.deploy.run_local import gateway_defaults, worker_flags
from hearthgate.deploy.tts_server import TtsServer
from hearthgate.deploy.vllm_worker import VllmWorker, start_all, stop_all
from hearthgate.gateway.settings import Worker
from hearthgate.loadtests.calibrate import calibrate
from hearthgate.loadtests.prompts import Calibration
from hearthgate.loadtests.report import summarize
from hearthgate.loadtests.runner import Endpoints, make_session, prime, run_workload
from hearthgate.loadtests.scenario import Scenario, load_scenario, resolve_scenario_path
from hearthgate.loadtests.stats import percentile
from hearthgate.loadtests.workload import plan, priming_plan

REPO = Path(__file__).resolve().parents[1]
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


def summarize_turns(turns: Sequence[Turn], ttft_s: float, itl_s: float) -> dict[str, Any]:
    """p50 and p99 of each part and of the whole turn, and the share on target."""
    ok = [t for t in turns if t.error is None]

    def pct(key: str, q: float) -> float | None:
        values = [v for t in ok if (v := getattr(t, key)) is not None]
        got = percentile(values, q)
        return None if got is None else round(got, 4)

    out: dict[str, Any] = {"turns": len(turns), "failed": len(turns) - len(ok)}
    for key in ("total_s", "stt_s", "ttft_s", "sentence_s", "tts_first_byte_s", "itl_mean_s"):
        out[key] = {"p50": pct(key, 50), "p99": pct(key, 99)}
    good = sum(t.on_target(ttft_s, itl_s) for t in turns)
    out["on_target_pct"] = round(100 * good / len(turns), 1) if turns else None
    return out


@dataclass(frozen=True)
class Layout:
    """Ports and cores of one run (the load tests' range, 18210-18230)."""

    gen_port: int = 18210
    embed_port: int = 18211
    stt_port: int = 18212
    tts_port: int = 18213
    gateway_port: int = 18220
    gen_core: int = 1
    side_core: int = 0  # embeddings, speech to text, speech, the gateway, the load generator


def start_servers(
    layout: Layout, run_dir: Path
) -> tuple[VllmWorker, VllmWorker, VllmWorker, TtsServer]:
    """The four servers both targets share, started once with make run's flags."""
    run_dir.mkdir(parents=True, exist_ok=True)
    general = Worker(name="gen0", url=f"http://127.0.0.1:{layout.gen_port}", models=["tiny-llama"])
    gen = VllmWorker(
        "gen",
        layout.gen_port,
        layout.gen_core,
        run_dir / "vt-gen.log",
        worker_flags(general),
        nice=5,
    )
    side = layout.side_core
    embed = VllmWorker("embed", layout.embed_port, side, run_dir / "vt-embed.log", nice=15)
    stt = VllmWorker("stt", layout.stt_port, side, run_dir / "vt-stt.log", nice=15)
    tts = TtsServer(layout.tts_port, run_dir / "vt-tts.log", core=side)
    start_all([gen, embed, stt, tts], timeout=600)
    return gen, embed, stt, tts


def gateway_settings(
    gen: VllmWorker, embed: VllmWorker, stt: VllmWorker, tts: TtsServer
) -> dict[str, Any]:
    """The load tests' gateway settings (loadtests/targets/gateway-bench.yaml, under what
    make run gives the gateway on this box) with the four servers as workers."""
    import yaml

    base: dict[str, Any] = dict(gateway_defaults(box.has_avx512()))
    cfg = yaml.safe_load((REPO / "loadtests" / "targets" / "gateway-bench.yaml").read_text())
    base.update(cfg)
    base.pop("worker_limits", None)
    base["workers"] = [
        {"name": "gen0", "url": gen.url, "models": ["tiny-llama"]},
        {"name": "emb0", "url": embed.url, "models": ["minilm"], "role": "embeddings"},
        {"name": "stt0", "url": stt.url, "models": ["tiny-whisper"], "role": "transcription"},
        {"name": "tts0", "url": tts.url, "models": ["tts-1"], "role": "speech"},
    ]
    return base


async def run_round(
    scenario: Scenario,
    cal: Calibration,
    target: Endpoints,
    urls: TurnUrls,
    audio: bytes,
    *,
    round_: int,
    idle_turns: int,
    every_s: float,
) -> tuple[list[Turn], dict[str, Any]]:
    """Idle turns, then turns every ``every_s`` while the scenario runs against ``target``;
    the turns and the background's summary."""
    # The turns have a session of their own: behind the background's connections (a gateway
    # holds each queued request's), a shared client pool would make the turns wait in the
    # load generator, not in the server.
    timeout = aiohttp.ClientTimeout(total=120)
    async with make_session() as load, aiohttp.ClientSession(timeout=timeout) as session:
        await prime(scenario, priming_plan(scenario, cal), target, session=load)
        for _ in range(3):  # warm every shape of the turn up
            await voice_turn(session, urls, audio, Turn(target.name, "warm", round_, 0.0))
        turns = await turns_every(
            session,
            urls,
            audio,
            target=target.name,
            phase="idle",
            round_=round_,
            count=idle_turns,
            every_s=1.0,
        )
        reqs = plan(scenario, cal)
        count = max(1, math.floor((scenario.duration_s - scenario.warmup_s) / every_s) - 1)
        loaded_task = asyncio.create_task(
            turns_every(
                session,
                urls,
                audio,
                target=target.name,
                phase="loaded",
                round_=round_,
                count=count,
                every_s=every_s,
                start_after_s=scenario.warmup_s,
            )
        )
        result = await run_workload(scenario, reqs, target, session=load)
        turns += await loaded_task
    background = summarize(result, scenario)
    return turns, background


def main_run(
    *,
    rounds: int,
    rate_scale: float,
    duration_s: float,
    warmup_s: float,
    idle_turns: int,
    every_s: float,
    out_dir: Path,
    tag: str,
    log: Any = print,
) -> dict[str, Any]:
    """The whole benchmark: servers up, ``rounds`` interleaved rounds, results written."""
    layout = Layout()
    run_dir = REPO / ".run" / "bench"
    scenario = load_scenario(resolve_scenario_path("home-mix")).with_overrides(
        rate_scale=rate_scale, duration_s=duration_s, warmup_s=warmup_s
    )
    voice = scenario.classes["voice"].slo
    ttft_s, itl_s = voice.ttft_s or 0.3, voice.itl_s or 0.05
    audio = speech_wav(3.0)
    for name, app in scenario.apps.items():
        if app.key_env:
            os.environ.setdefault(app.key_env, app.resolve_key(name))
    assistant = scenario.apps["assistant"].resolve_key("assistant")
    log("voice-turn: starting the generation, embeddings, speech-to-text and speech servers")
    gen, embed, stt, tts = start_servers(layout, run_dir)
    gateway = GatewayProcess(
        gateway_settings(gen, embed, stt, tts),
        run_dir=run_dir,
        name="vt-gateway",
        port=layout.gateway_port,
        core=layout.side_core,
    )
    turns: list[Turn] = []
    backgrounds: dict[str, list[dict[str, Any]]] = {"vllm": [], "gateway": []}
    try:
        cal = asyncio.run(_calibrate(gen.url, embed.url))
        gw_url = gateway.start()
        for r in range(rounds):
            for name in ("vllm", "gateway"):
                if name == "vllm":
                    target = Endpoints(
                        name="vllm",
                        base_url=gen.url,
                        embed_url=embed.url,
                        worker_metrics=gen.url + "/metrics",
                    )
                    urls = TurnUrls(
                        stt.url + "/v1/audio/transcriptions",
                        gen.url + "/v1/responses",
                        tts.url + "/v1/audio/speech",
                        {},
                    )
                else:
                    target = Endpoints(
                        name="gateway",
                        base_url=gw_url,
                        worker_metrics=gen.url + "/metrics",
                        gateway_metrics=gw_url + "/metrics",
                    )
                    urls = TurnUrls(
                        gw_url + "/v1/audio/transcriptions",
                        gw_url + "/v1/responses",
                        gw_url + "/v1/audio/speech",
                        {"Authorization": f"Bearer {assistant}"},
                    )
                log(f"voice-turn: round {r + 1}/{rounds}, {name}")
                got, background = asyncio.run(
                    run_round(
                        scenario,
                        cal,
                        target,
                        urls,
                        audio,
                        round_=r,
                        idle_turns=idle_turns,
                        every_s=every_s,
                    )
                )
                turns += got
                backgrounds[name].append(background)
    finally:
        gateway.stop()
        stop_all([gen, embed, stt, tts])
    summary = build_summary(turns, backgrounds, ttft_s, itl_s, rounds=rounds, scenario=scenario)
    summary["scenario"] = f"{scenario.name} x{rate_scale:g}"
    write_results(out_dir, tag, summary, turns)
    return summary


async def _calibrate(gen_url: str, embed_url: str) -> Calibration:
    async with aiohttp.ClientSession() as session:
        return await calibrate(gen_url, "tiny-llama", embed_url, "minilm", session=session)


def _median(values: Sequence[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return None if not got else round(percentile(got, 50) or 0.0, 4)


def _background(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per class, the median over rounds of its on-target share and output tokens/s."""
    out: dict[str, Any] = {}
    for cls in sorted({c for r in runs for c in r.get("classes", {})}):
        rows = [r["classes"][cls] for r in runs if cls in r.get("classes", {})]
        out[cls] = {
            key: _median([row.get(key) for row in rows])
            for key in ("attainment", "output_tokens_per_s", "ttft_p99_s")
            if any(key in row for row in rows)
        }
    return out


def build_summary(
    turns: Sequence[Turn],
    backgrounds: Mapping[str, Sequence[dict[str, Any]]],
    ttft_s: float,
    itl_s: float,
    *,
    rounds: int,
    scenario: Scenario,
) -> dict[str, Any]:
    """Every target's idle and loaded turns (all rounds together), their ratio, and the
    background each target served."""
    out: dict[str, Any] = {
        "scenario": scenario.name,
        "rounds": rounds,
        "voice_targets": {"ttft_s": ttft_s, "itl_s": itl_s},
        "box": box.describe(),
        "targets": {},
    }
    for target in ("vllm", "gateway"):
        mine = [t for t in turns if t.target == target]
        idle = summarize_turns([t for t in mine if t.phase == "idle"], ttft_s, itl_s)
        loaded = summarize_turns([t for t in mine if t.phase == "loaded"], ttft_s, itl_s)
        ratio = {}
        for q in ("p50", "p99"):
            a, b = idle["total_s"][q], loaded["total_s"][q]
            ratio[q] = round(b / a, 2) if a and b else None
        out["targets"][target] = {
            "idle": idle,
            "loaded": loaded,
            "loaded_over_idle": ratio,
            "background": _background(backgrounds.get(target, [])),
        }
    return out


def render_markdown(summary: Mapping[str, Any], command: str) -> str:
    """The results file: what ran, then one table per phase."""
    lines = [
        "# A voice turn under load: speech to text, a Responses turn, speech",
        "",
        f"Command: `{command}`",
        "",
        f"Scenario: {summary['scenario']} as background, {summary['rounds']} interleaved "
        "round(s) (vLLM alone, then the gateway); idle turns first in each round. Box: "
        f"{summary['box'].get('cpu', '?')}. Generation worker's session on core 1 at nice 5; "
        "embeddings, speech-to-text (tiny Whisper, vLLM) and speech (Piper) servers on core 0 "
        "at nice 15; the gateway and the load generator on core 0.",
        "",
        "A turn: ~3 s of audio transcribed, a streamed `/v1/responses` turn read to its first "
        f"60 characters, that sentence spoken (`/v1/audio/speech`, WAV); total = transcript + "
        "first sentence + first audio byte. On target: each of the three within the voice "
        f"first-token target ({summary['voice_targets']['ttft_s'] * 1000:.0f} ms) and the "
        f"turn's mean token gap within {summary['voice_targets']['itl_s'] * 1000:.0f} ms.",
        "",
        "| target | phase | turns (failed) | total p50 / p99 | transcript p50 / p99 | "
        "first token p50 / p99 | first audio byte p50 / p99 | on target |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def ms(part: Mapping[str, Any]) -> str:
        p50, p99 = part["p50"], part["p99"]
        show = [f"{v * 1000:.0f}" if v is not None else "-" for v in (p50, p99)]
        return f"{show[0]} / {show[1]} ms"

    for target, data in summary["targets"].items():
        for phase in ("idle", "loaded"):
            d = data[phase]
            lines.append(
                f"| {target} | {phase} | {d['turns']} ({d['failed']}) | {ms(d['total_s'])} | "
                f"{ms(d['stt_s'])} | {ms(d['ttft_s'])} | {ms(d['tts_first_byte_s'])} | "
                f"{d['on_target_pct']}% |"
            )
    lines += ["", "Loaded over idle (total turn time):", ""]
    for target, data in summary["targets"].items():
        r = data["loaded_over_idle"]
        lines.append(f"- {target}: p50 {r['p50']}x, p99 {r['p99']}x")
    lines += ["", "Background (medians over rounds, per class):", ""]
    lines.append("| target | class | on target | output tok/s | first token p99 |")
    lines.append("|---|---|---|---|---|")
    for target, data in summary["targets"].items():
        for cls, row in data["background"].items():
            share = row.get("attainment")
            p99 = row.get("ttft_p99_s")
            lines.append(
                f"| {target} | {cls} | {'-' if share is None else f'{100 * share:.1f}%'} | "
                f"{row.get('output_tokens_per_s', '-')} | "
                f"{'-' if p99 is None else f'{p99 * 1000:.0f} ms'} |"
            )
    return "\n".join(lines) + "\n"


def write_results(
    out_dir: Path, tag: str, summary: Mapping[str, Any], turns: Sequence[Turn]
) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    command = os.environ.get("HEARTHGATE_BENCH_COMMAND", "hearthgate bench voice-turn")
    (out_dir / f"{tag}.md").write_text(render_markdown(summary, command))
    data = {**summary, "turns": [asdict(t) for t in turns]}
    (out_dir / f"{tag}.summary.json").write_text(json.dumps(data, indent=1) + "\n")


def add_args(p: Any) -> None:
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--rate-scale", type=float, default=4.0, help="home-mix rates x this")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of background load")
    p.add_argument("--warmup", type=float, default=10.0, help="seconds before turns start")
    p.add_argument("--idle-turns", type=int, default=10, help="turns on the idle box a round")
    p.add_argument("--every", type=float, default=2.0, help="seconds between loaded turns")
    p.add_argument("--out", type=Path, default=REPO / "loadtests" / "results")
    p.add_argument("--tag", default="voice-turn")


def run(args: Any) -> int:
    argv = " ".join(
        f"--{k.replace('_', '-')} {v}"
        for k, v in (
            ("rounds", args.rounds),
            ("rate_scale", args.rate_scale),
            ("duration", args.duration),
            ("warmup", args.warmup),
            ("idle_turns", args.idle_turns),
            ("every", args.every),
            ("tag", args.tag),
        )
    )
    os.environ["HEARTHGATE_BENCH_COMMAND"] = f"hearthgate bench voice-turn {argv}"
    summary = main_run(
        rounds=args.rounds,
        rate_scale=args.rate_scale,
        duration_s=args.duration,
        warmup_s=args.warmup,
        idle_turns=args.idle_turns,
        every_s=args.every,
        out_dir=args.out,
        tag=args.tag,
    )
    print(render_markdown(summary, os.environ["HEARTHGATE_BENCH_COMMAND"]))
    return 0
