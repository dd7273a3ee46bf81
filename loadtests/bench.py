"""Orchestration shared by the CLI modes: calibrate, warm up, run, summarize, write outputs.

Output layout for a tag (by default the scenario name) in an output folder:

    {out}/{tag}.summary.json     the JSON summary (see `build_summary`)
    {out}/{tag}.md               the markdown report
    {out}/{tag}-ttft-cdf.png     TTFT CDF per class and target (if matplotlib is installed)
    {out}/{tag}-queues.png       worker waiting/running and gateway gauges over time
    {out}/raw/{tag}/{target}.records.jsonl, {target}.samples.jsonl, scenario.json
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from hearthgate.deploy import box
from hearthgate.loadtests import plots
from hearthgate.loadtests.calibrate import calibrate
from hearthgate.loadtests.markdown import render
from hearthgate.loadtests.prompts import Calibration
from hearthgate.loadtests.records import RequestRecord, read_records, read_samples, write_jsonl
from hearthgate.loadtests.repeats import merge_runs
from hearthgate.loadtests.report import summarize
from hearthgate.loadtests.runner import Endpoints, Progress, RunResult, prime, run_workload
from hearthgate.loadtests.scenario import Scenario, validate_scenario
from hearthgate.loadtests.workload import PlannedRequest, describe, plan, priming_plan

Log = Callable[[str], None]


def stderr_log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def progress_bar(
    desc: str, total: int, enabled: bool = True
) -> tuple[Progress, Callable[[], None]]:
    """A progress callback and its closer: tqdm when installed and enabled, else a line
    every 10%."""
    if not enabled:
        return (lambda done, n: None), (lambda: None)
    try:
        from tqdm import tqdm
    except ImportError:
        step = max(1, total // 10)

        def plain(done: int, n: int) -> None:
            if done % step == 0 or done == n:
                stderr_log(f"{desc}: {done}/{n} requests finished")

        return plain, (lambda: None)
    bar = tqdm(total=total, desc=desc, unit="req", file=sys.stderr, leave=False)

    def update(done: int, n: int) -> None:
        bar.update(done - bar.n)

    return update, bar.close


async def calibrate_for(
    scenario: Scenario, gen_url: str | None, embed_url: str | None, log: Log = stderr_log
) -> Calibration:
    """Measure the prompt calibration, falling back to the default when it cannot be."""
    try:
        async with aiohttp.ClientSession() as session:
            cal = await calibrate(
                gen_url,
                scenario.models.completions,
                embed_url,
                scenario.models.embeddings,
                session=session,
            )
    except (aiohttp.ClientError, OSError, RuntimeError, KeyError, ValueError) as err:
        log(f"bench: calibration against {gen_url} failed ({err}); using 1 token per word")
        return Calibration()
    log(f"bench: calibration {json.dumps(cal.to_json()['endpoints'])}")
    return cal


@dataclass
class TargetOutcome:
    """One target's run and what describes it in the summary."""

    endpoints: Endpoints
    result: RunResult
    info: dict[str, Any] = field(default_factory=dict)
    prime_failures: int = 0


def run_one(
    scenario: Scenario,
    reqs: list[PlannedRequest],
    endpoints: Endpoints,
    *,
    prime_reqs: list[PlannedRequest],
    prime_rounds: int = 1,
    progress: bool = True,
    log: Log = stderr_log,
    info: dict[str, Any] | None = None,
) -> TargetOutcome:
    """Warm the target up with `prime_reqs`, then run the workload open-loop."""

    async def go() -> TargetOutcome:
        failures = 0
        if prime_reqs and prime_rounds > 0:
            log(f"bench: {endpoints.name}: warming up ({len(prime_reqs)} x {prime_rounds})")
            primed = await prime(scenario, prime_reqs, endpoints, rounds=prime_rounds)
            bad = [r for r in primed if r.outcome != "ok"]
            failures = len(bad)
            if bad:
                log(
                    f"bench: {endpoints.name}: {failures} warm-up requests failed, e.g. "
                    f"{bad[0].id}: {bad[0].error}"
                )
        update, close = progress_bar(endpoints.name, len(reqs), progress)
        log(f"bench: {endpoints.name}: running {len(reqs)} requests over {scenario.duration_s:g} s")
        try:
            result = await run_workload(scenario, reqs, endpoints, progress=update)
        finally:
            close()
        line = failures_line(endpoints.name, result.records)
        if line is not None:  # say why where it is seen: the summaries keep only counts
            log(line)
        return TargetOutcome(endpoints, result, dict(info or {}), failures)

    return asyncio.run(go())


def failures_line(target: str, records: list[RequestRecord]) -> str | None:
    """How many requests failed (not shed) per flow, and the first one's error; None if
    none did."""
    failed = [r for r in records if r.outcome == "failed"]
    if not failed:
        return None
    per_flow = ", ".join(f"{f} {n}" for f, n in sorted(Counter(r.flow for r in failed).items()))
    return (
        f"bench: {target}: {len(failed)} requests failed ({per_flow}), e.g. "
        f"{failed[0].id}: {failed[0].error}"
    )


def scenario_block(scenario: Scenario, reqs: list[PlannedRequest]) -> dict[str, Any]:
    return {
        "name": scenario.name,
        "description": scenario.description,
        "seed": scenario.seed,
        "duration_s": scenario.duration_s,
        "warmup_s": scenario.warmup_s,
        "flows": describe(scenario, reqs),
    }


def build_summary(
    scenario: Scenario,
    calibration: Calibration,
    reqs: list[PlannedRequest],
    outcomes: dict[str, list[TargetOutcome]],
) -> dict[str, Any]:
    """The JSON summary: `targets[name]` has `run`, `interactive`, `classes[class]` (with
    at least attainment, completed, rejected, failed, ttft_p50_s, ttft_p99_s,
    output_tokens_per_s), `fairness`, `server` and `target` describing it. A target run
    several times is merged (`loadtests.repeats`); its single runs go to `runs[name]`."""
    targets: dict[str, Any] = {}
    runs: dict[str, list[dict[str, Any]]] = {}
    for name, outs in outcomes.items():
        per_run = []
        for o in outs:
            s = summarize(o.result, scenario)
            s["target"] = {
                **o.info,
                "started_at": o.result.started_at,
                "prime_failures": o.prime_failures,
            }
            per_run.append(s)
        targets[name] = merge_runs(per_run)
        if len(per_run) > 1:
            runs[name] = per_run
    summary: dict[str, Any] = {
        "version": 1,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "box": box.describe(),
        "scenario": scenario_block(scenario, reqs),
        "calibration": calibration.to_json(),
        "targets": targets,
    }
    if runs:
        summary["runs"] = runs
    return summary


def _run_key(name: str, i: int, n: int) -> str:
    return name if n == 1 else f"{name}@{i + 1}"


def write_outputs(
    out_dir: Path,
    tag: str,
    scenario: Scenario,
    summary: dict[str, Any],
    outcomes: dict[str, list[TargetOutcome]],
    *,
    write_raw: bool = True,
    draw: bool = True,
) -> list[Path]:
    """Write raw JSONL, plots, the JSON summary and the markdown report; return the paths.
    Each run's records go to `raw/{tag}/{target}[@round].records.jsonl`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    if write_raw:
        raw = out_dir / "raw" / tag
        raw.mkdir(parents=True, exist_ok=True)
        runs: dict[str, Any] = {}
        for name, outs in outcomes.items():
            for i, o in enumerate(outs):
                key = _run_key(name, i, len(outs))
                runs[key] = {
                    **o.info,
                    "target": name,
                    "started_at": o.result.started_at,
                    "prime_failures": o.prime_failures,
                }
                write_jsonl(raw / f"{key}.records.jsonl", o.result.records)
                write_jsonl(raw / f"{key}.samples.jsonl", o.result.samples)
        meta = {
            "scenario": scenario.model_dump(by_alias=True),
            "calibration": summary["calibration"],
            "runs": runs,
        }
        (raw / "scenario.json").write_text(json.dumps(meta, indent=1))
        written.append(raw)
    plot_names: list[str] = []
    if draw and plots.available():
        records = {n: [r for o in outs for r in o.result.records] for n, outs in outcomes.items()}
        samples = {n: outs[0].result.samples for n, outs in outcomes.items() if outs}
        cdf = plots.ttft_cdf(
            records,
            list(dict.fromkeys(f.klass for f in scenario.flows)),
            out_dir / f"{tag}-ttft-cdf.png",
        )
        plot_names.append(cdf.name)
        q = plots.queues_over_time(
            samples, out_dir / f"{tag}-queues.png", (scenario.warmup_s, scenario.duration_s)
        )
        if q is not None:
            plot_names.append(q.name)
        written += [out_dir / p for p in plot_names]
    summary["plots"] = plot_names
    js = out_dir / f"{tag}.summary.json"
    js.write_text(json.dumps(summary, indent=1) + "\n")
    md = out_dir / f"{tag}.md"
    md.write_text(render(summary))
    return [js, md, *written]


def rebuild(raw_dir: Path) -> tuple[Scenario, dict[str, Any], dict[str, list[TargetOutcome]]]:
    """Re-read a raw folder written by `write_outputs` and recompute its summary."""
    from hearthgate.loadtests.calibrate import calibration_from_json

    meta = json.loads((raw_dir / "scenario.json").read_text())
    scenario = validate_scenario(meta["scenario"], source=str(raw_dir / "scenario.json"))
    cal = calibration_from_json(meta.get("calibration", {}))
    reqs = plan(scenario, cal)
    outcomes: dict[str, list[TargetOutcome]] = {}
    for key, info in meta.get("runs", {}).items():
        result = RunResult(
            target=str(info["target"]),
            scenario=scenario.name,
            records=read_records(raw_dir / f"{key}.records.jsonl"),
            samples=read_samples(raw_dir / f"{key}.samples.jsonl"),
            started_at=str(info.get("started_at", "")),
            duration_s=scenario.duration_s,
            warmup_s=scenario.warmup_s,
        )
        failures = int(info.get("prime_failures", 0))
        info = {
            k: v for k, v in info.items() if k not in ("target", "started_at", "prime_failures")
        }
        outcomes.setdefault(result.target, []).append(
            TargetOutcome(Endpoints(name=result.target, base_url=""), result, info, failures)
        )
    return scenario, build_summary(scenario, cal, reqs, outcomes), outcomes


def priming(scenario: Scenario, cal: Calibration, enabled: bool) -> list[PlannedRequest]:
    return priming_plan(scenario, cal) if enabled else []
