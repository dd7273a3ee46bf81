"""PNG plots of a run or comparison, drawn only when matplotlib is installed."""

from __future__ import annotations

import importlib.util
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hearthgate.loadtests.records import RequestRecord, Sample


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def ttft_cdf(
    records: Mapping[str, Sequence[RequestRecord]], classes: Sequence[str], path: Path
) -> Path:
    """One panel per class, one TTFT CDF line per target (completed measured requests)."""
    plt = _pyplot()
    n = len(classes)
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for i, cls in enumerate(classes):
        ax = axes[i // cols][i % cols]
        for target, recs in records.items():
            xs = sorted(
                t
                for r in recs
                if r.klass == cls and not r.warmup and r.outcome == "ok"
                if (t := r.ttft_s) is not None
            )
            if xs:
                ys = [(k + 1) / len(xs) for k in range(len(xs))]
                ax.step(xs, ys, where="post", label=target)
        ax.set_title(f"TTFT CDF: {cls}")
        ax.set_xscale("log")
        ax.set_xlabel("seconds")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=8)
    for j in range(n, rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _series(samples: Sequence[Sample], source: str, metric: str) -> tuple[list[float], list[float]]:
    """Times and values; for gateway gauges with labels, values are summed over labels."""
    by_t: dict[float, float] = defaultdict(float)
    found = False
    for s in samples:
        if s.source != source:
            continue
        for k, v in s.values.items():
            if k == metric or k.split("{", 1)[0] == metric:
                by_t[s.t_s] += v
                found = True
    if not found:
        return [], []
    ts = sorted(by_t)
    return ts, [by_t[t] for t in ts]


def queues_over_time(
    samples: Mapping[str, Sequence[Sample]], path: Path, window: tuple[float, float] | None = None
) -> Path | None:
    """Worker waiting/running/KV usage and every gateway gauge over time, per target."""
    panels: list[tuple[str, str]] = [
        ("worker", "vllm:num_requests_waiting"),
        ("worker", "vllm:num_requests_running"),
        ("worker", "vllm:kv_cache_usage_perc"),
    ]
    gateway_names = sorted(
        {
            k.split("{", 1)[0]
            for ss in samples.values()
            for s in ss
            if s.source == "gateway"
            for k in s.values
        }
    )
    panels += [("gateway", g) for g in gateway_names]
    panels = [
        (src, m) for src, m in panels if any(_series(ss, src, m)[0] for ss in samples.values())
    ]
    if not panels:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.4 * len(panels)), squeeze=False)
    for i, (src, metric) in enumerate(panels):
        ax = axes[i][0]
        for target, ss in samples.items():
            ts, vs = _series(ss, src, metric)
            if ts:
                ax.plot(ts, vs, label=target, linewidth=1)
        if window:
            ax.axvspan(window[0], window[1], color="grey", alpha=0.08)
        ax.set_title(f"{src}: {metric}", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1][0].set_xlabel("seconds since start (shaded: steady window)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def attainment_vs_rate(
    points: Mapping[str, Sequence[tuple[float, float | None]]], path: Path, threshold: float = 0.9
) -> Path:
    """Interactive attainment against the rate scale, one line per target (sweep mode)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for target, pts in points.items():
        xs = [x for x, y in pts if y is not None]
        ys = [y for _, y in pts if y is not None]
        ax.plot(xs, ys, marker="o", label=target)
    ax.axhline(threshold, color="red", linestyle="--", linewidth=1)
    ax.set_xlabel("rate scale (x scenario rates)")
    ax.set_ylabel("interactive attainment")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def frontier(
    points: Sequence[tuple[str, float, float | None]], path: Path, threshold: float = 0.9
) -> Path:
    """Goodput frontier of a settings sweep: background output tok/s (x) against interactive
    attainment (y), one labelled point per setting."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, x, y in points:
        if y is None:
            continue
        ax.scatter([x], [y])
        ax.annotate(label, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.axhline(threshold, color="red", linestyle="--", linewidth=1)
    ax.set_xlabel("background output tokens/s (steady window)")
    ax.set_ylabel("interactive attainment")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
