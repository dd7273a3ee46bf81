"""The command line of `hearthgate bench batch`: its options, the plan they make, and
the run that starts everything, measures and writes the report."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from hearthgate.deploy.redis_server import RedisServer
from hearthgate.deploy.vllm_worker import VllmWorker, start_all, stop_all
from hearthgate.loadtests import bench
from hearthgate.loadtests.batchbench.lines import shape_from
from hearthgate.loadtests.batchbench.report import render
from hearthgate.loadtests.batchbench.rig import Plan, Rig, _check_ports, run_bench
from hearthgate.loadtests.batchbench.summary import build_report
from hearthgate.loadtests.scenario import ScenarioError, load_scenario
from hearthgate.loadtests.targets import REPO_ROOT, load_targets

DEFAULT_OUT = Path("loadtests/results")
DEFAULT_GATEWAY_CONFIG = "loadtests/targets/gateway-defaults.yaml"
INTERACTIVE_WITHOUT = "rag,embed,batch"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", default="home-mix", help="scenario (%(default)s)")
    p.add_argument(
        "--without",
        default=INTERACTIVE_WITHOUT,
        help="classes left out of the interactive runs (%(default)s)",
    )
    p.add_argument("--lines", type=int, default=5000, help="lines per batch run (%(default)s)")
    p.add_argument(
        "--summary-fraction", type=float, default=0.2, help="summary lines (%(default)s)"
    )
    p.add_argument("--summary-endpoint", choices=("chat", "completions"), default="chat")
    p.add_argument("--summary-tokens", type=int, default=32, help="max_tokens of a summary")
    p.add_argument("--concurrency", type=int, default=64, help="D: requests in flight per worker")
    p.add_argument("--repeat", type=int, default=3, help="rounds of A, C, D, B (%(default)s)")
    p.add_argument("--duration", type=float, help="interactive runs: override duration_s")
    p.add_argument("--warmup", type=float, help="interactive runs: override warmup_s")
    p.add_argument("--rate-scale", type=float, help="interactive runs: scale every rate")
    p.add_argument("--seed", type=int, help="override the scenario seed")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (%(default)s)")
    p.add_argument("--tag", default="batch", help="output file prefix (%(default)s)")
    p.add_argument(
        "--layout", default="local", help="targets file whose cores/ports are used (%(default)s)"
    )
    p.add_argument(
        "--gateway-config",
        default=DEFAULT_GATEWAY_CONFIG,
        help="gateway settings (apps, classes, rules; %(default)s)",
    )
    p.add_argument(
        "--worker-arg",
        action="append",
        default=[],
        help="an extra vLLM flag for the gen worker (repeatable; --worker-arg=--flag)",
    )
    p.add_argument(
        "--batch-lead",
        type=float,
        default=5.0,
        help="B: seconds between creating the batch and the interactive warm-up (%(default)s)",
    )
    p.add_argument("--poll-interval", type=float, default=0.5, help="seconds (%(default)s)")
    p.add_argument("--batch-timeout", type=float, default=3600.0, help="seconds per batch run")
    p.add_argument(
        "--warmup-lines", type=int, default=200, help="lines of the warm-up batch (%(default)s)"
    )
    p.add_argument(
        "--restart-warmup",
        type=float,
        default=20.0,
        help="seconds of interactive load after the workers start, discarded (%(default)s)",
    )
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--no-raw", action="store_true", help="do not write raw JSONL records")


def plan_from_args(args: argparse.Namespace) -> Plan:
    from hearthgate.loadtests.cli import _scenario

    base = load_scenario(args.scenario)
    if args.seed is not None:
        base = base.with_overrides(seed=args.seed)
    ns = argparse.Namespace(**{**vars(args), "without_apps": None})
    inter = _scenario(ns)
    if not args.lines >= 1:
        raise ScenarioError("--lines must be at least 1")
    if not 0 <= args.summary_fraction <= 1:
        raise ScenarioError("--summary-fraction must be within [0, 1]")
    if args.concurrency < 1:
        raise ScenarioError("--concurrency must be at least 1")
    shape = shape_from(
        base,
        lines=args.lines,
        summary_fraction=args.summary_fraction,
        summary_endpoint=args.summary_endpoint,
        summary_tokens=args.summary_tokens,
    )
    if shape.app not in base.apps or shape.klass not in base.classes:
        raise ScenarioError(
            f"{base.name}: the batch needs app {shape.app!r} and class {shape.klass!r}"
        )
    return Plan(
        base=base,
        inter=inter,
        shape=shape,
        repeat=args.repeat,
        concurrency=args.concurrency,
        batch_lead_s=args.batch_lead,
        poll_interval_s=args.poll_interval,
        batch_timeout_s=args.batch_timeout,
        warmup_lines=args.warmup_lines,
        restart_warmup_s=args.restart_warmup,
        progress=not args.no_progress,
    )


def write_outputs(
    summary: dict[str, Any],
    got: dict[str, Any],
    plan_: Plan,
    out: Path,
    tag: str,
    *,
    raw: bool,
    plots: bool,
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    outcomes = got["outcomes"]
    if outcomes:
        # The interactive runs' own report (per class, raw records): as `bench compare`.
        s = bench.build_summary(plan_.inter, got["cal"], got["inter_reqs"], outcomes)
        paths += bench.write_outputs(
            out, f"{tag}-interactive", plan_.inter, s, outcomes, write_raw=raw, draw=plots
        )
    js = out / f"{tag}.summary.json"
    js.write_text(json.dumps(summary, indent=1) + "\n")
    md = out / f"{tag}.md"
    md.write_text(render(summary))
    return [js, md, *paths]


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """Ctrl-C and SIGTERM raise KeyboardInterrupt wherever the main thread is, also inside
    an event loop (asyncio.run's own SIGINT handling only cancels its main task, and a
    cancellation can be lost on the way out), so every process is stopped on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def run(args: argparse.Namespace) -> int:
    """`hearthgate bench batch`: start everything, measure, write the report."""
    started = time.monotonic()
    argv = getattr(args, "argv", None) or sys.argv[1:]
    command = "hearthgate bench " + shlex.join(argv)
    plan_ = plan_from_args(args)
    layout = load_targets(args.layout)
    _check_ports(layout)
    settings = yaml.safe_load((REPO_ROOT / args.gateway_config).read_text()) or {}
    for k, v in {a.key_env: a.resolve_key(n) for n, a in plan_.base.apps.items()}.items():
        if k:
            os.environ[k] = v  # the gateway reads the apps' keys from its environment
    key = plan_.base.apps[plan_.shape.app].resolve_key(plan_.shape.app)
    run_dir = (REPO_ROOT / layout.run_dir).resolve()
    gp, ep = layout.gen_worker, layout.embed_worker
    gen = VllmWorker(
        "gen", gp.port, gp.core, run_dir / f"vllm-gen-{gp.port}.log", args.worker_arg, nice=gp.nice
    )
    emb = VllmWorker("embed", ep.port, ep.core, run_dir / f"vllm-embed-{ep.port}.log", nice=ep.nice)
    redis = RedisServer(run_dir / "redis")
    rig = Rig(gen, emb, redis, layout, run_dir, settings, key)
    everywhere = os.sched_getaffinity(0)
    with _interruptible():
        try:
            rig.log(f"batchbench: starting vLLM workers (logs in {run_dir})")
            start_all([gen, emb], timeout=layout.start_timeout_s)
            if layout.client_core is not None:
                os.sched_setaffinity(0, {layout.client_core})
            redis.start()  # after the pin: Redis shares the load generator's core
            rig.log(f"batchbench: Redis {redis.url} in {redis.data_dir}")
            got = run_bench(plan_, rig)
            summary = build_report(
                plan_, rig, got, tag=args.tag, command=command, wall_s=time.monotonic() - started
            )
        finally:
            redis.stop()
            stop_all([gen, emb])
            os.sched_setaffinity(0, everywhere)
    paths = write_outputs(
        summary, got, plan_, args.out, args.tag, raw=not args.no_raw, plots=not args.no_plots
    )
    print(render(summary))
    for p in paths:
        print(f"wrote {p}")
    return 0
