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
import math
import os
from dataclasses import dataclass
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
from hearthgate.loadtests.voice_turn_client import (
    Turn,
    TurnUrls,
    speech_wav,
    turns_every,
    voice_turn,
)
from hearthgate.loadtests.voice_turn_report import build_summary, render_markdown, write_results
from hearthgate.loadtests.workload import plan, priming_plan

REPO = Path(__file__).resolve().parents[1]


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
