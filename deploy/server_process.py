"""Start, ready and stop an HTTP server run as a child process in a session of its own.

Standard library only: the gateway environment (tests, load tests) imports this module.

``ServerProcess`` holds the lifecycle the vLLM workers (``deploy/vllm_worker.py``) and the
text-to-speech server (``deploy/tts_server.py``) share: the child runs in its own session
(process group), its output appended to a log file; readiness is polled, and a child that
exits first raises WorkerError with the log tail; ``stop()`` ends the whole group, so also
the processes the server started. A started server is stopped by ``stop()``, by leaving the
``with`` block, at interpreter exit (atexit), and, when started from the main thread, if this
process dies (Linux parent-death signal).

``start_all``, ``stop_all`` and ``running`` take any mix of servers; start-up overlaps, so
starting several costs about one start-up time. The helpers ``cpu_set`` and ``move_process``
pin a server to CPUs; ``get_json`` and ``lists_model`` serve readiness probes of
OpenAI-compatible servers.
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
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Self, TypeVar

from hearthgate.deploy.child import ChildProcess

# The repository root: where the servers' venvs (``.venv-*``) and run folders live.
REPO_ROOT = Path(__file__).resolve().parents[1]

_PR_SET_PDEATHSIG = 1


class WorkerError(RuntimeError):
    """A worker could not be started or did not become ready; the message has the log tail."""


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


class ServerProcess(ChildProcess):
    """One HTTP server run as a child process in a session (process group) of its own.

    The shared lifecycle of the vLLM workers and the text-to-speech server: ``start()``
    spawns ``command()`` with ``environment()``, its output appended to ``log_path``;
    ``poll_ready``/``wait_ready`` probe ``check_ready()`` until it is true and raise
    WorkerError (with the log tail) if the process exits first; ``stop()`` ends the whole
    group. A started server is stopped by ``stop()``, by leaving the ``with`` block, at
    interpreter exit (atexit), and, when started from the main thread and
    ``die_with_parent`` is set, if this process dies (Linux parent-death signal).

    Subclasses provide ``command``, ``environment`` and ``check_ready``, and may refine the
    hooks ``_preflight`` (checks and preparation before spawning), ``_cpus`` (CPUs the whole
    session is kept on), ``_workdir``, ``_spawned`` and ``_became_ready``.
    """

    def __init__(
        self,
        kind: str,
        port: int,
        log_path: str | os.PathLike[str],
        *,
        served_model_name: str,
        host: str = "127.0.0.1",
        die_with_parent: bool = True,
    ) -> None:
        self.kind: str = kind
        self.served_model_name = served_model_name
        """The model id the server lists at ``/v1/models`` and answers requests for."""
        self.port = port
        self.host = host
        self.log_path = Path(log_path).resolve()
        self.die_with_parent = die_with_parent
        self.ready_after: float | None = None
        """Seconds from ``start()`` to ready, once ``wait_ready`` succeeded."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._started_at = 0.0
        self._lock = threading.RLock()  # stop() may run from a signal handler
        self.returncode: int | None = None
        """Exit code of the last stopped server process."""

    # ----- configuration (subclasses) -----

    @property
    def url(self) -> str:
        """Base URL without ``/v1``, e.g. ``http://127.0.0.1:18100``."""
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        """The full command line that ``start()`` runs."""
        raise NotImplementedError

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The child's environment, from ``base`` (default ``os.environ``)."""
        raise NotImplementedError

    def check_ready(self) -> bool:
        """One readiness probe of the running server (no exception when it is not up)."""
        raise NotImplementedError

    def _preflight(self) -> None:
        """Prepare what the server needs; WorkerError when it cannot start (a venv or a
        model is missing)."""

    def _cpus(self) -> set[int] | None:
        """The CPUs the whole session is kept on; None: not pinned."""
        return None

    def _workdir(self) -> Path:
        """The child's working directory: beside its log, so stray files land there."""
        return self.log_path.parent

    def _spawned(self, pid: int) -> None:
        """Called with the new process's pid right after it was spawned."""

    def _became_ready(self, pid: int) -> None:
        """Called once, when the first readiness probe succeeded."""

    # ----- lifecycle -----

    def start(self) -> None:
        """Spawn the server (returns at once; see ``wait_ready``). No-op if already running."""
        with self._lock:
            if self.running:
                return
            self._preflight()
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
                cwd=str(self._workdir()),
                start_new_session=True,
                preexec_fn=functools.partial(
                    _child_setup, self._cpus(), self.die_with_parent and on_main
                ),
            )
            self._log = log
            self._spawned(self._proc.pid)
            atexit.register(self.stop)

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
            self._became_ready(proc.pid)
            return True
        return False

    def wait_ready(self, timeout: float = 180.0, interval: float = 0.5) -> float:
        """Block until ready; return seconds from ``start()`` to ready.

        Raises WorkerError (with the log tail) if the process exits or ``timeout`` passes;
        on timeout the server is stopped.
        """
        _wait_all([self], timeout, interval)
        assert self.ready_after is not None
        return self.ready_after

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM the server's process group, SIGKILL what is left after ``timeout``.

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
            # Children (vLLM's engine process) may outlive the leader briefly; give them a
            # moment.
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
            f"{type(self).__name__}(kind={self.kind!r}, url={self.url!r}, pid={self.pid}, {state})"
        )


def get_json(url: str, timeout: float = 2.0) -> object:
    """GET ``url`` and decode its JSON body; OSError or ValueError (a non-200 answer is an
    HTTPError, an OSError) when it cannot."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        if resp.status != 200:
            raise urllib.error.HTTPError(url, resp.status, "not 200", resp.headers, None)
        return json.loads(resp.read())


def lists_model(models: object, name: str) -> bool:
    """True when an OpenAI ``/v1/models`` body lists a model with id ``name``."""
    data = models.get("data") if isinstance(models, dict) else None
    return isinstance(data, list) and any(isinstance(m, dict) and m.get("id") == name for m in data)


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


def start_all(workers: Sequence[ServerProcess], timeout: float = 180.0) -> dict[int, float]:
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


def _wait_all(workers: Sequence[ServerProcess], timeout: float, interval: float = 0.5) -> None:
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


def stop_all(workers: Sequence[ServerProcess], timeout: float = 20.0) -> None:
    """Stop workers: SIGTERM all first so they shut down in parallel, then reap each."""
    for worker in workers:
        if worker.running and worker.pid is not None:
            _signal_group(worker.pid, signal.SIGTERM)
    for worker in workers:
        worker.stop(timeout=timeout)


_Server = TypeVar("_Server", bound=ServerProcess)


@contextlib.contextmanager
def running(workers: Sequence[_Server], timeout: float = 180.0) -> Iterator[list[_Server]]:
    """Context manager: ``start_all`` on entry, ``stop_all`` on exit."""
    start_all(workers, timeout=timeout)
    try:
        yield list(workers)
    finally:
        stop_all(workers)
