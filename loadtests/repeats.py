"""Merge repeated runs of one target into one summary with its spread.

Runs near the knee are noisy (VLLM_CPU.md: one run can differ from the next by 30 points),
so repeated, interleaved runs are reported as: counts summed over runs, attainment pooled
(good / requests over all runs) with each run's value, its median, min and max beside it;
latency and throughput fields as the median over runs. Fairness, server-side and run-health
details are taken from the run whose class attainment is the median one (first class in the
scenario). The embeddings block's numbers and the gateway's steady-window gauges and
counters (``merge_gauges``) are medians over runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

_SUMMED = ("requests", "completed", "rejected", "failed", "good", "missed_ttft", "missed_itl")


def median_of(values: list[Any]) -> float | None:
    """The median of the values that are not None, rounded to 4 places; None for none."""
    xs = [float(v) for v in values if v is not None]
    return round(statistics.median(xs), 4) if xs else None


def merge_class(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in runs[0]:
        values = [r.get(key) for r in runs]
        if key in _SUMMED:
            out[key] = sum(int(v or 0) for v in values)
        elif key == "slo":
            out[key] = runs[0][key]
        elif key == "attainment":
            continue
        else:
            out[key] = median_of(values)
    out["attainment"] = round(out["good"] / out["requests"], 4) if out["requests"] else None
    atts = [r["attainment"] for r in runs]
    out["attainment_runs"] = atts
    out["ttft_p99_s_runs"] = [r.get("ttft_p99_s") for r in runs]
    out["attainment_median"] = median_of(atts)
    present = [a for a in atts if a is not None]
    out["attainment_min"] = min(present) if present else None
    out["attainment_max"] = max(present) if present else None
    return out


def merge_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One target summary from several runs' summaries (see the module docstring)."""
    if len(runs) == 1:
        return runs[0]
    first_class = next(iter(runs[0]["classes"]))
    ranked = sorted(runs, key=lambda r: r["classes"][first_class]["attainment"] or 0.0)
    median_run = ranked[len(ranked) // 2]
    classes = {c: merge_class([r["classes"][c] for r in runs]) for c in runs[0]["classes"]}
    run_block = dict(median_run["run"])
    for key in ("requests", "warmup_requests", "completed", "rejected", "failed"):
        run_block[key] = sum(int(r["run"][key]) for r in runs)
    run_block["drain_s"] = median_of([r["run"]["drain_s"] for r in runs])
    lags = [r["run"]["send_lag_max_s"] for r in runs if r["run"]["send_lag_max_s"] is not None]
    run_block["send_lag_max_s"] = max(lags) if lags else None
    inter_runs = [r["interactive"]["attainment"] for r in runs]
    inter = median_run["interactive"]["classes"]
    inter_n = sum(classes[c]["requests"] for c in inter)
    interactive = {
        **median_run["interactive"],
        "attainment": round(sum(classes[c]["good"] for c in inter) / inter_n, 4)
        if inter_n
        else None,
        "attainment_runs": inter_runs,
        "background_output_tokens_per_s": median_of(
            [r["interactive"]["background_output_tokens_per_s"] for r in runs]
        ),
        "background_output_tokens_per_s_runs": [
            r["interactive"]["background_output_tokens_per_s"] for r in runs
        ],
        "goodput_rps": median_of([r["interactive"]["goodput_rps"] for r in runs]),
    }
    out = {
        **median_run,
        "repeats": len(runs),
        "run": run_block,
        "interactive": interactive,
        "classes": classes,
    }
    if median_run.get("flows"):
        out["flows"] = {
            f: merge_class([r["flows"][f] for r in runs if f in r.get("flows", {})])
            for f in median_run["flows"]
        }
    gauges = merge_gauges([r.get("gateway_gauges") or {} for r in runs])
    if gauges:
        out["gateway_gauges"] = gauges
    if median_run.get("embeddings"):
        out["embeddings"] = {
            k: v
            if isinstance(v, str)
            else median_of([(r.get("embeddings") or {}).get(k) for r in runs])
            for k, v in median_run["embeddings"].items()
        }
    return out


def merge_gauges(
    runs: Sequence[Mapping[str, Mapping[str, float | None]]],
) -> dict[str, dict[str, Any]]:
    """Each gauge's or counter's steady-window statistics (report.steady_gauges) over runs:
    the median of each, and every run's mean (a counter: its increase) in ``mean_runs``
    (``increase_runs``), None for a run whose gateway never showed it."""
    keys = sorted({k for r in runs for k in r})
    out: dict[str, dict[str, Any]] = {}
    for k in keys:
        got = [r[k] for r in runs if k in r]
        stats = sorted({stat for g in got for stat in g})
        row: dict[str, Any] = {stat: median_of([g.get(stat) for g in got]) for stat in stats}
        main = "mean" if "mean" in stats else "increase"
        row[f"{main}_runs"] = [r[k].get(main) if k in r else None for r in runs]
        out[k] = row
    return out
