"""Graceful shutdown of a real ``hearthgate serve`` process (SIGTERM) on loopback, in front
of the instant upstream streaming slowly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import yaml

from tests.support import RUN_DIR, free_port, instant_upstream, sse_events, wait_http


def test_sigterm_drains_then_cuts_streams_with_an_error_event() -> None:
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    with instant_upstream(delay_ms=100) as upstream:
        port = free_port()
        cfg = RUN_DIR / f"shutdown-{port}.yaml"
        settings = {
            "listen": {"host": "127.0.0.1", "port": port},
            "workers": [{"name": "w0", "url": upstream, "models": ["m"]}],
            "shutdown": {"drain_s": 1.5},
        }
        cfg.write_text(yaml.safe_dump(settings))
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTHGATE_")}
        log = (RUN_DIR / f"shutdown-{port}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "hearthgate.gateway.cli", "serve", "--config", str(cfg)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http(url + "/readyz", proc=proc)
            body = {"model": "m", "prompt": "x", "max_tokens": 200, "stream": True}
            lines: list[str] = []
            first = threading.Event()

            def stream() -> None:
                with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
                    for line in r.iter_lines():
                        lines.append(line)
                        first.set()

            reader = threading.Thread(target=stream)
            reader.start()
            assert first.wait(10)
            proc.send_signal(signal.SIGTERM)
            # While draining the gateway still listens: not ready, new work refused.
            deadline = time.monotonic() + 5
            while True:
                ready = httpx.get(url + "/readyz", timeout=5)
                if ready.status_code == 503 or time.monotonic() > deadline:
                    break
            assert ready.status_code == 503 and "retry-after" in ready.headers
            new = httpx.post(url + "/v1/completions", json={**body, "stream": False}, timeout=5)
            assert new.status_code == 503
            assert new.json()["error"]["code"] == "shutting_down"
            assert new.headers["retry-after"]
            reader.join(15)
            assert not reader.is_alive()
            events = sse_events("\n".join(lines) + "\n")
            assert events[-1] == "[DONE]"
            assert json.loads(events[-2])["error"]["code"] == "shutting_down"
            assert 0 < len(events) - 2 < 200  # some tokens, not all of them
            # uvicorn re-raises the signal once it has shut down (exit by SIGTERM)
            assert proc.wait(15) in (0, -signal.SIGTERM)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
            log.close()
