"""Run several workloads against several targets, bringing each target up through the
launcher: the engine behind `compare` (one workload, rounds interleaved over targets) and
`sweep` (several rates, target-major so each target's workers start once)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

from hearthgate.loadtests import bench
from hearthgate.loadtests.launcher import Launcher
from hearthgate.loadtests.prompts import Calibration
from hearthgate.loadtests.runner import Endpoints
from hearthgate.loadtests.scenario import Scenario, ScenarioError
from hearthgate.loadtests.targets import TargetsFile, TargetSpec
from hearthgate.loadtests.workload import PlannedRequest, plan


@dataclass(frozen=True)
class Options:
    prime: bool = True
    prime_rounds: int = 1
    calibrate: bool = True
    tokenize_url: str | None = None
    progress: bool = True
    # After a worker (re)start, this many seconds of the workload are run and thrown away:
    # a fresh CPU worker is much slower for its first minute (VLLM_CPU.md). 20 s was too
    # short: the first point after a start gave 172-174 background tok/s at home-mix x4
    # where later rounds gave 262-296 (loadtests/results/chunks.md).
    restart_warmup_s: float = 45.0


@dataclass(frozen=True)
class Cell:
    """One run: a point (workload label) against a target in a round."""

    point: str
    target: str
    round: int
    outcome: bench.TargetOutcome


def _base(url: str | None) -> str | None:
    return url.removesuffix("/metrics") if url else None


def _app_env(sc: Scenario) -> dict[str, str]:
    return {a.key_env: a.resolve_key(n) for n, a in sc.apps.items() if a.key_env}


def points_env(points: list[tuple[str, Scenario]]) -> dict[str, str]:
    """The key variables of every point's apps: one gateway serves the apps of all points
    (the first point's alone left the others' keys unset: 401 for all their requests)."""
    env: dict[str, str] = {}
    for _, sc in points:
        env.update(_app_env(sc))
    return env


T = TypeVar("T")


Order = Literal["round-major", "target-major"]


def run_order(targets: list[T], rounds: int, order: Order) -> list[tuple[int, T]]:
    """(round, target) in the order they run. round-major rotates the targets by one each
    round, so over as many rounds as targets each takes every place once: the box drifts
    over a round's blocks of runs, and the same target first every round would get the same
    side of that drift every time."""
    n = len(targets)
    if order == "round-major":
        return [(r, targets[(r + i) % n]) for r in range(rounds) for i in range(n)]
    return [(r, t) for t in targets for r in range(rounds)]


def run_matrix(
    points: list[tuple[str, Scenario]],
    targets: TargetsFile,
    opts: Options,
    *,
    rounds: int = 1,
    order: Order = "round-major",
    launcher_factory: Callable[..., Launcher] = Launcher,
    log: bench.Log = bench.stderr_log,
    on_cell: Callable[[list[Cell], Calibration], None] | None = None,
) -> tuple[Calibration, dict[str, list[PlannedRequest]], list[Cell]]:
    """Run every (point, target, round). round-major: for each round, each target (rotated
    one place each round, see ``run_order``), each point (compare: targets interleaved).
    target-major: for each target, each round, each point (sweep: a target's workers start
    once). The prompt calibration is measured once, on the first target brought up, and
    shared, so every target gets identical requests. on_cell sees the cells so far after
    each run (a long matrix can save what it has)."""
    first = points[0][1]
    need_embed = any(f.endpoint == "embeddings" for _, sc in points for f in sc.flows)
    cal: Calibration | None = None
    plans: dict[str, list[PlannedRequest]] = {}
    cells: list[Cell] = []
    schedule = run_order(targets.targets, rounds, order)

    def calibration_for(endpoints: Endpoints) -> Calibration:
        if not opts.calibrate:
            return Calibration()
        gen = opts.tokenize_url or _base(endpoints.worker_metrics) or endpoints.base_url
        emb = _base(endpoints.embed_metrics) or endpoints.embed_url
        return asyncio.run(bench.calibrate_for(first, gen, emb, log))

    env = points_env(points)
    with launcher_factory(targets, need_embed=need_embed, env=env) as launcher:
        everywhere = os.sched_getaffinity(0)
        for rnd, spec in schedule:
            os.sched_setaffinity(0, everywhere)  # workers started now must not inherit a pin
            endpoints = launcher.up(spec)
            if targets.client_core is not None:
                os.sched_setaffinity(0, {targets.client_core})
            fresh = launcher.restarted
            if cal is None:
                cal = calibration_for(endpoints)
            if fresh and opts.restart_warmup_s > 0:
                warm_up_fresh_worker(points[0][1], cal, endpoints, opts, log)
            for i, (label, sc) in enumerate(points):
                if i > 0 and spec.gateway_per_point:
                    endpoints = launcher.up(spec)  # the same workers, a new gateway
                if label not in plans:
                    plans[label] = plan(sc, cal)
                # A freshly started worker compiles graphs for new shapes: warm it up longer.
                outcome = bench.run_one(
                    sc,
                    plans[label],
                    endpoints,
                    prime_reqs=bench.priming(sc, cal, opts.prime),
                    prime_rounds=opts.prime_rounds + (1 if fresh else 0),
                    progress=opts.progress,
                    log=log,
                    info=target_info(spec, rnd),
                )
                fresh = False
                cells.append(Cell(label, spec.name, rnd, outcome))
                if on_cell is not None:
                    on_cell(cells, cal)
        os.sched_setaffinity(0, everywhere)
    assert cal is not None
    return cal, plans, cells


def warm_up_fresh_worker(
    sc: Scenario, cal: Calibration, endpoints: Endpoints, opts: Options, log: bench.Log
) -> None:
    """Run `opts.restart_warmup_s` seconds of the workload (another seed) and discard it."""
    try:
        warm = sc.with_overrides(duration_s=opts.restart_warmup_s, warmup_s=0, seed=sc.seed + 1)
    except ScenarioError:
        return  # no flow starts that early: the priming requests will have to do
    log(f"bench: {endpoints.name}: fresh worker, {opts.restart_warmup_s:g} s of load first")
    bench.run_one(
        warm,
        plan(warm, cal),
        endpoints,
        prime_reqs=bench.priming(warm, cal, opts.prime),
        prime_rounds=1,
        progress=opts.progress,
        log=log,
    )


def target_info(spec: TargetSpec, rnd: int) -> dict[str, object]:
    return {
        "kind": spec.kind,
        "describe": spec.description or spec.describe(),
        "worker_args": spec.make_run_args() + list(spec.worker_args),
        "send_priority": spec.send_priority,
        "round": rnd + 1,
        **(
            {"workers": {n: w.model_dump(exclude_none=True) for n, w in spec.workers.items()}}
            if spec.workers
            else {}
        ),
    }
