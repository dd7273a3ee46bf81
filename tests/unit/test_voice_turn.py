"""The voice-turn benchmark's pure parts (loadtests/voice_turn.py): what counts as on
target, the percentiles, the results file."""

from __future__ import annotations

from hearthgate.gateway.audio import audio_seconds
from hearthgate.loadtests.scenario import load_scenario, resolve_scenario_path
from hearthgate.loadtests.voice_turn_client import Turn, speech_wav
from hearthgate.loadtests.voice_turn_report import (
    build_summary,
    render_markdown,
    summarize_turns,
)


def turn(
    total: float, *, stt: float = 0.1, ttft: float = 0.05, tts: float = 0.1, **kw: object
) -> Turn:
    t = Turn("gateway", "loaded", 0, 0.0, stt_s=stt, ttft_s=ttft, tts_first_byte_s=tts)
    t.sentence_s, t.total_s, t.itl_mean_s = 0.2, total, 0.01
    for k, v in kw.items():
        setattr(t, k, v)
    return t


def test_a_turn_is_on_target_when_each_request_is() -> None:
    assert turn(0.4).on_target(0.3, 0.05)
    assert not turn(0.4, stt=0.31).on_target(0.3, 0.05)
    assert not turn(0.4, tts=0.5).on_target(0.3, 0.05)
    assert not turn(0.4, itl_mean_s=0.06).on_target(0.3, 0.05)
    assert not turn(0.4, error="boom").on_target(0.3, 0.05)
    assert not turn(0.4, ttft=None).on_target(0.3, 0.05)


def test_summary_counts_failures_as_misses_and_takes_percentiles_of_the_rest() -> None:
    turns = [turn(0.1 * (i + 1)) for i in range(9)] + [turn(9.0, error="x")]
    s = summarize_turns(turns, 0.3, 0.05)
    assert (s["turns"], s["failed"]) == (10, 1)
    assert s["total_s"]["p50"] == 0.5 and s["on_target_pct"] == 90.0


def test_results_compare_idle_and_loaded_per_target() -> None:
    idle = [Turn("vllm", "idle", 0, 0.0, 0.1, 0.05, 0.01, 0.2, 0.1, 0.4)]
    loaded = [Turn("vllm", "loaded", 0, 0.0, 0.1, 0.05, 0.01, 0.2, 0.1, 0.8)]
    gw = [Turn("gateway", p, 0, 0.0, 0.1, 0.05, 0.01, 0.2, 0.1, 0.4) for p in ("idle", "loaded")]
    scenario = load_scenario(resolve_scenario_path("home-mix"))
    s = build_summary([*idle, *loaded, *gw], {}, 0.3, 0.05, rounds=1, scenario=scenario)
    assert s["targets"]["vllm"]["loaded_over_idle"]["p50"] == 2.0
    assert s["targets"]["gateway"]["loaded_over_idle"]["p99"] == 1.0
    text = render_markdown(s, "hearthgate bench voice-turn")
    assert "| gateway | loaded | 1 (0) | 400 / 400 ms |" in text


def test_the_uploaded_audio_is_three_seconds() -> None:
    assert audio_seconds(speech_wav(3.0)) == 3.0
