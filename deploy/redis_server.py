"""Run ``redis-server`` as a real child process on a loopback port, with append-only persistence.

Shared by the tests (``tests/redis_support.py``) and ``make run`` (``deploy/run_local.py``):
each starts servers of its own, on ports of its own, never the system's Redis service.
Standard library only (``free_port`` and ``stop_process`` come from ``gateway_process``);
the readiness check speaks RESP over a raw socket, so redis-py is not needed.

Usage::

    with RedisServer(Path(".run/redis")) as redis:
        ...  # redis.url is redis://127.0.0.1:PORT/0; redis.command("SET", "k", "v")

``kill()`` (SIGKILL) then ``start()`` or ``restart()`` bring the server back on the same
port and data directory; what the append-only file holds survives (with
``appendfsync="always"`` every acknowledged write, with the default ``"everysec"`` all but
the last second's).
"""

from __future__ import annotations

import fcntl
import functools
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Literal, TypeAlias

from hearthgate.deploy.child import ChildProcess
from hearthgate.deploy.gateway_process import _child_setup, free_port, stop_process

# Besides PATH: Debian's package installs /usr/bin/redis-server; a PATH without the sbin
# directories (a non-root shell) or a local build are covered too.
SEARCH_DIRS: tuple[str, ...] = ("/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin")
INSTALL_HINT = "`make setup` installs it (or: apt-get install redis-server)"
LOG_NAME = "redis.log"
LOCK_NAME = "redis-server.lock"

AppendFsync = Literal["always", "everysec", "no"]
# A decoded RESP reply: simple string, integer, bulk string (None: nil), array.
Reply: TypeAlias = "str | int | bytes | list[Reply] | None"


class RedisServerError(RuntimeError):
    """redis-server is missing, or did not start (the message carries its log's tail)."""


class RedisReplyError(RuntimeError):
    """Redis answered a command with an error reply (``-ERR ...``)."""


def find_redis_server() -> str | None:
    """The ``redis-server`` executable: on PATH, else in one of ``SEARCH_DIRS``; None if
    there is none."""
    found = shutil.which("redis-server")
    if found is not None:
        return found
    for d in SEARCH_DIRS:
        path = Path(d) / "redis-server"
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


def _encode(args: Sequence[str | bytes | int]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def _read_reply(f: IO[bytes]) -> Reply:
    line = f.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("connection closed by Redis in the middle of a reply")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RedisReplyError(rest.decode(errors="replace"))
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = f.read(n + 2)
        if len(data) != n + 2:
            raise ConnectionError("connection closed by Redis in the middle of a reply")
        return data[:-2]
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_read_reply(f) for _ in range(n)]
    raise ConnectionError(f"not a RESP reply: {line[:80]!r}")


def redis_command(port: int, *args: str | bytes | int, timeout: float = 5.0) -> Reply:
    """Send one command to the Redis on 127.0.0.1:``port`` on a new connection; its decoded
    reply. RedisReplyError for an error reply, OSError if it cannot be reached."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(_encode(args))
        with sock.makefile("rb") as f:
            return _read_reply(f)


def ping(port: int, timeout: float = 1.0) -> bool:
    """True when the Redis on 127.0.0.1:``port`` answers ``PING`` with ``+PONG`` (not while
    it still loads its data: that answers ``-LOADING``)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            with sock.makefile("rb") as f:
                return f.readline() == b"+PONG\r\n"
    except OSError:
        return False


def port_free(port: int) -> bool:
    """True when nothing listens on 127.0.0.1:``port`` (it can be bound right now)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


class RedisServer(ChildProcess):
    """One ``redis-server`` listening on 127.0.0.1:``port`` (default: a free port, kept
    across restarts), its files in ``data_dir``: the append-only file (``appendonlydir/``),
    the log (``redis.log``: the server's output, appended to across restarts) and a lock
    file that keeps a second server started here off the same data directory.

    ``appendfsync``: how often the append-only file is synced ("always": every write, for
    tests that kill the server; "everysec" is Redis's default). No RDB snapshots, no
    daemonizing. ``binary``: the executable (default: :func:`find_redis_server`).
    ``extra_args``: more ``--option value`` arguments for redis-server.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        appendfsync: AppendFsync = "everysec",
        binary: str | None = None,
        extra_args: Sequence[str] = (),
        ready_timeout: float = 15.0,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port if port is not None else free_port()
        self.appendfsync = appendfsync
        self.binary = binary
        self.extra_args = list(extra_args)
        self.ready_timeout = ready_timeout
        self.log_path = self.data_dir / LOG_NAME
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._lock: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self, *args: str | bytes | int) -> Reply:
        """Send one command (e.g. ``"SET", "k", "v"``) on a new connection; its reply."""
        return redis_command(self.port, *args)

    def argv(self, binary: str) -> list[str]:
        return [
            binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir),
            "--appendonly",
            "yes",
            "--appendfsync",
            self.appendfsync,
            "--save",
            "",
            "--daemonize",
            "no",
            "--logfile",
            "",  # the server's output, which goes to log_path
            *self.extra_args,
        ]

    def _resolve_binary(self) -> str:
        binary = self.binary if self.binary is not None else find_redis_server()
        if binary is None:
            raise RedisServerError(
                f"redis-server not found (looked on PATH and in {', '.join(SEARCH_DIRS)}): "
                f"{INSTALL_HINT}"
            )
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            raise RedisServerError(f"redis-server {binary} is not an executable: {INSTALL_HINT}")
        return binary

    def _take_lock(self) -> None:
        """Hold ``data_dir/redis-server.lock`` (an exclusive flock) from the first start to
        ``stop()``; the server inherits it, so it stays taken while the server lives."""
        if self._lock is not None:
            return
        lock = (self.data_dir / LOCK_NAME).open("ab")
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            raise RedisServerError(
                f"{self.data_dir} is in use by another redis-server (its {LOCK_NAME} is locked)"
            ) from None
        self._lock = lock

    def start(self) -> str:
        """Start the server and wait until it answers ``PING`` (its append-only file loaded);
        return its URL. On failure the process is stopped and RedisServerError raised, with
        the tail of its log."""
        if self.running:
            return self.url
        binary = self._resolve_binary()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        assert self._lock is not None
        self._log = self.log_path.open("ab")
        # The parent-death signal follows the starting *thread*: only from the main thread.
        on_main = threading.current_thread() is threading.main_thread()
        self._proc = subprocess.Popen(
            self.argv(binary),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.data_dir,
            pass_fds=(self._lock.fileno(),),
            preexec_fn=functools.partial(_child_setup, None, on_main),
        )
        try:
            self._wait_ready()
        except BaseException:
            self._halt(kill=False)
            self._release_lock()
            raise
        return self.url

    def _wait_ready(self) -> None:
        proc = self._proc
        assert proc is not None
        deadline = time.monotonic() + self.ready_timeout
        while True:
            if proc.poll() is not None:
                raise RedisServerError(
                    f"redis-server on :{self.port} exited with {proc.returncode} while "
                    f"starting; the end of {self.log_path}:\n{_tail(self.log_path)}"
                )
            if ping(self.port):
                return
            if time.monotonic() > deadline:
                raise RedisServerError(
                    f"redis-server on :{self.port} did not answer PING within "
                    f"{self.ready_timeout} s; the end of {self.log_path}:\n{_tail(self.log_path)}"
                )
            time.sleep(0.05)

    def _halt(self, *, kill: bool) -> int | None:
        proc, self._proc = self._proc, None
        code = None
        if proc is not None:
            if kill and proc.poll() is None:
                proc.kill()
            stop_process(proc)  # SIGTERM (Redis syncs its append-only file), then SIGKILL
            code = proc.returncode
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def stop(self) -> int | None:
        """Stop the server (SIGTERM, then SIGKILL), release the data directory; its exit
        code (None if it was not running). Idempotent."""
        code = self._halt(kill=False)
        self._release_lock()
        return code

    def kill(self) -> int | None:
        """SIGKILL the server, as a crash would (no final sync); ``start()`` brings it back on
        the same port and data directory, which stays taken meanwhile. Its exit code."""
        return self._halt(kill=True)

    def restart(self) -> str:
        """``stop()`` then ``start()``: same port, same data directory; its URL."""
        self._halt(kill=False)
        return self.start()
