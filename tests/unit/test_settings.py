"""Settings: YAML plus environment overrides, validated with errors that name the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hearthgate.gateway.settings import SettingsError, load_settings

REPO = Path(__file__).resolve().parents[2]
MINIMAL = "workers:\n  - {name: w, url: 'http://127.0.0.1:1', models: [m]}\n"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return p


def test_example_file_is_valid() -> None:
    s = load_settings(REPO / "deploy" / "settings.example.yaml")
    assert s.listen.port == 8080
    assert s.models() == ["tiny-llama", "minilm", "tiny-whisper", "tiny-rerank", "tts-1"]


def test_defaults_and_url_normalised(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, MINIMAL.replace("1'", "1/'")))
    assert s.workers[0].url == "http://127.0.0.1:1"
    assert s.limits.max_body_bytes == 4 * 1024 * 1024
    assert s.workers[0].role == "general"


def test_env_overrides_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEARTHGATE_LISTEN__PORT", "9123")
    s = load_settings(write(tmp_path, "listen: {host: 0.0.0.0, port: 8000}\n" + MINIMAL))
    assert s.listen.port == 9123
    assert s.listen.host == "0.0.0.0"  # the rest of the file's mapping is kept


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("listen: {port: abc}\n" + MINIMAL, "listen.port"),
        ("listen: {port: 70000}\n" + MINIMAL, "listen.port"),
        ("lsiten: {port: 1}\n" + MINIMAL, "lsiten: unknown key"),
        ("workers: []\n", "workers"),
        ("workers:\n  - {name: w, url: 'ftp://x', models: [m]}\n", "workers.0.url"),
        ("workers:\n  - {name: w, url: 'http://x', models: [m], role: gpu}\n", "workers.0.role"),
        (MINIMAL + "  - {name: w, url: 'http://y', models: [m]}\n", "unique"),
        ("- 1\n- 2\n", "mapping"),
        ("listen: {port: [\n", "not valid YAML"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(write(tmp_path, text))
    assert needle in str(info.value)


def test_missing_file_is_clear(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="cannot read settings file"):
        load_settings(tmp_path / "nope.yaml")


def test_bad_env_value_names_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEARTHGATE_LIMITS__MAX_BODY_BYTES", "lots")
    with pytest.raises(SettingsError, match=r"limits\.max_body_bytes"):
        load_settings(write(tmp_path, MINIMAL))


def test_cli_exits_non_zero_with_the_key(tmp_path: Path) -> None:
    bad = write(tmp_path, "listen: {port: abc}\n" + MINIMAL)
    cmd = [sys.executable, "-m", "hearthgate.gateway.cli", "serve", "--config", str(bad)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "listen.port" in proc.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "hearthgate.gateway.cli", "check", str(write(tmp_path, MINIMAL))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
