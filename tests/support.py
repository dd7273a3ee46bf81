"""Helpers shared by the integration and end-to-end tests: real servers on loopback ports."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hearthgate.deploy.gateway_process import GatewayProcess, free_port, stop_process, wait_http

REPO = Path(__file__).resolve().parents[1]
RUN_DIR = REPO / ".run" / "tests"


@contextmanager
def gateway(settings: dict[str, Any], name: str = "gateway") -> Iterator[str]:
    """Run ``hearthgate serve`` as a real process with ``settings``; yield its base URL."""
    with GatewayProcess(settings, run_dir=RUN_DIR, name=name) as gw:
        yield gw.url


@contextmanager
def instant_upstream(delay_ms: float = 0.0, args: Sequence[str] = ()) -> Iterator[str]:
    """Run the instant OpenAI-style upstream as a real process; yield its base URL.
    ``args``: more of its command-line options (e.g. ``--served-model``)."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hearthgate.loadtests.instant_upstream",
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
        stop_process(proc)


def sse_events(text: str) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order."""
    return [line[len("data: ") :] for line in text.split("\n") if line.startswith("data: ")]
