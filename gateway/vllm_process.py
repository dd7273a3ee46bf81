"""The vLLM server process on this machine behind a loopback URL, found in ``/proc``.

``hearthgate check --live`` uses it to tell a local worker's scheduling policy from its
command line, the one place vLLM 0.32 states it without ``VLLM_SERVER_DEV_MODE``. The parsing
(``vllm_server_port``, ``policy_from_argv``, ``listening_inodes``) works on plain values;
``local_policy`` reads a ``/proc`` tree (a folder in tests) and never raises for a process
that comes or goes while it looks.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

Policy = Literal["fcfs", "priority"]


def _option(argv: Sequence[str], name: str) -> str | None:
    """The value of ``--name V`` or ``--name=V`` (the last one wins, as in argparse)."""
    value = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg[len(name) + 1 :]
    return value


def vllm_server_port(argv: Sequence[str]) -> int | None:
    """The port a vLLM OpenAI server command line listens on (None: not such a command)."""
    joined = " ".join(argv)
    if "vllm.entrypoints.openai.api_server" not in joined and not any(
        Path(a).name == "vllm" and i + 1 < len(argv) and argv[i + 1] == "serve"
        for i, a in enumerate(argv)
    ):
        return None
    port = _option(argv, "--port")
    try:
        return int(port) if port is not None else 8000
    except ValueError:
        return None


def policy_from_argv(argv: Sequence[str]) -> Policy | None:
    """The scheduling policy a vLLM command line asks for: fcfs unless it says otherwise;
    None when a ``--config`` file may say it."""
    policy = _option(argv, "--scheduling-policy")
    if policy in ("fcfs", "priority"):
        return policy  # type: ignore[return-value]
    if policy is None and _option(argv, "--config") is None:
        return "fcfs"
    return None


_LOOPBACK = {"localhost", "::1", "0.0.0.0", "::"}


def _is_local(host: str) -> bool:
    return host in _LOOPBACK or host.startswith("127.") or host == socket.gethostname()


def listening_inodes(tables: Sequence[str], port: int) -> set[str]:
    """Socket inodes listening on ``port`` in the text of /proc/net/tcp and tcp6."""
    inodes = set()
    for table in tables:
        for line in table.splitlines()[1:]:
            cols = line.split()
            # sl, local address (hex ip:port), remote, state (0A = LISTEN), ..., inode
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    return inodes


def _holds_any(pid_dir: Path, inodes: set[str]) -> bool | None:
    """Whether the process holds one of the sockets (None: its fds are not ours to read)."""
    wanted = {f"socket:[{i}]" for i in inodes}
    try:
        fds = list((pid_dir / "fd").iterdir())
    except OSError:
        return None
    for fd in fds:
        with contextlib.suppress(OSError):  # closed meanwhile
            if str(fd.readlink()) in wanted:
                return True
    return False


def local_policy(url: str, proc: Path = Path("/proc")) -> tuple[Policy | None, str] | None:
    """The policy on the command line of the vLLM server on this machine that listens on
    ``url``'s port; None when the URL is not local or no such process is visible."""
    parts = urlsplit(url)
    if parts.hostname is None or not _is_local(parts.hostname) or not proc.is_dir():
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    tables = []
    for name in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            tables.append((proc / "net" / name).read_text())
    inodes = listening_inodes(tables, port)
    found: dict[Policy | None, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        argv = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
        # The port on the command line, and (where readable) the listening socket itself:
        # a vLLM of another network namespace may use the same port number.
        if vllm_server_port(argv) != port:
            continue
        if not inodes or _holds_any(entry, inodes) is not False:
            found.setdefault(policy_from_argv(argv), int(entry.name))
    if len(found) != 1:
        return None  # none, or several processes that disagree
    ((policy, pid),) = found.items()
    if policy is None:
        return None, f"pid {pid} reads its options from a --config file"
    return policy, f"command line of pid {pid}"
