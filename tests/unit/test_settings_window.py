"""The per-class batching window in the settings (``classes.<name>.window``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hearthgate.gateway.coalesce import window_policy
from hearthgate.gateway.settings import SettingsError, load_settings

MINIMAL = "workers:\n  - {name: w, url: 'http://127.0.0.1:1', models: [m]}\n"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return p


def test_defaults_interactive_zero_wait_background_windowed(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, MINIMAL))
    voice = window_policy(s.classes["voice"])
    assert voice.max_wait_s == 0 and voice.ttft_s == pytest.approx(0.3)
    embed = window_policy(s.classes["embed"])
    assert embed.max_wait_s == pytest.approx(0.020) and embed.min_wait_s == 0
    assert embed.max_batch_size == 64 and embed.max_batch_tokens == 16384


def test_a_configured_window(tmp_path: Path) -> None:
    text = MINIMAL + (
        "classes:\n"
        "  embed: {priority: 3, ttft_ms: 500, window: {min_wait_ms: 2, max_wait_ms: 40,"
        " max_batch_size: 8, max_batch_tokens: null, ttft_margin_ms: 10}}\n"
        "  chat: {priority: 1, interactive: true}\n"
    )
    s = load_settings(write(tmp_path, text))
    w = window_policy(s.classes["embed"])
    assert (w.min_wait_s, w.max_wait_s, w.max_batch_size) == pytest.approx((0.002, 0.04, 8))
    assert w.max_batch_tokens is None
    assert (w.ttft_s, w.ttft_margin_s) == pytest.approx((0.5, 0.01))


@pytest.mark.parametrize(
    ("window", "key"),
    [
        ("{min_wait_ms: 30, max_wait_ms: 20}", "classes.embed.window"),
        ("{max_batch_size: 0}", "classes.embed.window.max_batch_size"),
        ("{max_wait: 20}", "classes.embed.window.max_wait"),
    ],
)
def test_bad_windows_name_the_key(tmp_path: Path, window: str, key: str) -> None:
    text = MINIMAL + f"classes:\n  embed: {{priority: 3, window: {window}}}\n"
    with pytest.raises(SettingsError) as exc:
        load_settings(write(tmp_path, text))
    assert key in str(exc.value)
