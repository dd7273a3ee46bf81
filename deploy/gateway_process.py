"""Run ``hearthgate serve`` as a real child process on a loopback port, from a settings dict.

Shared by the tests (``tests/support.py``) and the load tests (``loadtests/chaos.py``).
Standard library plus PyYAML (a dependency of the gateway's settings), so both environments
can import it.

Usage::

    with GatewayProcess(settings, name="e2e-gateway", run_dir=Path(".run/tests")) as gw:
        ...  # gw.url answers /healthz; gw.pid is the gateway process (for /proc/PID/status)
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import yaml

from hearthgate.deploy.child import ChildProcess

_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 30.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Block until ``url`` answers with a status below 500; RuntimeError if ``proc`` exits,
    TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status < 500:
                    return
        except urllib.error.HTTPError as err:
            if err.code < 500:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


def _child_setup(core: int | None, die_with_parent: bool) -> None:
    """preexec_fn: pin to ``core``; ask Linux to SIGTERM the child when the thread that
    started it dies (so a killed test run leaves no gateway behind)."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    if die_with_parent:
        with contextlib.suppress(Exception):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout``; reaps the process. Idempotent."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class GatewayProcess(ChildProcess):
    """One ``python -m hearthgate.gateway.cli serve`` process listening on 127.0.0.1:``port``.

    ``settings`` is the settings mapping (its ``listen`` is replaced). The settings file and
    the log (stdout and stderr) go to ``run_dir/{name}-{port}.yaml|.log``. ``core``: pin the
    process to this CPU core. Environment variables ``HEARTHGATE_*`` of this process are not
    passed on, so the settings given are the ones in effect.
    """

    def __init__(
        self,
        settings: Mapping[str, Any],
        *,
        run_dir: Path,
        name: str = "gateway",
        port: int | None = None,
        core: int | None = None,
        ready_timeout: float = 30.0,
    ) -> None:
        self.port = port if port is not None else free_port()
        self.settings: dict[str, Any] = {
            **settings,
            "listen": {"host": "127.0.0.1", "port": self.port},
        }
        self.run_dir = run_dir
        self.name = name
        self.core = core
        self.ready_timeout = ready_timeout
        self.config_path = run_dir / f"{name}-{self.port}.yaml"
        self.log_path = run_dir / f"{name}-{self.port}.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "hearthgate.gateway.cli",
            "serve",
            "--config",
            str(self.config_path),
        ]

    def start(self) -> str:
        """Start the gateway and wait until ``/healthz`` answers; return its URL.
        On failure the process is stopped and the error raised."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.settings))
        self._log = self.log_path.open("ab")
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTHGATE_")}
        core = self.core
        # The parent-death signal follows the starting *thread*: only from the main thread.
        on_main = threading.current_thread() is threading.main_thread()
        self._proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=functools.partial(_child_setup, core, on_main),
        )
        try:
            wait_http(self.url + "/healthz", timeout=self.ready_timeout, proc=self._proc)
        except BaseException:
            self.stop()
            raise
        return self.url

    def stop(self) -> int | None:
        """Stop the process (SIGTERM, then SIGKILL) and close the log; its exit code."""
        proc, self._proc = self._proc, None
        code = None
        if proc is not None:
            stop_process(proc)
            code = proc.returncode
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def kill(self) -> int | None:
        """SIGKILL, as a crash or the OOM killer would: no drain, nothing flushed."""
        proc, self._proc = self._proc, None
        code = None
        if proc is not None:
            proc.kill()
            code = proc.wait(timeout=30)
        if self._log is not None:
            self._log.close()
            self._log = None
        return code
