"""Chaos soak, the run itself: load with planned disconnects, worker kills and restarts,
observation of the gateway and the workers, the end-state checks (see loadtests/chaos.py)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from hearthgate.deploy.gateway_process import GatewayProcess
from hearthgate.deploy.vllm_worker import REPO_ROOT, VllmWorker, WorkerError
from hearthgate.loadtests.chaos_client import (
    LoadShape,
    Planned,
    kill_burst,
    new_log,
    plan_arrivals,
    send,
)
from hearthgate.loadtests.chaos_outcomes import (
    KINDS,
    PHASES,
    Check,
    KillEvent,
    RequestLog,
    check_disconnects,
    check_kills,
    check_memory,
    check_no_error_before_streaming,
    check_status,
    check_unaffected,
    check_vllm,
    parse_gateway_counters,
    parse_vllm_gauges,
    parse_vmrss_kb,
    summarize_log,
)
from hearthgate.loadtests.chaos_report import SoakResult

GEN_NAME = "gen0"
EMBED_NAME = "emb0"


@dataclass(frozen=True)
class SoakConfig:
    duration_s: float = 1200.0
    warmup_s: float = 60.0
    seed: int = 1
    kills: int = 2
    kill_at_s: tuple[float, ...] = ()  # default: spread evenly over the duration
    shape: LoadShape = field(default_factory=LoadShape)
    burst: bool = True  # send a few requests just before each kill
    gateway_core: int | None = 1
    start_timeout_s: float = 600.0
    restart_timeout_s: float = 600.0
    post_restart_s: float = 15.0  # load goes on at least this long after the last recovery
    min_up_s: float = 15.0  # a kill waits at least this long after the previous recovery
    request_timeout_s: float = 150.0
    drain_timeout_s: float = 160.0
    settle_s: float = 5.0
    settle_timeout_s: float = 60.0
    max_outstanding: int = 256
    memory_tolerance: float = 0.10
    grace_s: float = 5.0  # after the gateway sees the worker up, still counted as outage
    run_dir: Path = REPO_ROOT / ".run" / "chaos"
    command: str = ""

    def kill_times(self) -> list[float]:
        if self.kill_at_s:
            return sorted(self.kill_at_s)[: self.kills]
        return [round(self.duration_s * (i + 1) / (self.kills + 1), 1) for i in range(self.kills)]


def soak_settings(gen_url: str, embed_url: str) -> dict[str, Any]:
    """Gateway settings of the soak: budgets that make RAG queue (two in flight at most),
    and an embeddings window that always waits a little, so disconnects land inside it.
    RAG does not shed late (``shed_late``, said explicitly): the soak wants its queue, and
    checks that every request away from a kill completes; late shedding's 429s have their
    own tests."""
    return {
        "workers": [
            {
                "name": GEN_NAME,
                "url": gen_url,
                "models": ["tiny-llama"],
                "limits": {
                    "max_in_flight": 24,
                    "max_in_flight_per_class": {"rag": 2},
                    "prefill_token_budget": 2048,
                    "interactive_reserved_slots": 4,
                    "interactive_reserved_prefill_tokens": 512,
                },
            },
            {"name": EMBED_NAME, "url": embed_url, "models": ["minilm"], "role": "embeddings"},
        ],
        "classes": {
            "chat": {"priority": 1, "interactive": True, "ttft_ms": 800, "itl_ms": 80},
            "rag": {"priority": 2, "ttft_ms": 3000, "itl_ms": 150, "shed_late": False},
            "embed": {
                "priority": 3,
                "window": {"min_wait_ms": 30, "max_wait_ms": 60, "max_batch_size": 64},
            },
        },
        "default_class": "chat",
        "rules": [
            {"endpoint": "embeddings", "class": "embed"},
            {"min_prompt_tokens": 400, "class": "rag"},
        ],
        "health": {"interval_s": 0.5, "retry_after_s": 2},
        "limits": {"max_body_bytes": 200_000},
    }


def read_rss_kb(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        return parse_vmrss_kb(Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return None


class Driver:
    """Drives one soak against running workers and gateway (see loadtests/chaos.py)."""

    def __init__(
        self, cfg: SoakConfig, gen: VllmWorker, embed: VllmWorker, gw: GatewayProcess
    ) -> None:
        self.cfg = cfg
        self.gen = gen
        self.embed = embed
        self.gw = gw
        self.t0 = time.perf_counter()
        self.records: list[RequestLog] = []
        self.kills: list[KillEvent] = []
        self.outstanding: set[asyncio.Task[RequestLog]] = set()
        self.kills_done = False
        self.last_up: float | None = None
        self.skipped = 0
        self.max_queued = 0
        self.max_in_flight = 0
        self.rss_samples: list[tuple[float, int]] = []

    def clock(self) -> float:
        return time.perf_counter() - self.t0

    # ----- requests

    def _spawn(self, session: aiohttp.ClientSession, p: Planned, warmup: bool) -> None:
        rec = new_log(p, self.clock(), self.cfg.shape, warmup=warmup)
        self.records.append(rec)
        task = asyncio.create_task(
            send(
                session,
                self.gw.url,
                p,
                rec,
                self.cfg.shape,
                self.clock,
                self.cfg.request_timeout_s,
                functools.partial(self._where, session),
            )
        )
        self.outstanding.add(task)
        task.add_done_callback(self.outstanding.discard)

    async def _prime(self, session: aiohttp.ClientSession) -> None:
        """Every request shape twice, one at a time (vLLM compiles graphs for new shapes)."""
        for round_ in range(2):
            for i, kind in enumerate(KINDS):
                p = Planned(-(100 + 10 * round_ + i), 0.0, kind, text_seed=round_ * 10 + i)
                rec = new_log(p, self.clock(), self.cfg.shape, warmup=True)
                self.records.append(rec)
                await send(session, self.gw.url, p, rec, self.cfg.shape, self.clock, 120.0)

    def _stop_load(self, elapsed: float, measured: bool, duration: float) -> bool:
        if not measured:
            return elapsed >= duration
        cap = duration + self.cfg.kills * self.cfg.restart_timeout_s + self.cfg.post_restart_s
        if elapsed >= cap:
            return True
        if elapsed < duration or not self.kills_done:
            return False
        return self.last_up is None or self.clock() >= self.last_up + self.cfg.post_restart_s

    async def _load(
        self,
        session: aiohttp.ClientSession,
        plan: list[Planned],
        duration: float,
        measured: bool,
    ) -> None:
        start = time.perf_counter()
        for p in plan:
            delay = start + p.at_s - time.perf_counter()
            while delay > 0:
                await asyncio.sleep(min(delay, 1.0))
                if self._stop_load(time.perf_counter() - start, measured, duration):
                    return
                delay = start + p.at_s - time.perf_counter()
            if self._stop_load(time.perf_counter() - start, measured, duration):
                return
            if len(self.outstanding) >= self.cfg.max_outstanding:
                self.skipped += 1
                continue
            self._spawn(session, p, warmup=not measured)

    async def _drain(self) -> None:
        if not self.outstanding:
            return
        _, pending = await asyncio.wait(set(self.outstanding), timeout=self.cfg.drain_timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)

    async def _where(self, session: aiohttp.ClientSession, kind: str) -> str | None:
        """``queued`` when the gateway holds requests of this kind's class, else ``prefill``
        (the request was forwarded; no first event yet); None when /status is silent."""
        st = await self.status(session, timeout=0.5)
        if st is None:
            return None
        # Voice turns come from the soak's app without a rule: its default class, chat.
        cls = "chat" if kind in ("chat", "voice") else "rag"
        queue = (st.get("queues") or {}).get(cls) or {}
        return "queued" if queue.get("depth") else "prefill"

    # ----- observation

    async def _get(
        self, session: aiohttp.ClientSession, url: str, timeout: float = 3.0
    ) -> str | None:
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                return await resp.text() if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, OSError):
            return None

    async def status(
        self, session: aiohttp.ClientSession, timeout: float = 3.0
    ) -> dict[str, Any] | None:
        text = await self._get(session, self.gw.url + "/status", timeout)
        if text is None:
            return None
        try:
            obj = json.loads(text)
        except ValueError:
            return None
        return obj if isinstance(obj, dict) else None

    async def gauges(self, session: aiohttp.ClientSession) -> dict[str, dict[str, float] | None]:
        out: dict[str, dict[str, float] | None] = {}
        for name, worker in ((GEN_NAME, self.gen), (EMBED_NAME, self.embed)):
            text = await self._get(session, worker.url + "/metrics")
            out[name] = None if text is None else parse_vllm_gauges(text)
        return out

    async def _sample(self, session: aiohttp.ClientSession) -> None:
        """Every second: the gateway's queued and in-flight peaks; every 5 s: its RSS."""
        n = 0
        while True:
            st = await self.status(session)
            if st is not None:
                self.max_queued = max(self.max_queued, int(st.get("queued") or 0))
                self.max_in_flight = max(self.max_in_flight, int(st.get("in_flight") or 0))
            if n % 5 == 0:
                kb = read_rss_kb(self.gw.pid)
                if kb is not None:
                    self.rss_samples.append((round(self.clock(), 1), kb))
            n += 1
            await asyncio.sleep(1.0)

    async def _wait_clean(
        self, session: aiohttp.ClientSession
    ) -> tuple[float | None, dict[str, Any] | None, dict[str, dict[str, float] | None]]:
        """Poll until the gateway and the workers hold nothing (or the settle timeout);
        (seconds it took or None, last /status, last gauges)."""
        start = time.perf_counter()
        await asyncio.sleep(self.cfg.settle_s)
        while True:
            st = await self.status(session)
            g = await self.gauges(session)
            if check_status(st).ok and check_vllm(g).ok:
                return time.perf_counter() - start, st, g
            if time.perf_counter() - start > self.cfg.settle_s + self.cfg.settle_timeout_s:
                return None, st, g
            await asyncio.sleep(0.5)

    # ----- kills

    async def _kill_and_restart(self, session: aiohttp.ClientSession, n: int) -> bool:
        if self.cfg.burst:
            for p in kill_burst(1_000_000 + 10 * n, 0.0, self.cfg.seed * 100 + n):
                self._spawn(session, p, warmup=False)
            # Long enough for the gateway to take them in, not for a first token: the long
            # prompts are now queued or in prefill.
            await asyncio.sleep(0.04)
        open_requests = len(self.outstanding)
        no_token = sum(
            1
            for r in self.records
            if r.end_s is None and not r.warmup and r.kind != "embed" and r.first_token_s is None
        )
        pid = self.gen.pid
        if pid is None:
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)  # the API server and its engine process
        killed = self.clock()
        print(f"chaos: t={killed:.1f}s killed the generation worker (pgid {pid})", flush=True)
        await asyncio.to_thread(self.gen.stop, 10.0)  # reap
        self.gen.start()  # from the main thread: it dies with us (PDEATHSIG)
        restarted = self.clock()
        ready: float | None = None
        deadline = time.perf_counter() + self.cfg.restart_timeout_s
        try:
            while time.perf_counter() < deadline:
                if await asyncio.to_thread(self.gen.poll_ready):
                    ready = self.clock()
                    break
                await asyncio.sleep(0.5)
        except WorkerError as err:
            print(f"chaos: the generation worker did not come back: {err}", flush=True)
        up: float | None = None
        while ready is not None and time.perf_counter() < deadline:
            st = await self.status(session)
            workers = {w.get("name"): w.get("up") for w in (st or {}).get("workers", [])}
            if workers.get(GEN_NAME) is True:
                up = self.clock()
                break
            await asyncio.sleep(0.2)
        self.kills.append(KillEvent(killed, restarted, ready, up, open_requests, no_token))
        self.last_up = up
        print(
            f"chaos: worker ready at t={ready}, gateway saw it up at t={up}",
            flush=True,
        )
        return up is not None

    async def _kill_loop(self, session: aiohttp.ClientSession) -> None:
        try:
            for n, at in enumerate(self.cfg.kill_times()):
                if self.last_up is not None:
                    at = max(at, self.last_up + self.cfg.min_up_s)
                delay = at - self.clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                if not await self._kill_and_restart(session, n):
                    break
        finally:
            self.kills_done = True

    # ----- the run

    async def run(self) -> SoakResult:
        cfg = self.cfg
        wall = time.perf_counter()
        started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            print("chaos: priming every request shape", flush=True)
            await self._prime(session)
            warm_plan = plan_arrivals(cfg.shape, cfg.warmup_s, cfg.seed + 1, disconnects=False)
            print(f"chaos: warm-up, {cfg.warmup_s:g} s", flush=True)
            await self._load(session, warm_plan, cfg.warmup_s, measured=False)
            await self._drain()
            await self._wait_clean(session)
            rss_warm = read_rss_kb(self.gw.pid)
            self.t0 = time.perf_counter()
            print(f"chaos: measured run, {cfg.duration_s:g} s, kills at {cfg.kill_times()}")
            horizon = cfg.duration_s + cfg.kills * cfg.restart_timeout_s + cfg.post_restart_s
            plan = plan_arrivals(cfg.shape, horizon, cfg.seed, first_id=0)
            sampler = asyncio.create_task(self._sample(session))
            killer = asyncio.create_task(self._kill_loop(session))
            try:
                await self._load(session, plan, cfg.duration_s, measured=True)
                stopped = self.clock()
                print(f"chaos: load stopped at t={stopped:.1f}s; draining", flush=True)
                await killer  # only ends early when a restart failed
                await self._drain()
            finally:
                for t in (sampler, killer):
                    t.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await t
            settle, status_end, gauges_end = await self._wait_clean(session)
            rss_end = read_rss_kb(self.gw.pid)
            metrics = await self._get(session, self.gw.url + "/metrics")
        checks = self._checks(status_end, gauges_end, rss_warm, rss_end)
        return SoakResult(
            command=cfg.command,
            started=started,
            seed=cfg.seed,
            params=self._params(),
            layout=self._layout(),
            records=self.records,
            kills=self.kills,
            checks=checks,
            rss_warm_kb=rss_warm,
            rss_end_kb=rss_end,
            rss_samples=self.rss_samples,
            status_end=status_end,
            gauges_end=gauges_end,
            settle_s=None if settle is None else round(settle, 1),
            max_queued=self.max_queued,
            max_in_flight=self.max_in_flight,
            skipped=self.skipped,
            log_summary=summarize_log(_read_lines(self.gw.log_path)),
            gateway_counters=parse_gateway_counters(metrics or ""),
            wall_s=time.perf_counter() - wall,
            grace_s=cfg.grace_s,
        )

    def _checks(
        self,
        status: dict[str, Any] | None,
        gauges: dict[str, dict[str, float] | None],
        rss_warm: int | None,
        rss_end: int | None,
    ) -> list[Check]:
        cfg = self.cfg
        measured = [r for r in self.records if not r.warmup]
        phases = PHASES if cfg.shape.disconnect_fraction > 0 else ()
        return [
            check_status(status),
            check_vllm(gauges),
            check_memory(rss_warm, rss_end, cfg.memory_tolerance),
            check_no_error_before_streaming(measured, self.kills, cfg.grace_s),
            check_unaffected(measured, self.kills, cfg.grace_s),
            check_kills(self.kills, cfg.kills),
            check_disconnects(measured, phases),
        ]

    def _params(self) -> dict[str, Any]:
        s = self.cfg.shape
        return {
            "duration_s": self.cfg.duration_s,
            "warmup_s": self.cfg.warmup_s,
            "chat/s": s.chat_rate,
            "RAG/s": s.rag_rate,
            "embedding groups/s": f"{s.embed_rate} x {s.embed_group}",
            "output tokens": s.output_tokens,
            "disconnect fraction": s.disconnect_fraction,
            "kills": self.cfg.kills,
            "RAG groups": f"{s.rag_burst_size} every {s.rag_burst_every_s:g} s"
            if s.rag_burst_every_s
            else "none",
            "burst before kill": self.cfg.burst,
        }

    def _layout(self) -> dict[str, str]:
        core = self.cfg.gateway_core
        return {
            "vLLM generation worker": f"core {self.gen.core} (port {self.gen.port})",
            "vLLM embeddings worker": f"core {self.embed.core} (port {self.embed.port})",
            "gateway": (f"core {core}" if core is not None else "unpinned")
            + f" (port {self.gw.port})",
            "load driver": "cores " + ",".join(map(str, sorted(os.sched_getaffinity(0)))),
            "machine": f"{os.cpu_count()} cores, shared with other users",
        }


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []
