"""The markdown report of `hearthgate bench batch` (pure: from the JSON summary)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from typing import Any

from hearthgate.loadtests.markdown import _fmt, _table


def _num(x: float | None, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _pts(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}"


def _ok(x: bool | None) -> str:
    return "-" if x is None else ("yes" if x else "**no**")


def _runs_text(values: Sequence[float | None], fmt: Callable[[float | None], str]) -> str:
    return " / ".join(fmt(v) for v in values) or "-"


def render(summary: dict[str, Any]) -> str:
    """The markdown report of a summary written by :func:`run_bench`."""
    res = summary["results"]
    cfg = summary["config"]
    tg = res["targets"]
    lines = [
        f"# Batch API benchmark: {summary.get('tag', 'batch')}",
        "",
        f"`{summary.get('command', 'hearthgate bench batch')}`, {summary.get('created_at', '')}, "
        f"wall time {_num(summary.get('wall_s'), 0)} s, {cfg['repeat']} round(s), "
        f"order per round {' '.join(cfg['order'])}. Medians over the rounds, each round's "
        "value after it.",
        "",
    ]
    rows = [
        [
            "A interactive attainment, no batch",
            _pct(res["A"]["median"]),
            _runs_text(res["A"]["runs"], _pct),
            "",
        ],
        [
            "B interactive attainment, batch running",
            _pct(res["B"]["median"]),
            _runs_text(res["B"]["runs"], _pct),
            "",
        ],
        [
            "B - A (points)",
            _pts(res["B_minus_A"]["median"]),
            _runs_text(res["B_minus_A"]["runs"], _pts),
            f">= -1: {_ok(tg['attainment_within_1_point'])}",
        ],
        [
            "C batch lines/s through the gateway, alone",
            _num(res["C"]["median"]),
            _runs_text(res["C"]["runs"], _num),
            "",
        ],
        [
            f"D lines/s straight to vLLM ({cfg['concurrency']} in flight per worker)",
            _num(res["D"]["median"]),
            _runs_text(res["D"]["runs"], _num),
            "",
        ],
        [
            "C / D",
            _num(res["C_over_D"]["median"], 2),
            _runs_text(res["C_over_D"]["runs"], lambda v: _num(v, 2)),
            f">= 0.9: {_ok(tg['throughput_ratio_at_least_0.9'])}",
        ],
        [
            "E batch lines/s while the interactive load runs (B)",
            _num(res["E"]["median"]),
            _runs_text(res["E"]["runs"], _num),
            f"E / C = {_num(res['E_over_C']['median'], 2)}",
        ],
    ]
    lines += _table(["measure", "median", "runs", "target"], rows)
    lines += _round_details(summary)
    lines += _interactive_details(summary)
    lines += _setup(summary)
    notes = summary.get("notes") or []
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def _round_details(summary: dict[str, Any]) -> list[str]:
    out = ["## Per round", ""]
    rows = []
    for r in summary["rounds"]:
        c, d, b = r.get("C") or {}, r.get("D") or {}, r.get("B") or {}
        per_c = c.get("per_batch", {})
        per_d = d.get("per_endpoint", {})
        rows.append(
            [
                str(r["round"]),
                _pct((r.get("A") or {}).get("attainment")),
                _pct(b.get("attainment")),
                _num(c.get("lines_per_s")),
                " / ".join(f"{_num(v.get('seconds'))} s" for v in per_c.values()) or "-",
                _num(d.get("lines_per_s")),
                " / ".join(f"{_num(v.get('seconds'))} s" for v in per_d.values()) or "-",
                _num(b.get("lines_per_s")),
                " / ".join(str(v) for v in (b.get("lines_in_window") or {}).values()) or "-",
                _pct(b.get("batch_coverage")),
                str(
                    sum(int(v.get("failed") or 0) for v in per_c.values())
                    + int(d.get("failed") or 0)
                ),
            ]
        )
    eps = " / ".join(summary["config"].get("endpoints", []))
    out += _table(
        [
            "round",
            "A",
            "B",
            "C lines/s",
            f"C time per batch ({eps})",
            "D lines/s",
            f"D time per endpoint ({eps})",
            "E lines/s",
            f"E lines done per batch ({eps})",
            "batch running over B's arrivals",
            "failed lines (C + D)",
        ],
        rows,
    )
    return out


def _interactive_details(summary: dict[str, Any]) -> list[str]:
    inter = summary.get("interactive") or {}
    targets = inter.get("targets") or {}
    if not targets:
        return []
    out = [
        "## Interactive classes (A: no batch, B: batch running; pooled over the rounds)",
        "",
    ]
    rows = []
    for name, t in targets.items():
        for c, cs in t["classes"].items():
            rows.append(
                [
                    name,
                    c,
                    _fmt(cs.get("attainment"), "pct"),
                    f"{cs['completed']} / {cs['rejected']} / {cs['failed']}",
                    _fmt(cs.get("ttft_p50_s"), "ms"),
                    _fmt(cs.get("ttft_p99_s"), "ms"),
                    _fmt(cs.get("tpot_p50_s"), "ms"),
                    _fmt(cs.get("max_gap_p99_s"), "ms"),
                ]
            )
    out += _table(
        [
            "run",
            "class",
            "attainment",
            "completed / rejected / failed",
            "TTFT p50 (ms)",
            "TTFT p99 (ms)",
            "TPOT p50 (ms)",
            "largest gap p99 (ms)",
        ],
        rows,
    )
    sc = inter.get("scenario") or {}
    flows = ", ".join(
        f"{f['flow']} {f['rate_nominal']:g}/s" for f in sc.get("flows", []) if "flow" in f
    )
    out += [
        f"Scenario {sc.get('name')} ({flows}), {sc.get('duration_s')} s per run, "
        f"warm-up {sc.get('warmup_s')} s; SLOs as in the scenario file.",
        "",
    ]
    return out


def _setup(summary: dict[str, Any]) -> list[str]:
    cfg = summary["config"]
    batch = cfg["batch"]
    out = ["## Set-up", ""]
    out += [
        f"Batch: {batch['lines']} lines, {batch['summary_lines']} summaries on "
        f"{batch['summary_endpoint']} (prompt tokens {_dist(batch['summary_prompt_tokens'])}, "
        f"max_tokens {batch['summary_max_tokens']}, temperature 0, ignore_eos) and "
        f"{batch['embed_lines']} embeddings inputs (tokens "
        f"{_dist(batch['embed_prompt_tokens'])}, model minilm), one batch per endpoint, both "
        f"created at once by app `{batch['app']}`. Lines/s = lines / (first batches.create "
        f"until the last batch was seen completed, polled every {cfg['poll_interval_s']:g} s); "
        f"D: lines / (first request to last response), {cfg['concurrency']} in flight per "
        "worker, both workers at once. Every measurement has its own prompt words (same "
        f"lengths). B: the batch is created {cfg['batch_lead_s']:g} s before the interactive "
        "warm-up requests and cancelled after the run; E counts its lines done while the "
        "interactive arrivals were on.",
        "",
    ]
    rows = [
        [p["what"], str(p["core"]), str(p.get("nice", 0)), p.get("detail", "")]
        for p in summary["layout"]
    ]
    out += _table(["process", "core", "nice (session)", "detail"], rows)
    out += ["vLLM workers (started once, shared by every measurement):", ""]
    for name, w in summary["vllm"].items():
        out += [f"- {name}: `{shlex.join(w['command'])}`", f"  env: `{w['env']}`"]
    out += [
        "",
        "Gateway (a fresh process per measurement, Redis emptied before each): built-in "
        "defaults plus the settings below (workers and listen filled in by the benchmark).",
        "",
        "```json",
        json.dumps(summary["gateway"]["settings"], indent=1),
        "```",
        "",
    ]
    eff = summary["gateway"].get("effective")
    if eff:
        out += ["Effective batch, scheduler and worker-limit settings:", "", "```json"]
        out += [json.dumps(eff, indent=1), "```", ""]
    return out


def _dist(d: dict[str, Any]) -> str:
    if d.get("dist") == "uniform":
        return f"uniform {d['min']}-{d['max']}"
    if d.get("dist") == "fixed":
        return str(d["value"])
    return json.dumps(d)
