"""The Batch API's running parts: the Redis client, the file and batch stores, the runner,
the fair-share snapshots and the metrics; built only when ``redis.url`` is set."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import RedisError

from hearthgate.gateway.batches.files import FileStore
from hearthgate.gateway.batches.keys import Keys
from hearthgate.gateway.batches.runner import BatchRunner
from hearthgate.gateway.batches.store import BatchStore
from hearthgate.gateway.classify import ANONYMOUS
from hearthgate.gateway.errors import NoWorkerAvailable
from hearthgate.gateway.settings import Settings

if TYPE_CHECKING:
    from hearthgate.gateway.core import Gateway

log = logging.getLogger("hearthgate.batch")

NOT_CONFIGURED = (
    "the Batch and Files API needs Redis: set redis.url in the settings file (for example "
    "redis: {url: redis://127.0.0.1:6379/0}; `make run` starts a local one)"
)


class BatchService:
    def __init__(self, settings: Settings, gateway: Gateway) -> None:
        self.settings = settings
        self.gw = gateway
        cfg = settings.redis
        assert cfg.url is not None
        # A blocking pool: when every connection is busy (many batch lines ending at
        # once) a command waits for one, up to timeout_s, instead of raising
        # MaxConnectionsError, which would read as "Redis down" (redis-py's plain pool
        # refuses the 101st concurrent command).
        pool = BlockingConnectionPool.from_url(
            cfg.url,
            max_connections=cfg.max_connections,
            timeout=cfg.timeout_s,
            decode_responses=True,
            socket_timeout=cfg.timeout_s,
            socket_connect_timeout=cfg.timeout_s,
        )
        self.redis = Redis(connection_pool=pool)
        keys = Keys(cfg.key_prefix)
        retention_s = settings.batch.retention_hours * 3600
        self.files = FileStore(self.redis, keys, retention_s)
        self.store = BatchStore(self.redis, keys, self.files, retention_s)
        self.runner = BatchRunner(gateway, self.store, self.files, settings)
        self._fair_task: asyncio.Task[None] | None = None
        self._saved_tokens: dict[str, tuple[int, int]] = {}
        self.lifetime_tokens: dict[str, dict[str, int]] = {}
        gateway.metrics.registry.register(BatchCollector(self))

    @property
    def fairness_key(self) -> str:
        return f"{self.settings.redis.key_prefix}fairness"

    async def start(self) -> None:
        try:
            await self.restore_fairness()
        except (RedisError, OSError) as exc:
            log.warning("fair-share counters not restored, Redis unreachable: %s", exc)
        self.runner.start()
        self._fair_task = asyncio.create_task(self._snapshots(), name="fairness-snapshots")

    async def stop(self) -> None:
        if self._fair_task is not None:
            self._fair_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._fair_task
        await self.runner.stop()
        with contextlib.suppress(RedisError, OSError):
            await self.save_fairness()
        with contextlib.suppress(RedisError, OSError):
            await self.redis.aclose(close_connection_pool=True)

    # ------------------------------------------------------------ fair shares

    @property
    def tokens_key(self) -> str:
        return f"{self.settings.redis.key_prefix}app_tokens"

    async def save_fairness(self) -> None:
        """Write the fair-share counters (one JSON string: floats stay exact) and add the
        tokens served since the last save to each app's lifetime totals."""
        snap = self.gw.scheduler.fairness_snapshot()
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.fairness_key, json.dumps(snap))
            sent: list[tuple[str, int, int]] = []
            for app, (prompt, completion) in self.gw.app_tokens.items():
                p0, c0 = self._saved_tokens.get(app, (0, 0))
                if prompt > p0:
                    pipe.hincrby(self.tokens_key, f"{app}:prompt", prompt - p0)
                if completion > c0:
                    pipe.hincrby(self.tokens_key, f"{app}:completion", completion - c0)
                sent.append((app, prompt, completion))
            pipe.hgetall(self.tokens_key)
            *_, totals = await pipe.execute()
        for app, prompt, completion in sent:
            self._saved_tokens[app] = (prompt, completion)
        self.lifetime_tokens = _tokens_by_app(totals)

    async def restore_fairness(self) -> None:
        """Before the first request: a restarted gateway does not hand a heavy app a fresh
        start (policies: Scheduler.restore_fairness)."""
        raw = await self.redis.get(self.fairness_key)
        self.lifetime_tokens = _tokens_by_app(await self.redis.hgetall(self.tokens_key))
        if not raw:
            return
        try:
            snap = json.loads(raw)
        except ValueError:
            log.warning("ignoring a malformed fair-share snapshot in Redis")
            return
        self.gw.scheduler.restore_fairness(snap, extra_tenants=[ANONYMOUS])
        log.info("fair-share counters restored from Redis")

    async def _snapshots(self) -> None:
        every = self.settings.redis.fairness_snapshot_s
        while True:
            await asyncio.sleep(every)
            # Redis down: the runner reports it; the next snapshot catches up.
            with contextlib.suppress(RedisError, OSError):
                await self.save_fairness()

    # ------------------------------------------------------------ for the endpoints

    @contextlib.asynccontextmanager
    async def guard(self) -> AsyncIterator[None]:
        """Around calls to ``files`` and ``store``: Redis failures become 503 + Retry-After."""
        try:
            yield
        except (RedisError, OSError) as exc:
            raise NoWorkerAvailable(
                f"the batch store (Redis) is unreachable ({type(exc).__name__}); batches "
                "and files are paused, live requests are served; retry shortly",
                retry_after_s=5,
                code="batch_store_unavailable",
            ) from None

    def redis_state(self) -> str:
        return {True: "up", False: "down", None: "unknown"}[self.runner.redis_up]


class BatchCollector(Collector):
    """Gauges read from the runner at scrape time."""

    def __init__(self, service: BatchService) -> None:
        self.service = service

    def collect(self) -> Iterator[GaugeMetricFamily]:
        runner = self.service.runner
        up = GaugeMetricFamily(
            "hearthgate_redis_up", "Whether the batch store (Redis) answered the last time"
        )
        up.add_metric([], 1.0 if runner.redis_up else 0.0)
        yield up
        lines = GaugeMetricFamily(
            "hearthgate_batch_lines",
            "Lines of the active batches by state (running: in this gateway's scheduler)",
            labels=["state"],
        )
        for state, n in runner.line_states().items():
            lines.add_metric([state], n)
        yield lines
        batches = GaugeMetricFamily(
            "hearthgate_batches", "Active batches by status", labels=["status"]
        )
        counts: dict[str, int] = {
            s: 0 for s in ("validating", "in_progress", "finalizing", "cancelling")
        }
        for b in runner.batches.values():
            counts[b.status] = counts.get(b.status, 0) + 1
        for status, n in counts.items():
            batches.add_metric([status], n)
        yield batches
        eta = GaugeMetricFamily(
            "hearthgate_batch_eta_seconds",
            "Estimated seconds until every active batch is done, at the recent rate "
            "(NaN: no rate yet)",
        )
        now = runner.wall()
        etas = [b.eta_s(now) for b in runner.batches.values()]
        eta.add_metric([], max((e for e in etas if e is not None), default=math.nan))
        yield eta


def _tokens_by_app(fields: Mapping[Any, Any]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for key, value in fields.items():
        app, _, kind = str(key).rpartition(":")
        with contextlib.suppress(ValueError):
            out.setdefault(app, {})[kind] = int(value)
    return out


def describe(service: BatchService | None) -> dict[str, Any]:
    """The ``batches`` part of /status."""
    if service is None:
        return {"enabled": False, "why": NOT_CONFIGURED}
    return {
        "enabled": True,
        **service.runner.status(),
        "app_tokens_lifetime": service.lifetime_tokens,
    }
