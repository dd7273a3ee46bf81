"""Settings reload under load, with real vLLM and a real gateway process: SIGHUP, then
``hearthgate reload``, each while streams run. A class's priority and an app's key change;
not one request fails, and the changes hold at once."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import httpx
import pytest
import yaml

from hearthgate.deploy.gateway_process import GatewayProcess
from tests.e2e.conftest import Workers
from tests.support import RUN_DIR, sse_events

pytestmark = pytest.mark.e2e

GEN = "tiny-llama"
HEARTHGATE = [sys.executable, "-m", "hearthgate.gateway.cli"]
FAMILY, GUEST_OLD, GUEST_NEW = "family-key-1", "guest-key-1", "guest-key-2"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def settings(workers: Workers, guest_key: str, rag_priority: int) -> dict[str, Any]:
    return {
        "workers": [{"name": "gen0", "url": workers.gen.url, "models": [GEN]}],
        "health": {"interval_s": 0.5},
        "classes": {
            "voice": {"priority": 0, "interactive": True, "ttft_ms": 300, "itl_ms": 50},
            "chat": {"priority": 1, "interactive": True, "ttft_ms": 800, "itl_ms": 80},
            "rag": {"priority": rag_priority, "ttft_ms": 3000, "itl_ms": 150},
            "embed": {"priority": 3},
            "batch": {"priority": 4},
        },
        "apps": [
            {"name": "family", "key_sha256": sha(FAMILY), "may_choose_class": ["chat", "rag"]},
            {"name": "guest", "key_sha256": sha(guest_key)},
        ],
    }


async def one(http: httpx.AsyncClient, i: int, cls: str) -> str:
    """One streamed request of the family app; its outcome ("ok" or what went wrong)."""
    words = "the family calendar " * (60 if cls == "rag" else 4)
    body = {
        "model": GEN,
        "messages": [{"role": "user", "content": f"{i}: {words}"}],
        "max_tokens": 64,  # streams long enough that one is always open at a reload
        "ignore_eos": True,
        "stream": True,
    }
    headers = {"authorization": f"Bearer {FAMILY}", "x-hearthgate-class": cls}
    try:
        r = await http.post("/v1/chat/completions", json=body, headers=headers)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}"
    if r.status_code != 200:
        return f"{r.status_code} {r.text[:200]}"
    events = sse_events(r.text)
    if not events or events[-1] != "[DONE]" or any('"error"' in e for e in events):
        return f"broken stream: {events[-2:] if events else 'empty'}"
    return "ok"


async def load(url: str, seconds: float, spans: list[tuple[float, float]]) -> Counter[str]:
    """Three chat streams and one RAG stream in a loop for ``seconds``; each request's
    (start, end) wall-clock times go to ``spans``."""
    outcomes: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:

        async def lane(n: int, cls: str) -> None:
            i = 0
            while time.monotonic() < deadline:
                t0 = time.time()
                outcomes[await one(http, n * 1000 + i, cls)] += 1
                spans.append((t0, time.time()))
                i += 1

        await asyncio.gather(*(lane(n, "chat") for n in range(3)), lane(9, "rag"))
    return outcomes


def guest_status(url: str, key: str) -> int:
    body = {"model": GEN, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = httpx.post(
        url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=60,
    )
    return r.status_code


def rag_priority(url: str) -> int:
    return int(httpx.get(url + "/status", timeout=10).json()["queues"]["rag"]["priority"])


def reloaded_at(url: str) -> float:
    """When the gateway last applied its settings (its wall clock, /status)."""
    last = httpx.get(url + "/status", timeout=10).json()["settings"]["last_reload"]
    assert last is not None and last["ok"] is True, last
    return float(last["at"])


def test_reload_under_load_changes_a_priority_and_a_key_with_no_failed_request(
    workers: Workers,
) -> None:
    gw = GatewayProcess(settings(workers, GUEST_OLD, 2), run_dir=RUN_DIR, name="reload")
    with gw:
        url = gw.url
        assert guest_status(url, GUEST_OLD) == 200 and rag_priority(url) == 2
        spans: list[tuple[float, float]] = []

        async def scenario() -> tuple[Counter[str], list[float]]:
            task = asyncio.create_task(load(url, 24.0, spans))
            reloads: list[float] = []
            await asyncio.sleep(6.0)
            # 1: SIGHUP, with rag lifted above chat and the guest's key replaced.
            gw.config_path.write_text(
                yaml.safe_dump({**settings(workers, GUEST_NEW, 0), "listen": gw.settings["listen"]})
            )
            assert gw.pid is not None
            os.kill(gw.pid, signal.SIGHUP)
            await asyncio.sleep(6.0)
            reloads.append(await asyncio.to_thread(reloaded_at, url))
            # 2: `hearthgate reload`, back to rag below chat.
            gw.config_path.write_text(
                yaml.safe_dump({**settings(workers, GUEST_NEW, 2), "listen": gw.settings["listen"]})
            )
            cli = await asyncio.to_thread(
                subprocess.run,
                [*HEARTHGATE, "reload", "--config", str(gw.config_path)],
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
            assert cli.returncode == 0, cli.stderr
            assert "reloaded: classes" in cli.stdout
            reloads.append(await asyncio.to_thread(reloaded_at, url))
            return await task, reloads

        def checks() -> list[int]:
            return [rag_priority(url), guest_status(url, GUEST_OLD), guest_status(url, GUEST_NEW)]

        # Between the two reloads, check that the first one took (from a thread, so the
        # load goes on).
        async def with_checks() -> tuple[Counter[str], list[float], list[int], list[int]]:
            run = asyncio.create_task(scenario())
            await asyncio.sleep(8.0)
            mid = await asyncio.to_thread(checks)
            outcomes, reloads = await run
            return outcomes, reloads, mid, checks()

        outcomes, reloads, mid, end = asyncio.run(with_checks())
        log = gw.log_path.read_text()
    assert set(outcomes) == {"ok"}, outcomes  # not one request failed
    assert outcomes["ok"] >= 20, outcomes
    for at in reloads:  # each reload happened while requests were open, and they ended well
        open_then = [t0 for t0, t1 in spans if t0 < at < t1]
        assert open_then, f"no request was open at the reload at {at}: {sorted(spans)[:5]}"
    assert mid == [0, 401, 200], mid  # after SIGHUP: rag lifted, old key refused, new works
    assert end == [2, 401, 200], end  # after `hearthgate reload`: rag back below chat
    assert log.count("settings reloaded from") == 2, log[-2000:]
