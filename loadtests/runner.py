"""Open-loop runner: send every planned request at its scheduled time, whether or not earlier
ones have finished (no coordinated omission), and sample the servers meanwhile.

One shared aiohttp session with an unbounded connection pool carries every request, so a slow
server shows up as latency, never as the generator holding requests back. The runner records
how late each request actually left (`sent_s - scheduled_s`); the report shows that lag so an
overloaded generator is visible rather than silently closing the loop.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import gc
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import aiohttp

from hearthgate.loadtests.client import execute, new_record
from hearthgate.loadtests.records import RequestRecord, Sample
from hearthgate.loadtests.sampler import Sampler, Source
from hearthgate.loadtests.scenario import Scenario
from hearthgate.loadtests.workload import PlannedRequest

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Endpoints:
    """Where one target takes requests and exposes metrics.

    `base_url` receives every request, except `/v1/embeddings` which goes to `embed_url` when
    set (vLLM alone needs a separate embeddings worker; the gateway routes by itself).
    `headers` are added to every request (after the app's Authorization and class headers, so
    they win). `send_priority` adds each class's vLLM `priority` to generation requests.

    `base_urls` (several vLLM workers, no gateway) is a round-robin split: request i of the
    planned workload (its index in plan order) goes to `base_urls[i % n]` instead of
    `base_url`, the same split on every run. `more_worker_metrics` are the other workers'
    `/metrics`, sampled with `worker_metrics` into one summed `worker` series.
    """

    name: str
    base_url: str
    embed_url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    send_priority: bool = False
    worker_metrics: str | None = None
    embed_metrics: str | None = None
    gateway_metrics: str | None = None
    base_urls: tuple[str, ...] = ()
    more_worker_metrics: tuple[str, ...] = ()

    def url_for(self, req: PlannedRequest, index: int = 0) -> str:
        """Where request `req` goes; `index` is its position in the plan (round-robin)."""
        if req.endpoint == "embeddings" and self.embed_url:
            base = self.embed_url
        elif self.base_urls:
            base = self.base_urls[index % len(self.base_urls)]
        else:
            base = self.base_url
        return base.rstrip("/") + req.path

    def all_urls_for(self, req: PlannedRequest) -> list[str]:
        """Every URL `req` may go to (each worker of a round-robin split, for warm-up)."""
        n = max(1, len(self.base_urls))
        return list(dict.fromkeys(self.url_for(req, i) for i in range(n)))

    def wants_priority(self, req: PlannedRequest) -> bool:
        """Priorities go to generation requests only: embeddings workers run fcfs."""
        return self.send_priority and req.endpoint != "embeddings"

    def sources(self) -> list[Source]:
        out = []
        if self.worker_metrics:
            out.append(Source("worker", self.worker_metrics, "worker", self.more_worker_metrics))
        if self.embed_metrics:
            out.append(Source("embed_worker", self.embed_metrics, "worker"))
        if self.gateway_metrics:
            out.append(Source("gateway", self.gateway_metrics, "gateway"))
        return out


@dataclass
class RunResult:
    """Everything one run against one target produced."""

    target: str
    scenario: str
    records: list[RequestRecord]
    samples: list[Sample]
    started_at: str
    duration_s: float
    warmup_s: float
    sampler_errors: int = 0
    client_cpu_s: float | None = None
    wall_s: float | None = None


def request_headers(scenario: Scenario, target: Endpoints, req: PlannedRequest) -> dict[str, str]:
    key = scenario.apps[req.app].resolve_key(req.app)
    headers = {"Authorization": f"Bearer {key}"}
    headers.update(scenario.classes[req.klass].headers)
    headers.update(target.headers)
    return headers


def make_session(limit: int = 10_000) -> aiohttp.ClientSession:
    """The one client session of a run: a large pool, no total timeout (set per request)."""
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0, force_close=False)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))


async def run_workload(
    scenario: Scenario,
    reqs: list[PlannedRequest],
    target: Endpoints,
    *,
    session: aiohttp.ClientSession | None = None,
    progress: Progress | None = None,
    sample_interval_s: float = 0.5,
    lead_s: float = 0.2,
    clock: Callable[[], float] = time.perf_counter,
) -> RunResult:
    """Send `reqs` open-loop against `target`; return once every request has finished
    (completed, failed or timed out after `scenario.request_timeout_s`)."""
    own = session is None
    sess = make_session() if session is None else session
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    t0 = clock() + lead_s
    sampler = Sampler(
        sess, target.sources(), target=target.name, t0=t0, interval_s=sample_interval_s, clock=clock
    )
    records: list[RequestRecord] = []
    done = 0
    total = len(reqs)

    def finished(_: asyncio.Task[RequestRecord]) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    # Long-lived objects (the plan, prompts) leave the GC's view so collections during the run
    # are short and do not delay timestamps, as vLLM's own benchmark does.
    gc.collect()
    gc.freeze()
    await sampler.first()
    sampler_task = asyncio.create_task(sampler.run())
    tasks: list[asyncio.Task[RequestRecord]] = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    try:
        # `index` (the position in plan order) picks the worker of a round-robin split.
        for index, req in enumerate(sorted(reqs, key=lambda r: (r.scheduled_s, r.id))):
            delay = t0 + req.scheduled_s - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            rec = new_record(req, target.name)
            records.append(rec)
            task = asyncio.create_task(
                execute(
                    sess,
                    rec,
                    url=target.url_for(req, index),
                    body=req.body(
                        send_priority=target.send_priority and req.endpoint != "embeddings"
                    ),
                    headers=request_headers(scenario, target, req),
                    timeout_s=scenario.request_timeout_s,
                    t0=t0,
                    clock=clock,
                )
            )
            task.add_done_callback(finished)
            tasks.append(task)
        await asyncio.gather(*tasks)
        cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        sampler.stop()
        await asyncio.gather(sampler_task, return_exceptions=True)
        gc.unfreeze()
        if own:
            await sess.close()
    return RunResult(
        target=target.name,
        scenario=scenario.name,
        records=records,
        samples=sampler.samples,
        started_at=started,
        duration_s=scenario.duration_s,
        warmup_s=scenario.warmup_s,
        sampler_errors=sampler.errors,
        client_cpu_s=round(cpu_s, 3),
        wall_s=round(wall_s, 3),
    )


async def prime(
    scenario: Scenario,
    reqs: list[PlannedRequest],
    target: Endpoints,
    *,
    session: aiohttp.ClientSession | None = None,
    concurrency: int = 4,
    rounds: int = 1,
) -> list[RequestRecord]:
    """Warm the target up: send every priming request (`rounds` times; to every worker of a
    round-robin split), at most `concurrency` at once, and discard the timings. Returns the
    records so failures can be reported."""
    own = session is None
    sess = make_session() if session is None else session
    sem = asyncio.Semaphore(concurrency)
    t0 = time.perf_counter()

    async def one(req: PlannedRequest, url: str) -> RequestRecord:
        async with sem:
            return await execute(
                sess,
                new_record(req, target.name),
                url=url,
                body=req.body(send_priority=target.wants_priority(req)),
                headers=request_headers(scenario, target, req),
                timeout_s=scenario.request_timeout_s,
                t0=t0,
            )

    try:
        out: list[RequestRecord] = []
        for _ in range(rounds):
            out.extend(
                await asyncio.gather(*(one(r, u) for r in reqs for u in target.all_urls_for(r)))
            )
        return out
    finally:
        if own:
            await sess.close()
