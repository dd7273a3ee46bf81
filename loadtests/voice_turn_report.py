"""The voice-turn benchmark's figures and results file (loadtests/voice_turn.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hearthgate.deploy import box
from hearthgate.loadtests.scenario import Scenario
from hearthgate.loadtests.stats import percentile
from hearthgate.loadtests.voice_turn_client import Turn


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
