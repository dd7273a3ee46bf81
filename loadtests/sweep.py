"""`bench sweep`: raise the arrival rate to find each target's capacity, and compare settings.

Each target (a setting: worker flags, or the gateway with a settings file) is brought up once
and run at every rate scale, lowest first. A target's *capacity* is the highest rate scale up
to which interactive attainment stays at or above the threshold (90% by default) at every
tested rate. The *goodput frontier* plots interactive attainment against background output
tokens/s for every (target, rate) point. The recommended setting is the one with the highest
capacity, ties broken by goodput (good requests per second) at that rate: the setting that
completes the most work within the targets, not the one with the most raw tokens.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any

from hearthgate.deploy import box
from hearthgate.loadtests import bench, plots
from hearthgate.loadtests.markdown import _fmt, _table
from hearthgate.loadtests.matrix import Options, run_matrix
from hearthgate.loadtests.records import write_jsonl
from hearthgate.loadtests.repeats import merge_runs
from hearthgate.loadtests.report import summarize
from hearthgate.loadtests.scenario import Scenario, ScenarioError


def parse_rates(text: str) -> list[float]:
    try:
        rates = sorted({float(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ScenarioError(f"--rates {text!r}: expected comma-separated numbers") from None
    if not rates or rates[0] <= 0:
        raise ScenarioError(f"--rates {text!r}: expected positive numbers")
    return rates


def capacity(points: list[dict[str, Any]], threshold: float) -> float | None:
    """Highest rate scale such that every tested rate up to it meets the threshold."""
    best: float | None = None
    for p in sorted(points, key=lambda p: p["rate_scale"]):
        att = p["interactive_attainment"]
        if att is None or att < threshold:
            break
        best = p["rate_scale"]
    return best


def recommend(targets: dict[str, dict[str, Any]]) -> str | None:
    """The target with the highest capacity, ties broken by goodput at that rate."""

    def score(name: str) -> tuple[float, float]:
        t = targets[name]
        cap = t["capacity_rate_scale"]
        if cap is None:
            return (-1.0, 0.0)
        at = next(p for p in t["points"] if p["rate_scale"] == cap)
        return (cap, at["goodput_rps"] or 0.0)

    names = sorted(targets)
    return max(names, key=score) if names else None


STAT_KEYS = (
    "attainment",
    "completed",
    "rejected",
    "failed",
    "missed_ttft",
    "missed_itl",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "output_tokens_per_s",
    "gateway_queue_p99_s",
    "worker_ttft_p99_s",
)


def _with_runs(stats: dict[str, Any]) -> dict[str, Any]:
    """A class's or flow's ``STAT_KEYS`` with each run's attainment and TTFT p99 beside."""
    return {
        **{k: stats.get(k) for k in STAT_KEYS},
        "attainment_runs": stats.get("attainment_runs", [stats.get("attainment")]),
        "ttft_p99_s_runs": stats.get("ttft_p99_s_runs", [stats.get("ttft_p99_s")]),
    }


def point_stats(outs: list[bench.TargetOutcome], scenario: Scenario) -> dict[str, Any]:
    """One target at one workload over its runs: interactive attainment and background
    tokens (medians, each run's value too), goodput, per class and per flow the medians of
    ``STAT_KEYS`` (a class's attainment pooled over its runs, each run's beside it), and
    through a gateway what its pacing and queues held (``merge_gauges``)."""
    s = merge_runs([summarize(o.result, scenario) for o in outs])
    inter = s["interactive"]
    bg = inter["background_output_tokens_per_s"]
    out: dict[str, Any] = {
        "interactive_attainment": inter["attainment"],
        "interactive_attainment_runs": inter.get("attainment_runs", [inter["attainment"]]),
        "background_output_tokens_per_s": bg,
        "background_output_tokens_per_s_runs": inter.get(
            "background_output_tokens_per_s_runs", [bg]
        ),
        "goodput_rps": inter["goodput_rps"],
        "classes": {c: _with_runs(cs) for c, cs in s["classes"].items()},
        "flows": {f: _with_runs(fs) for f, fs in s.get("flows", {}).items()},
    }
    if s.get("gateway_gauges"):
        out["gateway_gauges"] = s["gateway_gauges"]
    return out


def sweep_summary(
    base: Scenario,
    rates: list[float],
    per_point: dict[str, dict[float, list[bench.TargetOutcome]]],
    scenarios: dict[float, Scenario],
    threshold: float,
    calibration: dict[str, Any],
) -> dict[str, Any]:
    targets: dict[str, dict[str, Any]] = {}
    for name, by_rate in per_point.items():
        points = []
        for rate in rates:
            outs = by_rate.get(rate, [])
            if not outs:
                continue
            points.append({"rate_scale": rate, **point_stats(outs, scenarios[rate])})
        info = next(iter(by_rate.values()))[0].info if by_rate else {}
        targets[name] = {
            "target": info,
            "points": points,
            "capacity_rate_scale": capacity(points, threshold),
        }
    return {
        "version": 1,
        "kind": "sweep",
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "box": box.describe(),
        "scenario": {"name": base.name, "seed": base.seed, "duration_s": base.duration_s},
        "calibration": calibration,
        "threshold": threshold,
        "rate_scales": rates,
        "latency_classes": [
            c for c, cp in base.classes.items() if cp.interactive and c in _seen_classes(targets)
        ],
        "targets": targets,
        "recommended": recommend(targets),
    }


def _runs(values: list[Any] | None, kind: str = "") -> str:
    """Each run's value, ``a / b / c``."""
    if not values:
        return "-"
    return " / ".join(_fmt(v, kind) for v in values)


def _seen_classes(targets: dict[str, dict[str, Any]]) -> set[str]:
    return {c for t in targets.values() for p in t["points"] for c in p["classes"]}


def render_sweep(summary: dict[str, Any]) -> str:
    lines = [
        f"# Sweep: {summary['scenario']['name']}",
        "",
        f"Capacity = highest rate scale with interactive attainment >= "
        f"{100 * summary['threshold']:.0f}% at every rate up to it. "
        f"Recommended (highest capacity, then goodput): **{summary['recommended']}**. "
        + box.line(summary.get("box")),
        "",
    ]
    rows = []
    for name, t in summary["targets"].items():
        for p in t["points"]:
            rows.append(
                [
                    name,
                    _fmt(p["rate_scale"]),
                    _fmt(p["interactive_attainment"], "pct"),
                    _fmt(p["background_output_tokens_per_s"]),
                    _fmt(p["goodput_rps"]),
                ]
            )
    lines += _table(
        ["target", "rate scale", "interactive attainment", "background out tok/s", "goodput"],
        rows,
    )
    lines += ["Latency (medians over runs) and each run's values in brackets:", ""]
    lat_rows = []
    for name, t in summary["targets"].items():
        for p in t["points"]:
            row = [
                name,
                _fmt(p["rate_scale"]),
                _runs(p.get("interactive_attainment_runs"), "pct"),
                _runs(p.get("background_output_tokens_per_s_runs")),
            ]
            for cls in summary.get("latency_classes", []):
                cs = p["classes"].get(cls, {})
                tpot = cs.get("tpot_p50_s")
                row += [
                    _fmt(cs.get("ttft_p50_s"), "ms"),
                    "-" if tpot is None else f"{1000 * float(tpot):.1f}",
                ]
            lat_rows.append(row)
    lat_head = ["target", "rate scale", "interactive attainment (runs)", "background tok/s (runs)"]
    for cls in summary.get("latency_classes", []):
        lat_head += [f"{cls} TTFT p50 (ms)", f"{cls} TPOT p50 (ms)"]
    lines += _table(lat_head, lat_rows)
    lines += _table(
        ["target", "description", "capacity (rate scale)"],
        [
            [n, str(t["target"].get("describe", "")), _fmt(t["capacity_rate_scale"])]
            for n, t in summary["targets"].items()
        ],
    )
    for p in summary.get("plots", []):
        lines += [f"![{p}]({p})", ""]
    return "\n".join(lines)


def run_sweep(args: argparse.Namespace) -> int:
    from hearthgate.loadtests.cli import _options, _scenario, _targets_for

    base = _scenario(args)
    rates = parse_rates(args.rates)
    classes = {c.strip() for c in args.classes.split(",")} if args.classes else None
    if classes and (unknown := classes - set(base.classes)):
        raise ScenarioError(f"--classes: unknown classes {', '.join(sorted(unknown))}")
    scenarios = {r: base.with_overrides(rate_scale=r, classes=classes) for r in rates}
    tf = _targets_for(args)
    opts: Options = _options(args)
    cal, _, cells = run_matrix(
        [(f"x{r:g}", scenarios[r]) for r in rates],
        tf,
        opts,
        rounds=args.repeat,
        order="round-major" if getattr(args, "interleave", False) else "target-major",
    )
    label_rate = {f"x{r:g}": r for r in rates}
    per_point: dict[str, dict[float, list[bench.TargetOutcome]]] = {}
    for cell in cells:
        per_point.setdefault(cell.target, {}).setdefault(label_rate[cell.point], []).append(
            cell.outcome
        )
    summary = sweep_summary(base, rates, per_point, scenarios, args.threshold, cal.to_json())
    tag = args.tag or f"{base.name}-sweep"
    args.out.mkdir(parents=True, exist_ok=True)
    plot_names: list[str] = []
    if not args.no_plots and plots.available():
        pts = {
            n: [(p["rate_scale"], p["interactive_attainment"]) for p in t["points"]]
            for n, t in summary["targets"].items()
        }
        plot_names.append(
            plots.attainment_vs_rate(pts, args.out / f"{tag}-attainment.png", args.threshold).name
        )
        front = [
            (
                f"{n} x{p['rate_scale']:g}",
                p["background_output_tokens_per_s"],
                p["interactive_attainment"],
            )
            for n, t in summary["targets"].items()
            for p in t["points"]
        ]
        plot_names.append(
            plots.frontier(front, args.out / f"{tag}-frontier.png", args.threshold).name
        )
    summary["plots"] = plot_names
    (args.out / f"{tag}.summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (args.out / f"{tag}.md").write_text(render_sweep(summary))
    if not args.no_raw:
        raw = args.out / "raw" / tag
        for cell in cells:
            key = f"{cell.target}-{cell.point}-r{cell.round + 1}"
            write_jsonl(raw / f"{key}.records.jsonl", cell.outcome.result.records)
            write_jsonl(raw / f"{key}.samples.jsonl", cell.outcome.result.samples)
    print(render_sweep(summary))
    return 0
