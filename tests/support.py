"""Helpers shared by the integration and end-to-end tests: real servers on loopback ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
RUN_DIR = REPO / ".run" / "tests"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 30.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextmanager
def gateway(settings: dict[str, Any], name: str = "gateway") -> Iterator[str]:
    """Run ``hearthgate serve`` as a real process with ``settings``; yield its base URL."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    port = free_port()
    settings = {**settings, "listen": {"host": "127.0.0.1", "port": port}}
    cfg = RUN_DIR / f"{name}-{port}.yaml"
    cfg.write_text(yaml.safe_dump(settings))
    log = (RUN_DIR / f"{name}-{port}.log").open("wb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTHGATE_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/healthz", proc=proc)
        yield url
    finally:
        _stop(proc)
        log.close()


@contextmanager
def instant_upstream(delay_ms: float = 0.0, args: Sequence[str] = ()) -> Iterator[str]:
    """Run the instant OpenAI-style upstream as a real process; yield its base URL.
    ``args``: more of its command-line options (e.g. ``--served-model``)."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loadtests.instant_upstream",
            "--port",
            str(port),
            "--delay-ms",
            str(delay_ms),
            *args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/health", proc=proc)
        yield url
    finally:
        _stop(proc)


def sse_events(text: str) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order."""
    return [line[len("data: ") :] for line in text.split("\n") if line.startswith("data: ")]
