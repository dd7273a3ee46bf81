"""The processes of `hearthgate bench batch` (workers, Redis, a fresh gateway per
measurement) and the rounds run on them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp

from hearthgate.deploy.gateway_process import GatewayProcess, wait_http
from hearthgate.deploy.redis_server import RedisServer
from hearthgate.deploy.vllm_worker import VllmWorker
from hearthgate.loadtests import bench
from hearthgate.loadtests.batchbench.lines import BatchShape, plan_lines
from hearthgate.loadtests.batchbench.measure import (
    Log,
    direct_lines,
    gateway_batch,
    interactive_run,
)
from hearthgate.loadtests.matrix import Options, warm_up_fresh_worker
from hearthgate.loadtests.prompts import Calibration
from hearthgate.loadtests.runner import Endpoints
from hearthgate.loadtests.sampler import worker_values
from hearthgate.loadtests.scenario import Scenario
from hearthgate.loadtests.targets import TargetError, TargetsFile
from hearthgate.loadtests.workload import PlannedRequest, plan

ORDER = ("A", "C", "D", "B")
# The interactive runs' names in their own report ({tag}-interactive.md).
RUN_NAMES = {"A": "A-no-batch", "B": "B-with-batch"}


@dataclass
class Rig:
    """What runs for the whole benchmark: workers, Redis, and where things go."""

    gen: VllmWorker
    embed: VllmWorker
    redis: RedisServer
    layout: TargetsFile
    run_dir: Path
    settings: dict[str, Any]  # the gateway's, without redis/listen/workers filled in
    key: str
    log: Log = bench.stderr_log

    def gateway_settings(self) -> dict[str, Any]:
        from hearthgate.loadtests.launcher import Launcher
        from hearthgate.loadtests.targets import TargetSpec

        spec = TargetSpec(
            name="gateway",
            kind="gateway",
            settings={**self.settings, "redis": {"url": self.redis.url}},
        )
        launcher = Launcher(self.layout, need_embed=True, log=self.log)
        return launcher.gateway_settings(spec, {"gen0": self.gen.url}, self.embed.url)

    @contextlib.contextmanager
    def gateway(self) -> Iterator[GatewayProcess]:
        """A fresh gateway on an emptied Redis (no fair-share snapshot carried over)."""
        self.redis.command("FLUSHALL")
        gw = GatewayProcess(
            self.gateway_settings(),
            run_dir=self.run_dir,
            name="batchbench-gateway",
            port=self.layout.gateway_port,
            core=self.layout.gateway_core,
            ready_timeout=60.0,
        )
        try:
            gw.start()
            wait_http(gw.url + "/readyz", timeout=60.0)
            yield gw
        finally:
            gw.stop()

    def endpoints(self, name: str, gw: GatewayProcess) -> Endpoints:
        return Endpoints(
            name=name,
            base_url=gw.url,
            worker_metrics=self.gen.url + "/metrics",
            embed_metrics=self.embed.url + "/metrics",
            gateway_metrics=gw.url + "/metrics",
        )

    def wait_idle(self, timeout_s: float = 180.0) -> float:
        """Wait until neither worker runs or queues a request (what the last measurement
        left, aborted or not); seconds waited."""
        t0 = time.monotonic()
        while True:
            busy = 0.0
            for w in (self.gen, self.embed):
                try:
                    with urllib.request.urlopen(w.url + "/metrics", timeout=5) as resp:
                        vals = worker_values(resp.read().decode())
                except OSError:
                    busy += 1
                    continue
                busy += vals.get("vllm:num_requests_running", 0.0)
                busy += vals.get("vllm:num_requests_waiting", 0.0)
            waited = time.monotonic() - t0
            if busy == 0:
                return waited
            if waited > timeout_s:
                self.log(f"batchbench: workers still busy after {timeout_s:g} s; going on")
                return waited
            time.sleep(0.5)


def _check_ports(layout: TargetsFile) -> None:
    from hearthgate.deploy.redis_server import port_free

    ports = [layout.gen_worker.port, layout.embed_worker.port, layout.gateway_port]
    taken = [p for p in ports if not port_free(p)]
    if taken:
        raise TargetError(
            f"ports {taken} are in use (another benchmark running?); this benchmark starts "
            "its own workers and gateway there"
        )


@dataclass
class Plan:
    """Everything a run needs besides the processes."""

    base: Scenario  # the full scenario: apps, keys, batch lines' headers
    inter: Scenario  # its interactive flows
    shape: BatchShape
    repeat: int = 3
    concurrency: int = 64
    batch_lead_s: float = 5.0
    poll_interval_s: float = 0.5
    batch_timeout_s: float = 3600.0
    warmup_lines: int = 200
    restart_warmup_s: float = 20.0
    progress: bool = True


def run_bench(plan_: Plan, rig: Rig) -> dict[str, Any]:
    """Calibrate, warm up, run the rounds; the summary (without outputs written)."""
    log = rig.log
    cal = asyncio.run(bench.calibrate_for(plan_.base, rig.gen.url, rig.embed.url, log))
    inter_reqs = plan(plan_.inter, cal)
    prime_reqs = bench.priming(plan_.inter, cal, True)
    timings: dict[str, float] = {}
    t = time.monotonic()
    with rig.gateway() as gw:
        endpoints = rig.endpoints("warm-up", gw)
        opts = Options(restart_warmup_s=plan_.restart_warmup_s, progress=plan_.progress)
        if plan_.restart_warmup_s > 0:
            warm_up_fresh_worker(plan_.inter, cal, endpoints, opts, log)
        if plan_.warmup_lines > 0:
            shape = replace(plan_.shape, lines=plan_.warmup_lines)
            lines = plan_lines(shape, plan_.base, cal, "warm-up")
            log(f"batchbench: warm-up batch of {plan_.warmup_lines} lines")
            got = asyncio.run(
                gateway_batch(
                    gw.url,
                    rig.key,
                    lines,
                    "warm-up",
                    interval_s=plan_.poll_interval_s,
                    timeout_s=plan_.batch_timeout_s,
                )
            )
            log(f"batchbench: warm-up batch: {got['lines_per_s']} lines/s")
    timings["warm_up_s"] = round(time.monotonic() - t, 1)
    rounds: list[dict[str, Any]] = []
    outcomes: dict[str, list[bench.TargetOutcome]] = {"A": [], "B": []}
    for rnd in range(plan_.repeat):
        row: dict[str, Any] = {"round": rnd + 1}
        for step in ORDER:
            waited = rig.wait_idle()
            label = f"r{rnd + 1}-{step}"
            log(f"batchbench: round {rnd + 1}: {step} (workers idle after {waited:.1f} s)")
            t = time.monotonic()
            try:
                row[step] = _measure(step, label, rnd, plan_, rig, cal, inter_reqs, prime_reqs)
            except (RuntimeError, TimeoutError, OSError, aiohttp.ClientError, ValueError) as err:
                row[step] = {"error": f"{type(err).__name__}: {err}"[:500]}
                log(f"batchbench: {label} failed: {row[step]['error']}")
            outcome = row[step].pop("_outcome", None)
            if outcome is not None:
                outcomes[step].append(outcome)
            row[step]["wall_s"] = round(time.monotonic() - t, 1)
            log(f"batchbench: {label}: {json.dumps(_brief(row[step]))}")
        rounds.append(row)
    return {
        "calibration": cal.to_json(),
        "timings": timings,
        "rounds": rounds,
        "outcomes": {RUN_NAMES[k]: v for k, v in outcomes.items() if v},
        "inter_reqs": inter_reqs,
        "cal": cal,
    }


def _brief(row: dict[str, Any]) -> dict[str, Any]:
    keep = ("attainment", "lines_per_s", "seconds", "batch_coverage", "failed", "error")
    return {k: row[k] for k in keep if k in row}


def _measure(
    step: str,
    label: str,
    rnd: int,
    plan_: Plan,
    rig: Rig,
    cal: Calibration,
    inter_reqs: list[PlannedRequest],
    prime_reqs: list[PlannedRequest],
) -> dict[str, Any]:
    if step == "D":
        lines = plan_lines(plan_.shape, plan_.base, cal, label)
        return asyncio.run(
            direct_lines(plan_.base, lines, rig.gen.url, rig.embed.url, plan_.concurrency)
        )
    with rig.gateway() as gw:
        if step == "C":
            lines = plan_lines(plan_.shape, plan_.base, cal, label)
            return asyncio.run(
                gateway_batch(
                    gw.url,
                    rig.key,
                    lines,
                    label,
                    interval_s=plan_.poll_interval_s,
                    timeout_s=plan_.batch_timeout_s,
                )
            )
        batch = None
        if step == "B":
            batch = (rig.key, plan_lines(plan_.shape, plan_.base, cal, label), label)
        info = {
            "kind": "gateway",
            "describe": "gateway" + (", batch running" if batch else ", no batch"),
            "round": rnd + 1,
        }
        outcome, row = asyncio.run(
            interactive_run(
                plan_.inter,
                inter_reqs,
                prime_reqs,
                rig.endpoints(RUN_NAMES[step], gw),
                batch=batch,
                lead_s=plan_.batch_lead_s,
                interval_s=plan_.poll_interval_s,
                timeout_s=plan_.batch_timeout_s,
                progress=plan_.progress,
                log=rig.log,
                info=info,
            )
        )
        row["_outcome"] = outcome
        return row
