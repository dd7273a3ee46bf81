"""Finding the local vLLM server behind a loopback URL in /proc, on a fake /proc tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from hearthgate.gateway.vllm_process import (
    listening_inodes,
    local_policy,
    policy_from_argv,
    vllm_server_port,
)

API = ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]


@pytest.mark.parametrize(
    ("argv", "port", "policy"),
    [
        ([*API, "--port", "8001"], 8001, "fcfs"),
        ([*API, "--port=8002", "--scheduling-policy", "priority"], 8002, "priority"),
        ([*API, "--scheduling-policy=priority", "--scheduling-policy", "fcfs"], 8000, "fcfs"),
        (["/usr/bin/vllm", "serve", "m", "--scheduling-policy", "priority"], 8000, "priority"),
        (["vllm", "serve", "--config", "w.yaml", "--port", "9000"], 9000, None),
        (["python", "-m", "hearthgate.deploy.vllm_worker", "--port", "8000"], None, "fcfs"),
        ([*API, "--port", "eighty"], None, "fcfs"),
    ],
)
def test_command_lines(argv: list[str], port: int | None, policy: str | None) -> None:
    assert vllm_server_port(argv) == port
    assert policy_from_argv(argv) == policy


TCP = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
    "timeout inode\n"
    "   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0 0 111 1\n"
    "   1: 0100007F:1F41 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0 0 222 1\n"
    "   2: 0100007F:1F40 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  0 0 333 1\n"
)


def test_listening_inodes_only_listening_sockets_of_the_port() -> None:
    assert listening_inodes([TCP], 8000) == {"111"}
    assert listening_inodes([TCP, ""], 8001) == {"222"}
    assert listening_inodes([TCP], 9000) == set()


def fake_proc(root: Path, procs: dict[int, list[str]], sockets: dict[int, str]) -> Path:
    (root / "net").mkdir(parents=True)
    (root / "net" / "tcp").write_text(TCP)
    for pid, argv in procs.items():
        d = root / str(pid)
        (d / "fd").mkdir(parents=True)
        (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        if pid in sockets:
            (d / "fd" / "3").symlink_to(f"socket:[{sockets[pid]}]")
    (root / "self").mkdir()
    return root


def test_local_policy_reads_the_process_that_holds_the_port(tmp_path: Path) -> None:
    proc = fake_proc(
        tmp_path,
        {
            10: [*API, "--port", "8000", "--scheduling-policy", "priority"],
            # another namespace's vLLM on the same port number, holding no socket of ours
            11: [*API, "--port", "8000"],
            12: [*API, "--port", "8001"],
        },
        {10: "111", 12: "222"},
    )
    assert local_policy("http://127.0.0.1:8000", proc) == ("priority", "command line of pid 10")
    assert local_policy("http://localhost:8001/", proc) == ("fcfs", "command line of pid 12")
    assert local_policy("http://127.0.0.1:8002", proc) is None  # nobody listens there
    assert local_policy("http://vllm-gen:8000", proc) is None  # not this machine


def test_local_policy_unknown_when_options_come_from_a_config_file(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, {7: ["vllm", "serve", "--config", "a.yaml"]}, {7: "111"})
    policy, why = local_policy("http://127.0.0.1:8000", proc) or (None, "")
    assert policy is None and "--config" in why
