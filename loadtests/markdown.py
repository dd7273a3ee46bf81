"""Render a summary (one or several targets) as a markdown report."""

from __future__ import annotations

from typing import Any

from hearthgate.deploy import box

DEFINITIONS = """\
**Definitions.** Measured requests are those scheduled after the warm-up; each is completed,
rejected (HTTP 429/503) or failed (any other error). A request is *good* when it completed,
its TTFT is within the class target (for a non-streamed request, the time to the whole
response) and its inter-token statistic is within the class target: by default the mean gap
after the first token (TPOT = (last token - first token) / (output tokens - 1), as vLLM's
benchmark reports it); a class may choose its p99 or largest gap instead. Rejections and
failures are misses. Attainment = good / measured; goodput = good requests per second of the
steady window. Token rates count tokens delivered inside the steady window (after warm-up,
while arrivals are on); drain is the time from the end of arrivals to the last response.
Latency percentiles are over completed measured requests; "largest gap" is each request's
largest inter-token gap. Fairness: service = input + 2 x output tokens in the steady window;
Jain (max-min) is Jain's index over each app's service relative to its weighted max-min
fair share given its demand (1 = fair)."""

EMBEDDINGS_NOTE = """\
Embedding inputs/s count inputs of requests completed inside the steady window; offered is
what the scenario sent in it. Upstream calls are the embeddings calls made to the worker during
the run: through the gateway, the increase of
`hearthgate_coalesce_upstream_calls_total`; for vLLM alone, one per request sent. Inputs per
call = inputs sent / upstream calls."""


LAG_WARN_S = 0.05
CPU_WARN = 0.5


def _fmt(x: Any, kind: str = "") -> str:
    if x is None:
        return "-"
    if kind == "pct":
        return f"{100 * float(x):.0f}%"
    if kind == "ms":
        return f"{1000 * float(x):.0f}"
    if kind == "s":
        return f"{float(x):.1f}"
    if isinstance(x, float):
        return f"{x:.1f}" if abs(x) >= 10 else f"{x:.3g}"
    return str(x)


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return [*out, ""]


def _slo_text(slo: dict[str, Any]) -> str:
    parts = []
    if slo.get("ttft_s") is not None:
        parts.append(f"TTFT<={1000 * slo['ttft_s']:.0f}ms")
    if slo.get("itl_s") is not None:
        stat = {"tpot": "TPOT", "p99_gap": "p99 gap", "max_gap": "max gap"}[slo["itl_stat"]]
        parts.append(f"{stat}<={1000 * slo['itl_s']:.0f}ms")
    return ", ".join(parts) or "completes"


# Statistics only a gateway's answers carry (its x-hearthgate-queued-ms header).
_GATEWAY_ONLY = frozenset({"gateway_queue_p99_s", "worker_ttft_p99_s"})


def _side_by_side(summary: dict[str, Any]) -> list[str]:
    targets: dict[str, Any] = summary["targets"]
    names = list(targets)
    classes = list(next(iter(targets.values()))["classes"]) if targets else []
    lines = ["## Side by side", ""]
    specs = [
        ("Attainment (good / measured)", "attainment", "pct"),
        ("TTFT p50 (ms)", "ttft_p50_s", "ms"),
        ("TTFT p99 (ms)", "ttft_p99_s", "ms"),
        ("Gateway queue p99 (ms)", "gateway_queue_p99_s", "ms"),
        ("TTFT p99 less the gateway queue (ms)", "worker_ttft_p99_s", "ms"),
        ("TPOT p50 (ms)", "tpot_p50_s", "ms"),
        ("Largest inter-token gap p99 (ms)", "max_gap_p99_s", "ms"),
        ("Output tokens/s (steady window)", "output_tokens_per_s", ""),
        ("Completed / rejected / failed", None, ""),
        ("Drain after arrivals end (s)", "drain_s", "s"),
    ]
    for title, key, kind in specs:
        if key in _GATEWAY_ONLY and all(
            t["classes"][c].get(key) is None for t in targets.values() for c in classes
        ):
            continue  # no gateway among the targets
        lines += [f"### {title}", ""]
        rows = []
        for c in classes:
            slo = targets[names[0]]["classes"][c]["slo"]
            row = [c, _slo_text(slo)]
            for n in names:
                cs = targets[n]["classes"][c]
                if key is None:
                    row.append(f"{cs['completed']} / {cs['rejected']} / {cs['failed']}")
                else:
                    row.append(_fmt(cs.get(key), kind))
            rows.append(row)
        lines += _table(["class", "SLO", *names], rows)
    inter = [
        [
            n,
            _fmt(t["interactive"]["attainment"], "pct"),
            _fmt(t["interactive"]["background_output_tokens_per_s"]),
            _fmt(t["interactive"]["goodput_rps"]),
        ]
        for n, t in targets.items()
    ]
    lines += ["### Interactive attainment and background throughput", ""]
    lines += _table(
        ["target", "interactive attainment", "background output tok/s", "goodput (good req/s)"],
        inter,
    )
    if any(t.get("flows") for t in targets.values()):
        lines += _flows(targets)
    if any(f.get("endpoint") == "embeddings" for f in summary["scenario"].get("flows", [])):
        lines += _embeddings(targets)
    return lines


def _flows(targets: dict[str, Any]) -> list[str]:
    """Per flow (app) of a class several apps share: attainment and TTFT per target."""
    names = list(targets)
    flows = sorted({f for t in targets.values() for f in t.get("flows", {})})
    rows = []
    for f in flows:
        for key, kind, label in (
            ("attainment", "pct", "attainment"),
            ("ttft_p50_s", "ms", "TTFT p50 (ms)"),
            ("ttft_p99_s", "ms", "TTFT p99 (ms)"),
            ("tpot_p50_s", "ms", "TPOT p50 (ms)"),
            ("output_tokens_per_s", "", "output tok/s"),
        ):
            cells = [_fmt((targets[n].get("flows", {}).get(f) or {}).get(key), kind) for n in names]
            rows.append([f, label, *cells])
    return ["### Per app, in classes several apps share", "", *_table(["flow", "", *names], rows)]


def _embeddings(targets: dict[str, Any]) -> list[str]:
    """The embeddings table: throughput and upstream calls beside interactive attainment."""
    rows = []
    for n, t in targets.items():
        e = t.get("embeddings") or {}
        rows.append(
            [
                n,
                _fmt(e.get("inputs_per_s")),
                _fmt(e.get("inputs_offered_per_s")),
                _fmt(e.get("upstream_calls")),
                _fmt(e.get("inputs_per_call")),
                _fmt(e.get("e2e_p50_s"), "ms"),
                _fmt(e.get("e2e_p99_s"), "ms"),
                _fmt(t["interactive"]["attainment"], "pct"),
            ]
        )
    head = [
        "target",
        "embedding inputs/s",
        "offered inputs/s",
        "upstream calls",
        "inputs per call",
        "embed e2e p50 (ms)",
        "e2e p99 (ms)",
        "interactive attainment",
    ]
    return ["### Embeddings", "", *_table(head, rows), EMBEDDINGS_NOTE, ""]


def _target_details(name: str, t: dict[str, Any]) -> list[str]:
    run = t["run"]
    lines = [f"## Target `{name}`", ""]
    info = t.get("target")
    if info:
        lines += [f"`{info.get('describe', '')}`", ""]
    lines += [
        f"Measured requests {run['requests']} (warm-up {run['warmup_requests']}): "
        f"completed {run['completed']}, rejected {run['rejected']}, failed {run['failed']}. "
        f"Drain {_fmt(run['drain_s'], 's')} s. Send lag p99 {_fmt(run['send_lag_p99_s'], 'ms')} "
        f"ms, max {_fmt(run['send_lag_max_s'], 'ms')} ms, load generator CPU "
        f"{_fmt(run.get('client_cpu_share'), 'pct')} of a core (open-loop health: both should "
        "stay small).",
        "",
    ]
    lag, cpu = run.get("send_lag_p99_s"), run.get("client_cpu_share")
    if (lag is not None and lag > LAG_WARN_S) or (cpu is not None and cpu > CPU_WARN):
        lines += [
            "**Warning:** the load generator fell behind (send lag p99 "
            f"{_fmt(lag, 'ms')} ms, CPU {_fmt(cpu, 'pct')}): requests left later than "
            "scheduled, so this run under-states the load. Check what else runs on the machine.",
            "",
        ]
    if run.get("top_errors"):
        lines += ["Errors: " + "; ".join(f"{k} (x{v})" for k, v in run["top_errors"].items()), ""]
    rows = []
    for c, cs in t["classes"].items():
        rows.append(
            [
                c,
                str(cs["requests"]),
                _fmt(cs["attainment"], "pct"),
                _fmt(cs["goodput_rps"]),
                _fmt(cs["ttft_p50_s"], "ms"),
                _fmt(cs["ttft_p90_s"], "ms"),
                _fmt(cs["ttft_p99_s"], "ms"),
                _fmt(cs["itl_p50_s"], "ms"),
                _fmt(cs["itl_p99_s"], "ms"),
                _fmt(cs["max_gap_p50_s"], "ms"),
                _fmt(cs["tpot_p50_s"], "ms"),
                _fmt(cs["e2e_p50_s"], "ms"),
                _fmt(cs["e2e_p99_s"], "ms"),
                _fmt(cs["input_tokens_per_s"]),
                _fmt(cs["output_tokens_per_s"]),
            ]
        )
    lines += _table(
        [
            "class",
            "req",
            "attain",
            "good/s",
            "TTFT p50",
            "p90",
            "p99",
            "gap p50",
            "gap p99",
            "largest gap p50",
            "TPOT p50",
            "e2e p50",
            "e2e p99",
            "in tok/s",
            "out tok/s",
        ],
        rows,
    )
    lines += ["Times in ms.", ""]
    fair_rows = []
    for scope, f in t["fairness"].items():
        for app, a in f["apps"].items():
            fair_rows.append(
                [
                    scope,
                    app,
                    _fmt(a["share"], "pct"),
                    _fmt(a["demand_share"], "pct"),
                    _fmt(a["fair_share"], "pct"),
                    _fmt(f["jain_service"]),
                    _fmt(f["jain_maxmin"]),
                ]
            )
    if fair_rows:
        lines += ["Per app (token service in the steady window):", ""]
        lines += _table(
            ["scope", "app", "share", "demand share", "fair share", "Jain", "Jain (max-min)"],
            fair_rows,
        )
    server_rows = [
        [src, metric, _fmt(v["mean"]), _fmt(v["max"]), _fmt(v.get("increase"))]
        for src, metrics in t["server"].items()
        for metric, v in metrics.items()
    ]
    if server_rows:
        lines += ["Server side (sampled every 0.5 s):", ""]
        lines += _table(["source", "metric", "mean", "max", "increase"], server_rows)
    return lines


def render(summary: dict[str, Any]) -> str:
    """The markdown report of a `run` or `compare` summary."""
    sc = summary["scenario"]
    lines = [
        f"# Load test: {sc['name']}",
        "",
        sc.get("description", ""),
        "",
        f"Seed {sc['seed']}, arrivals for {sc['duration_s']:g} s, warm-up {sc['warmup_s']:g} s "
        f"(steady window {sc['duration_s'] - sc['warmup_s']:g} s). "
        f"Prompt calibration: {summary.get('calibration', {}).get('source', '-')}. "
        + box.line(summary.get("box")),
        "",
    ]
    flows = sc.get("flows", [])
    if flows:
        lines += _table(
            ["flow", "endpoint", "stream", "requests", "req/s", "prompt tok", "output tok"],
            [
                [
                    f["flow"],
                    f["endpoint"],
                    "yes" if f["stream"] else "no",
                    str(f["requests"]),
                    _fmt(f["rate_planned"]),
                    _fmt(f["prompt_tokens_mean"]),
                    _fmt(f["output_tokens_mean"]),
                ]
                for f in flows
            ],
        )
    lines += _side_by_side(summary)
    for name, t in summary["targets"].items():
        lines += _target_details(name, t)
    plots = summary.get("plots") or []
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    lines += [DEFINITIONS, ""]
    return "\n".join(lines)
