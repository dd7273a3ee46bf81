"""The configured vLLM workers: health state, in-flight counts, and the health-check loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import aiohttp

from gateway.metrics import GatewayMetrics
from gateway.settings import Health, Worker

log = logging.getLogger("hearthgate.workers")


@dataclass
class WorkerState:
    """Mutable run-time state of one worker; only the event loop thread touches it."""

    spec: Worker
    up: bool | None = None  # None until the first check
    in_flight: int = 0
    last_check: float | None = None
    last_error: str | None = None
    consecutive_failures: int = 0
    served: int = field(default=0)

    @property
    def name(self) -> str:
        return self.spec.name


class WorkerPool:
    """Tracks each worker's health and picks one for a model.

    A failed connection marks a worker down at once (passive detection); the periodic
    ``/health`` check brings it back.
    """

    def __init__(
        self,
        workers: list[Worker],
        health: Health,
        metrics: GatewayMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.workers = [WorkerState(w) for w in workers]
        self._health = health
        self._metrics = metrics
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        for w in self.workers:
            metrics.in_flight.labels(w.name).set(0)
            metrics.worker_up.labels(w.name).set(0)

    def for_model(self, model: str) -> list[WorkerState]:
        return [w for w in self.workers if model in w.spec.models]

    def pick(self, model: str, exclude: Collection[str] = ()) -> WorkerState | None:
        """The least-loaded worker serving ``model`` that is not known to be down."""
        candidates = [
            w for w in self.for_model(model) if w.up is not False and w.name not in exclude
        ]
        if not candidates:
            return None
        return min(candidates, key=lambda w: (w.in_flight, w.name))

    def mark_down(self, worker: WorkerState, reason: str) -> None:
        if worker.up is not False:
            log.warning("worker %s marked down: %s", worker.name, reason)
        worker.up = False
        worker.last_error = reason
        self._metrics.worker_up.labels(worker.name).set(0)

    def _mark_up(self, worker: WorkerState) -> None:
        if worker.up is not True:
            log.info("worker %s is up", worker.name)
        worker.up = True
        worker.last_error = None
        worker.consecutive_failures = 0
        self._metrics.worker_up.labels(worker.name).set(1)

    def acquire(self, worker: WorkerState) -> None:
        worker.in_flight += 1
        worker.served += 1
        self._metrics.in_flight.labels(worker.name).set(worker.in_flight)

    def release(self, worker: WorkerState) -> None:
        worker.in_flight -= 1
        self._metrics.in_flight.labels(worker.name).set(worker.in_flight)

    async def check(self, session: aiohttp.ClientSession, worker: WorkerState) -> bool:
        timeout = aiohttp.ClientTimeout(total=self._health.timeout_s)
        try:
            async with session.get(worker.spec.url + "/health", timeout=timeout) as resp:
                ok = resp.status == 200
                reason = f"/health answered {resp.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            ok = False
            reason = f"/health failed: {type(exc).__name__}: {exc}"
        worker.last_check = self._clock()
        if ok:
            self._mark_up(worker)
        else:
            worker.consecutive_failures += 1
            self.mark_down(worker, reason)
        return ok

    async def check_all(self, session: aiohttp.ClientSession) -> None:
        await asyncio.gather(*(self.check(session, w) for w in self.workers))

    async def _loop(self, session: aiohttp.ClientSession) -> None:
        while True:
            try:
                await self.check_all(session)
            except Exception:  # the loop must survive anything a check throws
                log.exception("health check round failed")
            await asyncio.sleep(self._health.interval_s)

    def start(self, session: aiohttp.ClientSession) -> None:
        self._task = asyncio.create_task(self._loop(session), name="worker-health")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def status(self) -> list[dict[str, object]]:
        now = self._clock()
        return [
            {
                "name": w.name,
                "url": w.spec.url,
                "role": w.spec.role,
                "models": list(w.spec.models),
                "up": w.up,
                "in_flight": w.in_flight,
                "served": w.served,
                "last_check_age_s": None if w.last_check is None else round(now - w.last_check, 3),
                "last_error": w.last_error,
            }
            for w in self.workers
        ]
