"""One measurement of `hearthgate bench batch`: C (and the warm-up batch) through the
gateway, D straight to vLLM, A and B (the interactive runs, B with the batch running)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from hearthgate.loadtests import bench
from hearthgate.loadtests.batchbench.client import (
    BatchClient,
    BatchRun,
    _r,
    cancel_all,
    submit_and_poll,
    upload_all,
)
from hearthgate.loadtests.batchbench.rates import done_at, lines_per_s, rate_in_window
from hearthgate.loadtests.records import RequestRecord
from hearthgate.loadtests.report import summarize
from hearthgate.loadtests.runner import Endpoints, prime, run_workload
from hearthgate.loadtests.scenario import Scenario
from hearthgate.loadtests.workload import PlannedRequest

Log = Callable[[str], None]


def _top_error(recs: Sequence[RequestRecord]) -> str | None:
    errors = [r.error for r in recs if r.outcome != "ok" and r.error]
    return max(set(errors), key=errors.count) if errors else None


async def gateway_batch(
    url: str,
    key: str,
    lines: dict[str, list[PlannedRequest]],
    label: str,
    *,
    interval_s: float,
    timeout_s: float,
) -> dict[str, Any]:
    """C (and the warm-up batch): upload, create both batches, poll until they end."""
    async with aiohttp.ClientSession() as session:
        client = BatchClient(session, url, key)
        files = await upload_all(client, lines, label)
        run = await submit_and_poll(client, files, interval_s=interval_s, timeout_s=timeout_s)
    ok = run.all_completed()
    return {
        "lines": run.lines,
        "lines_per_s": _r(lines_per_s(run.lines, run.created_s, run.end_s) if ok else None),
        "seconds": _r(None if run.end_s is None else run.end_s - run.created_s),
        "per_batch": run.per_batch(),
        "polls": len(run.polls),
        **({} if ok else {"error": f"batches ended {run.statuses()}"}),
    }


async def direct_lines(
    scenario: Scenario,
    lines: dict[str, list[PlannedRequest]],
    gen_url: str,
    embed_url: str,
    concurrency: int,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """D: every line straight to its vLLM worker, at most ``concurrency`` in flight per
    endpoint, both endpoints at once (the runner's warm-up sender, which is exactly that)."""
    target = Endpoints(name="direct", base_url=gen_url, embed_url=embed_url)
    ends: dict[str, float] = {}
    recs: dict[str, list[RequestRecord]] = {}

    async def part(ep: str, reqs: list[PlannedRequest]) -> None:
        recs[ep] = await prime(scenario, reqs, target, concurrency=concurrency)
        ends[ep] = clock()

    t0 = clock()
    await asyncio.gather(*(part(ep, reqs) for ep, reqs in lines.items()))
    t1 = max(ends.values())
    n = sum(len(r) for r in lines.values())
    failed = sum(1 for rs in recs.values() for r in rs if r.outcome != "ok")
    return {
        "lines": n,
        "lines_per_s": _r(lines_per_s(n, t0, t1)),
        "seconds": _r(t1 - t0),
        "failed": failed,
        "per_endpoint": {
            ep: {
                "lines": len(reqs),
                "seconds": _r(ends[ep] - t0),
                "lines_per_s": _r(lines_per_s(len(reqs), t0, ends[ep])),
                "failed": sum(1 for r in recs[ep] if r.outcome != "ok"),
                "top_error": _top_error(recs[ep]),
            }
            for ep, reqs in lines.items()
        },
    }


async def interactive_run(
    scenario: Scenario,
    reqs: list[PlannedRequest],
    prime_reqs: list[PlannedRequest],
    endpoints: Endpoints,
    *,
    batch: tuple[str, dict[str, list[PlannedRequest]], str] | None = None,
    lead_s: float = 5.0,
    interval_s: float = 0.5,
    timeout_s: float = 3600.0,
    progress: bool = True,
    log: Log = bench.stderr_log,
    info: dict[str, Any] | None = None,
) -> tuple[bench.TargetOutcome, dict[str, Any]]:
    """A (``batch`` None) or B: the interactive workload through the gateway, warm-up
    requests first, open loop, as ``bench.run_one`` runs it. With ``batch`` = (key, lines,
    label), the batch is uploaded, created ``lead_s`` before the warm-up requests, polled
    throughout and cancelled after the run; E is its lines/s over the arrival window."""
    async with aiohttp.ClientSession() as session:
        client = None
        poller: asyncio.Task[BatchRun] | None = None
        stop = asyncio.Event()
        if batch is not None:
            key, lines, label = batch
            client = BatchClient(session, endpoints.base_url, key)
            files = await upload_all(client, lines, label)
            poller = asyncio.create_task(
                submit_and_poll(
                    client, files, interval_s=interval_s, stop=stop, timeout_s=timeout_s
                )
            )
            await asyncio.sleep(lead_s)
            if poller.done():
                poller.result()  # a failed create raises here
        try:
            primed = await prime(scenario, prime_reqs, endpoints) if prime_reqs else []
            update, close = bench.progress_bar(endpoints.name, len(reqs), progress)
            log(f"batchbench: {endpoints.name}: {len(reqs)} interactive requests")
            t_call = time.perf_counter()
            try:
                result = await run_workload(scenario, reqs, endpoints, progress=update)
            finally:
                close()
        finally:
            stop.set()
        failures = sum(1 for r in primed if r.outcome != "ok")
        outcome = bench.TargetOutcome(endpoints, result, dict(info or {}), failures)
        att = summarize(result, scenario)["interactive"]["attainment"]
        row: dict[str, Any] = {"attainment": att, "prime_failures": failures}
        if poller is not None and client is not None:
            run = await poller
            # run_workload starts its clock 0.2 s after it is called (its lead_s)
            lo = t_call + 0.2
            hi = lo + scenario.duration_s
            ended = max(run.ended_s.values()) if run.ended_s else None
            rate, coverage = rate_in_window(run.polls, lo, hi, ended if run.finished else None)
            top = min(hi, ended) if run.finished and ended is not None else hi
            row.update(
                lines_per_s=_r(rate),
                batch_coverage=round(coverage, 3),
                lines_in_window={
                    ep: round(done_at(p, top) - done_at(p, lo)) for ep, p in run.polls_by.items()
                },
                batch_statuses=run.statuses(),
                per_batch=run.per_batch(),
            )
            await cancel_all(client, run)
    return outcome, row
