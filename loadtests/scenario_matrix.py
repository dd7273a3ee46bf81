"""`bench matrix`: every workload the product promises to hold, against vLLM alone and the
gateway, in one command.

A points file (`loadtests/targets/matrix-points.yaml`) names the workloads: a shipped
scenario with its rates scaled (all flows, or some classes' or apps' flows) and classes or
apps left out. Every point runs against every target of a targets file, round by round
(each round visits every target, and in it every point; the box drifts between runs, so
targets are interleaved rather than run one after another), and the medians over rounds are
judged against the targets of issue 15, next to what vLLM alone does on the same load:

- interactive attainment at least 99% through the gateway;
- background output tokens/s at least 0.95x the best vLLM-alone target that keeps
  interactive attainment at 90% or more, or, where none does, 0.9x vLLM at default flags;
- chat TPOT p50 at most 0.7x that of tuned vLLM (the vLLM target that sends client
  priorities) wherever vLLM alone is loaded: the point has background load and vLLM at
  default flags keeps interactive attainment under 99% there (with no such target in the
  run, wherever the point has background load). Where vLLM alone holds its targets, tuned
  vLLM's streams run near the worker's idle speed, which a gate in front cannot beat;
- for a point with a `light_app` (noisy neighbour): that app's TTFT p99 within 1.2x of its
  value in the point named by `solo`, and the other apps of its class at least 70% of the
  output tokens/s they get from vLLM alone at default flags (no cap of any kind).

`judge` is pure (plain summaries in, verdicts out); `run_matrix_command` does the running.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hearthgate.deploy import box
from hearthgate.loadtests import bench
from hearthgate.loadtests.markdown import _fmt, _table
from hearthgate.loadtests.matrix import Cell, Options, run_matrix
from hearthgate.loadtests.prompts import Calibration
from hearthgate.loadtests.records import write_jsonl
from hearthgate.loadtests.repeats import median_of
from hearthgate.loadtests.sampler import QUEUE_BLOCKED
from hearthgate.loadtests.scenario import Scenario, ScenarioError, load_scenario
from hearthgate.loadtests.sweep import point_stats

ATTAINMENT = 0.99
VLLM_HOLDS = 0.90
BACKGROUND_VS_BEST = 0.95
BACKGROUND_VS_DEFAULT = 0.9
TPOT_VS_TUNED = 0.7
LIGHT_TAIL_VS_SOLO = 1.2
HEAVY_VS_OPEN = 0.7


class MatrixPoint(BaseModel):
    """One workload of the matrix."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    scenario: str = Field(min_length=1)
    rate_scale: float | None = Field(None, gt=0)
    classes: list[str] | None = None  # scale only these classes' flows
    apps: list[str] | None = None  # scale only these apps' flows
    without: list[str] | None = None  # leave these classes out
    without_apps: list[str] | None = None  # leave these apps out
    light_app: str | None = None  # judged against its solo run (noisy neighbour)
    solo: str | None = None  # the point holding light_app's solo run


class MatrixFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    points: list[MatrixPoint] = Field(min_length=1)


def load_points(path: str | Path) -> MatrixFile:
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
        mf = MatrixFile.model_validate(data)
    except OSError as err:
        raise ScenarioError(f"{p}: cannot read: {err.strerror}") from None
    except (yaml.YAMLError, ValidationError) as err:
        raise ScenarioError(f"{p.name}: {err}") from None
    names = [pt.name for pt in mf.points]
    if len(set(names)) != len(names):
        raise ScenarioError(f"{p.name}: point names must be unique")
    for pt in mf.points:
        if (pt.light_app is None) != (pt.solo is None):
            raise ScenarioError(f"{p.name}: point {pt.name}: light_app and solo go together")
        if pt.solo is not None and pt.solo not in names:
            raise ScenarioError(f"{p.name}: point {pt.name}: no point named {pt.solo!r}")
    return mf


def _set(names: list[str] | None) -> set[str] | None:
    return set(names) if names else None


def build_scenarios(
    mf: MatrixFile, *, duration_s: float | None = None, warmup_s: float | None = None
) -> list[tuple[str, Scenario]]:
    """Each point's scenario, in file order (ScenarioError for unknown names)."""
    out = []
    for pt in mf.points:
        sc = load_scenario(pt.scenario).with_overrides(
            rate_scale=pt.rate_scale,
            classes=_set(pt.classes),
            apps=_set(pt.apps),
            without=_set(pt.without),
            without_apps=_set(pt.without_apps),
            duration_s=duration_s,
            warmup_s=warmup_s,
        )
        if pt.light_app is not None and pt.light_app not in sc.apps:
            raise ScenarioError(f"point {pt.name}: light_app {pt.light_app} is not in it")
        out.append((pt.name, sc))
    return out


# ------------------------------------------------------------------ judging (pure)


def _roles(targets: dict[str, dict[str, Any]]) -> tuple[list[str], str | None, str | None]:
    """Gateway target names; the vLLM target at default flags; tuned vLLM (priorities)."""
    gateways = [n for n, t in targets.items() if t.get("kind") == "gateway"]
    vllm = {n: t for n, t in targets.items() if t.get("kind") == "vllm"}
    default = next(
        (n for n, t in vllm.items() if not t.get("worker_args") and not t.get("send_priority")),
        None,
    )
    tuned = next((n for n, t in vllm.items() if t.get("send_priority")), None)
    return gateways, default, tuned


def _flow_of(stats: dict[str, Any], app: str) -> dict[str, Any] | None:
    return next((f for k, f in stats.get("flows", {}).items() if k.endswith("/" + app)), None)


def _light(stats: dict[str, Any], app: str) -> dict[str, Any] | None:
    """The light app's numbers: its flow in a shared class, else its only class (solo)."""
    flow = _flow_of(stats, app)
    if flow is not None:
        return flow
    classes = stats.get("classes", {})
    return next(iter(classes.values())) if len(classes) == 1 else None


def _median(stats: dict[str, Any] | None, key: str) -> float | None:
    """A share judged as the issue asks, the median of the rounds (``key + "_runs"``); a
    summary from before the runs were kept gives its one (pooled) value."""
    if stats is None:
        return None
    runs = stats.get(f"{key}_runs")
    return median_of(runs) if runs else stats.get(key)


def _attainment(stats: dict[str, Any], cls: str) -> float | None:
    return _median(stats.get("classes", {}).get(cls), "attainment")


def _inter(stats: dict[str, Any]) -> float | None:
    return _median(stats, "interactive_attainment")


def _recorder(
    checks: list[dict[str, Any]],
) -> Callable[[str, float | None, float | None, bool | None], None]:
    def check(name: str, value: float | None, bound: float | None, holds: bool | None) -> None:
        checks.append({"check": name, "value": value, "bound": bound, "ok": holds})

    return check


def judge(
    point: MatrixPoint,
    cells: dict[str, dict[str, Any]],
    targets: dict[str, dict[str, Any]],
    scenario: Scenario,
    solo_cells: dict[str, dict[str, Any]] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """For each gateway target, the checks of this point: name, measured value, bound and
    whether it holds (None: could not be judged, say a missing reference)."""
    gateways, default, tuned = _roles(targets)
    vllm = [n for n, t in targets.items() if t.get("kind") == "vllm"]
    background = any(not c.interactive for c in scenario.classes.values())
    # A point whose only background is embeddings (no output tokens to count) is judged by
    # their share answered within target instead.
    kinds = {
        name: {f.endpoint for f in scenario.flows if f.klass == name} for name in scenario.classes
    }
    bg_kinds = set().union(*(kinds[n] for n, c in scenario.classes.items() if not c.interactive))
    embed_classes = (
        [n for n, c in scenario.classes.items() if not c.interactive and kinds[n]]
        if bg_kinds == {"embeddings"}
        else []
    )
    # "Wherever vLLM alone is loaded": vLLM at default flags misses interactive work here.
    fcfs = cells.get(default) if default else None
    loaded = fcfs is None or (_inter(fcfs) or 0.0) < ATTAINMENT
    out: dict[str, list[dict[str, Any]]] = {}
    for g in gateways:
        got = cells.get(g)
        if got is None:
            continue
        checks: list[dict[str, Any]] = []
        check = _recorder(checks)

        if point.light_app is None:
            att = _inter(got)
            check(
                "interactive attainment",
                att,
                ATTAINMENT,
                None if att is None else att >= ATTAINMENT,
            )
        else:
            # The flooding app asks for more than any box serves (that is the scenario):
            # "interactive work within its targets" is the light app's.
            light_now = _light(got, point.light_app)
            att = _median(light_now, "attainment")
            name = f"{point.light_app} attainment"
            check(name, att, ATTAINMENT, None if att is None else att >= ATTAINMENT)
        if embed_classes:
            # Embeddings make no output tokens: their "background throughput" is how many
            # come back within their class's target (all of them are answered in the end).
            for cls in embed_classes:
                on = _attainment(got, cls)
                held = [
                    a
                    for v in vllm
                    if v in cells
                    and (_inter(cells[v]) or 0.0) >= VLLM_HOLDS
                    and (a := _attainment(cells[v], cls)) is not None
                ]
                ebound = None if not held else BACKGROUND_VS_BEST * max(held)
                ok = None if on is None or ebound is None else on >= ebound
                check(f"{cls} on target vs best vLLM holding 90%", on, ebound, ok)
        if background and not embed_classes:
            bg = got["background_output_tokens_per_s"] or 0.0
            holding = [
                cells[v]["background_output_tokens_per_s"] or 0.0
                for v in vllm
                if v in cells and (_inter(cells[v]) or 0.0) >= VLLM_HOLDS
            ]
            if holding:
                best = BACKGROUND_VS_BEST * max(holding)
                check("background tok/s vs best vLLM holding 90%", bg, best, bg >= best)
            elif default is not None and default in cells:
                floor = BACKGROUND_VS_DEFAULT * (
                    cells[default]["background_output_tokens_per_s"] or 0.0
                )
                check("background tok/s vs vLLM default", bg, floor, bg >= floor)
            else:
                check("background tok/s", bg, None, None)
        if background and "chat" in scenario.classes and tuned is not None and loaded:
            tpot = got["classes"].get("chat", {}).get("tpot_p50_s")
            tref = cells.get(tuned, {}).get("classes", {}).get("chat", {}).get("tpot_p50_s")
            tbound = None if tref is None else TPOT_VS_TUNED * tref
            ok = None if tpot is None or tbound is None else tpot <= tbound
            check("chat TPOT p50 vs tuned vLLM", tpot, tbound, ok)
        if point.light_app is not None:
            light = _light(got, point.light_app)
            solo = _light((solo_cells or {}).get(g, {}), point.light_app)
            p99 = None if light is None else light.get("ttft_p99_s")
            solo_p99 = None if solo is None else solo.get("ttft_p99_s")
            lbound = None if solo_p99 is None else LIGHT_TAIL_VS_SOLO * solo_p99
            ok = None if p99 is None or lbound is None else p99 <= lbound
            check(f"{point.light_app} TTFT p99 vs solo", p99, lbound, ok)
            heavy = [a for a in scenario.apps if a != point.light_app]
            for app in heavy:
                flow = _flow_of(got, app)
                open_flow = _flow_of(cells.get(default, {}), app) if default else None
                tps = None if flow is None else flow.get("output_tokens_per_s")
                open_tps = None if open_flow is None else open_flow.get("output_tokens_per_s")
                hbound = None if open_tps is None else HEAVY_VS_OPEN * open_tps
                ok = None if tps is None or hbound is None else tps >= hbound
                check(f"{app} tok/s vs vLLM alone", tps, hbound, ok)
        out[g] = checks
    return out


# ------------------------------------------------------------------ summary and report


def matrix_summary(
    mf: MatrixFile,
    scenarios: list[tuple[str, Scenario]],
    per_cell: dict[tuple[str, str], list[bench.TargetOutcome]],
    calibration: dict[str, Any],
    rounds: int,
) -> dict[str, Any]:
    targets: dict[str, dict[str, Any]] = {}
    for (_, target), outs in per_cell.items():
        targets.setdefault(target, dict(outs[0].info))
    by_name = dict(scenarios)
    cells: dict[str, dict[str, dict[str, Any]]] = {}
    for (point, target), outs in per_cell.items():
        cells.setdefault(point, {})[target] = point_stats(outs, by_name[point])
    verdicts = {
        pt.name: judge(
            pt,
            cells.get(pt.name, {}),
            targets,
            by_name[pt.name],
            cells.get(pt.solo) if pt.solo else None,
        )
        for pt in mf.points
    }
    return {
        "version": 1,
        "kind": "matrix",
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "box": box.describe(),
        "rounds": rounds,
        "calibration": calibration,
        "points": [
            {**pt.model_dump(exclude_none=True), "duration_s": by_name[pt.name].duration_s}
            for pt in mf.points
        ],
        "targets": targets,
        "cells": cells,
        "verdicts": verdicts,
        "attainment_judged": "median",  # of the rounds; summaries without it judged pooled
        "all_hold": all(
            c["ok"] is True for v in verdicts.values() for checks in v.values() for c in checks
        ),
    }


def _share(stats: dict[str, Any], key: str, median: bool) -> str:
    """A share as it was judged: the median of the rounds with their range (or, for a
    summary judged before medians, the value pooled over the rounds)."""
    if not median:
        return _fmt(stats.get(key), "pct")
    value = _median(stats, key)
    if value is None:
        return "-"
    runs = [float(r) for r in stats.get(f"{key}_runs") or [] if r is not None]
    spread = f" ({100 * min(runs):.1f}-{100 * max(runs):.1f})" if len(set(runs)) > 1 else ""
    return f"{100 * value:.1f}%{spread}"


def _cell(stats: dict[str, Any] | None, point: dict[str, Any], median: bool = False) -> str:
    if stats is None:
        return "-"
    light_app: str | None = point.get("light_app")
    light = None if light_app is None else _flow_of(stats, light_app)
    if light_app is not None and light is not None:
        # Noisy neighbour: the whole run's attainment counts the flood's own misses; what
        # the point is about is the light app's attainment and tail and the others' tokens.
        others = [f for k, f in stats.get("flows", {}).items() if not k.endswith("/" + light_app)]
        heavy = float(sum(f.get("output_tokens_per_s") or 0.0 for f in others))
        p99 = light.get("ttft_p99_s")
        tail = "-" if p99 is None else f"{p99 * 1000:.0f} ms"
        return f"{_share(light, 'attainment', median)} / {_fmt(heavy)} / {tail}"
    att = _share(stats, "interactive_attainment", median)
    bg = _fmt(stats["background_output_tokens_per_s"])
    quiet = [  # classes answered without output tokens (embeddings): their share on target
        f"{name} {_share(c, 'attainment', median)} on target"
        for name, c in stats["classes"].items()
        if not c.get("output_tokens_per_s") and c.get("attainment") is not None
    ]
    if not stats["background_output_tokens_per_s"] and quiet:
        bg = ", ".join(quiet)
    tpot = stats["classes"].get("chat", {}).get("tpot_p50_s")
    chat = "" if tpot is None else f" / {tpot * 1000:.0f} ms"
    return f"{att} / {bg}{chat}"


def queue_waits(gauges: dict[str, Any] | None) -> str:
    """What each class's oldest queued request waited for in a gateway cell's steady window
    (``hearthgate_queue_blocked_seconds_total``, the median of the rounds' increases), the
    longest first, as ``rag: prefill 12.0 s, paced 3.1 s; batch: held 30.0 s``."""
    by_cls: dict[str, list[tuple[float, str]]] = {}
    for key, row in (gauges or {}).items():
        name, _, labels = key.partition("{")
        seconds = row.get("increase")
        if name != QUEUE_BLOCKED or not seconds or seconds < 0.05:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        by_cls.setdefault(got["cls"], []).append((float(seconds), got["reason"]))
    return "; ".join(
        f"{cls}: " + ", ".join(f"{r} {v:.1f} s" for v, r in sorted(waits, reverse=True))
        for cls, waits in sorted(by_cls.items(), key=lambda kv: -sum(v for v, _ in kv[1]))
    )


def _verdict(checks: list[dict[str, Any]]) -> str:
    failed = [c["check"] for c in checks if c["ok"] is False]
    unknown = [c["check"] for c in checks if c["ok"] is None]
    if failed:
        return "misses: " + "; ".join(failed)
    return "holds" + (f" (not judged: {'; '.join(unknown)})" if unknown else "")


def render_markdown(summary: dict[str, Any]) -> str:
    names = list(summary["targets"])
    gateways = [n for n in names if summary["targets"][n].get("kind") == "gateway"]
    median = summary.get("attainment_judged") == "median"
    rows = []
    for pt in summary["points"]:
        cells = summary["cells"].get(pt["name"], {})
        verdicts = summary["verdicts"].get(pt["name"], {})
        rows.append(
            [pt["name"], *(_cell(cells.get(n), pt, median) for n in names)]
            + [_verdict(verdicts.get(g, [])) for g in gateways]
        )
    share = (
        "median of the rounds, their range in brackets"
        if median
        else "pooled: on-target requests over all requests of the rounds"
    )
    lines = [
        "# Scenario matrix",
        "",
        f"{summary['rounds']} round(s), targets interleaved round by round. Each cell: "
        f"interactive attainment ({share}) / background output tok/s / chat TPOT p50 "
        "(medians of the rounds); for a point with a light app (noisy neighbour): its "
        "attainment (as the others) / the other apps' output tok/s / its TTFT p99 (medians). "
        "The checks judge these same values. " + box.line(summary.get("box")),
        "",
        *_table(["point", *names, *(f"{g}: targets" for g in gateways)], rows),
        "| target | description |",
        "|---|---|",
        *(f"| {n} | {summary['targets'][n].get('describe', '')} |" for n in names),
        "",
        "Every check, with the measured value and its bound:",
        "",
    ]
    detail = []
    for point, by_target in summary["verdicts"].items():
        for target, checks in by_target.items():
            for c in checks:
                ok = {True: "yes", False: "NO", None: "-"}[c["ok"]]
                detail.append([point, target, c["check"], _fmt(c["value"]), _fmt(c["bound"]), ok])
    lines += _table(["point", "target", "check", "value", "bound", "holds"], detail)
    waits = [
        [pt["name"], g, text]
        for pt in summary["points"]
        for g in gateways
        if (
            text := queue_waits(
                summary["cells"].get(pt["name"], {}).get(g, {}).get("gateway_gauges")
            )
        )
    ]
    if waits:
        lines += [
            "What each class's oldest queued request waited for in the steady window, by the "
            "first limit in its way (seconds, median of the rounds; README, Metrics: "
            "`hearthgate_queue_blocked_seconds_total`):",
            "",
            *_table(["point", "target", "waited for"], waits),
        ]
    return "\n".join(lines) + "\n"


def run_matrix_command(args: argparse.Namespace) -> int:
    from hearthgate.loadtests.cli import _options, _targets_for

    mf = load_points(args.points)
    scenarios = build_scenarios(mf, duration_s=args.duration, warmup_s=args.warmup)
    if args.only_points:
        keep = {n.strip() for n in args.only_points.split(",")}
        unknown = keep - {n for n, _ in scenarios}
        if unknown:
            raise ScenarioError(f"--only-points: unknown points {', '.join(sorted(unknown))}")
        scenarios = [(n, sc) for n, sc in scenarios if n in keep]
        mf = MatrixFile(points=[p for p in mf.points if p.name in keep])
    tf = _targets_for(args)
    opts: Options = _options(args)
    args.out.mkdir(parents=True, exist_ok=True)
    tag = args.tag or "matrix"
    per_round = len(scenarios) * len(tf.targets)
    partial = args.out / f"{tag}.partial.summary.json"

    def summarise(cells: list[Cell], cal: Calibration, rounds: int) -> dict[str, Any]:
        per_cell: dict[tuple[str, str], list[bench.TargetOutcome]] = {}
        for cell in cells:
            per_cell.setdefault((cell.point, cell.target), []).append(cell.outcome)
        return matrix_summary(mf, scenarios, per_cell, cal.to_json(), rounds)

    raw = args.out / "raw" / tag

    def save_round(cells: list[Cell], cal: Calibration) -> None:
        # Every run's scrapes (gateway and workers), to follow pacing and the queues over
        # time, and its requests, to see which ones missed and when (raw/ is not
        # committed: .gitignore).
        last = cells[-1]
        raw.mkdir(parents=True, exist_ok=True)
        name = f"r{last.round}-{last.target}-{last.point}".replace(" ", "_")
        write_jsonl(raw / f"{name}.samples.jsonl", last.outcome.result.samples)
        write_jsonl(raw / f"{name}.records.jsonl", last.outcome.result.records)
        # A whole round done: keep the medians so far, should the run be cut short.
        if len(cells) % per_round == 0:
            done = summarise(cells, cal, len(cells) // per_round)
            partial.write_text(json.dumps(done, indent=1) + "\n")

    cal, _, cells = run_matrix(
        scenarios, tf, opts, rounds=args.repeat, order="round-major", on_cell=save_round
    )
    summary = summarise(cells, cal, args.repeat)
    (args.out / f"{tag}.summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    partial.unlink(missing_ok=True)
    md = render_markdown(summary)
    (args.out / f"{tag}.md").write_text(md)
    print(md)
    return 0 if summary["all_hold"] else 1
