"""`hearthgate bench batch`: the Batch API with real vLLM and real Redis.

Four measurements, interleaved round by round (round i runs A, C, D, B in that order, so
box drift affects all of them alike):

- **A**: interactive attainment (the scenario's interactive flows: home-mix without its
  rag, embed and batch flows) through a fresh gateway, no batch running;
- **C**: the batch's lines per second through a fresh gateway, no interactive load;
- **D**: the same lines sent straight to vLLM by a client at full concurrency (generation
  lines to the gen worker, embeddings lines to the embeddings worker, each with at most
  ``--concurrency`` in flight, both at once), no interactive load;
- **B**: A again with the batch running (created ``--batch-lead`` seconds before the
  interactive warm-up requests), and **E**: the batch's lines per second while the
  interactive arrivals are on, from B's polls.

The batch is ``--lines`` lines: ``--summary-fraction`` of them long-prompt summaries (the
prompt lengths of the scenario's RAG flow, ``--summary-tokens`` out, ``temperature 0``,
``ignore_eos``), the rest short embeddings inputs (the lengths of its embeddings flow). One
batch per endpoint, both created at once by one app (``nightly``). A batch run's lines/s =
lines / (time from the first ``POST /v1/batches`` until the last batch was seen completed,
polling ``GET /v1/batches/{id}`` every ``--poll-interval`` s); for D, lines / (first request
to last response). Every measurement gets its own prompt words (same lengths), so vLLM's
prefix cache never serves one measurement from another's prompts.

Workers (the layout of ``loadtests/targets/local.yaml``: gen worker core 1, embeddings
worker core 0, gateway and this load generator core 0) and Redis (``.run/bench/redis``,
core 0) start once; each measurement gets a fresh gateway and an emptied Redis (so no
fair-share snapshot carries over). Everything started is stopped on every exit path.

Pure parts (line generation, the rates, the aggregation, the report) are at the top;
processes and the command line at the bottom.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import itertools
import json
import os
import random
import shlex
import signal
import statistics
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp
import yaml

from hearthgate.deploy.gateway_process import GatewayProcess, wait_http
from hearthgate.deploy.redis_server import RedisServer
from hearthgate.deploy.vllm_worker import VllmWorker, start_all, stop_all
from hearthgate.loadtests import bench
from hearthgate.loadtests.lengths import sample_length
from hearthgate.loadtests.markdown import _fmt, _table
from hearthgate.loadtests.matrix import Options, warm_up_fresh_worker
from hearthgate.loadtests.prompts import Calibration, build_prompt
from hearthgate.loadtests.records import RequestRecord
from hearthgate.loadtests.report import summarize
from hearthgate.loadtests.runner import Endpoints, prime, run_workload
from hearthgate.loadtests.sampler import worker_values
from hearthgate.loadtests.scenario import (
    ENDPOINT_PATHS,
    LengthDist,
    Scenario,
    ScenarioError,
    UniformLength,
    load_scenario,
)
from hearthgate.loadtests.targets import REPO_ROOT, TargetError, TargetsFile, load_targets
from hearthgate.loadtests.workload import PlannedRequest, plan

DEFAULT_OUT = Path("loadtests/results")
DEFAULT_GATEWAY_CONFIG = "loadtests/targets/gateway-defaults.yaml"
INTERACTIVE_WITHOUT = "rag,embed,batch"
ORDER = ("A", "C", "D", "B")
# The interactive runs' names in their own report ({tag}-interactive.md).
RUN_NAMES = {"A": "A-no-batch", "B": "B-with-batch"}
FINAL = ("completed", "failed", "expired", "cancelled")
ATTAINMENT_TOLERANCE = 0.01  # B may be at most 1 point below A
THROUGHPUT_TARGET = 0.9  # C / D
SUMMARY_DEFAULT = UniformLength(dist="uniform", min=1500, max=2000)
EMBED_DEFAULT = UniformLength(dist="uniform", min=16, max=64)

Log = Callable[[str], None]


# ---------------------------------------------------------------- the batch's lines


@dataclass(frozen=True)
class BatchShape:
    """What one batch run sends: ``lines`` lines, ``summary_fraction`` of them summaries."""

    lines: int = 5000
    summary_fraction: float = 0.2
    summary_endpoint: str = "chat"  # chat | completions
    summary_prompt: LengthDist = SUMMARY_DEFAULT
    summary_tokens: int = 32
    embed_prompt: LengthDist = EMBED_DEFAULT
    app: str = "nightly"
    klass: str = "batch"
    seed: int = 42

    def counts(self) -> tuple[int, int]:
        """(summary lines, embeddings lines)."""
        return split_counts(self.lines, self.summary_fraction)

    def endpoints(self) -> list[str]:
        """The batch endpoints, one batch each (a part without lines has none)."""
        n_sum, n_emb = self.counts()
        return [
            ep
            for ep, n in (
                (ENDPOINT_PATHS[self.summary_endpoint], n_sum),
                (ENDPOINT_PATHS["embeddings"], n_emb),
            )
            if n
        ]

    def describe(self) -> dict[str, Any]:
        n_sum, n_emb = self.counts()
        return {
            "lines": self.lines,
            "summary_fraction": self.summary_fraction,
            "summary_lines": n_sum,
            "embed_lines": n_emb,
            "summary_endpoint": ENDPOINT_PATHS[self.summary_endpoint],
            "summary_prompt_tokens": self.summary_prompt.model_dump(),
            "summary_max_tokens": self.summary_tokens,
            "embed_prompt_tokens": self.embed_prompt.model_dump(),
            "app": self.app,
            "seed": self.seed,
        }


def split_counts(lines: int, fraction: float) -> tuple[int, int]:
    """(summaries, embeddings) of ``lines`` lines with ``fraction`` summaries (rounded)."""
    if lines < 1:
        raise ValueError("a batch needs at least one line")
    if not 0 <= fraction <= 1:
        raise ValueError(f"summary fraction must be within [0, 1], got {fraction}")
    n_sum = round(lines * fraction)
    return n_sum, lines - n_sum


def shape_from(scenario: Scenario, **kw: Any) -> BatchShape:
    """A shape whose summary prompts follow the scenario's RAG flow and whose embeddings
    inputs follow its embeddings flow (the defaults when it has none)."""
    rag = next((f for f in scenario.flows if f.klass == "rag"), None)
    emb = next((f for f in scenario.flows if f.endpoint == "embeddings"), None)
    return BatchShape(
        summary_prompt=rag.prompt_tokens if rag is not None else SUMMARY_DEFAULT,
        embed_prompt=emb.prompt_tokens if emb is not None else EMBED_DEFAULT,
        seed=scenario.seed,
        **kw,
    )


def plan_lines(
    shape: BatchShape, scenario: Scenario, cal: Calibration, label: str
) -> dict[str, list[PlannedRequest]]:
    """The batch's requests by batch endpoint (``/v1/chat/completions`` or
    ``/v1/completions``, and ``/v1/embeddings``; an empty part is left out). Lengths follow
    ``shape.seed`` only, so every measurement sends the same token counts; the words follow
    ``label`` too, so no two measurements share a prompt (vLLM's prefix cache)."""
    n_sum, n_emb = shape.counts()
    priority = scenario.classes[shape.klass].priority if shape.klass in scenario.classes else 0
    out: dict[str, list[PlannedRequest]] = {}
    parts = (
        ("sum", shape.summary_endpoint, n_sum, shape.summary_prompt, shape.summary_tokens),
        ("emb", "embeddings", n_emb, shape.embed_prompt, None),
    )
    for part, endpoint, n, dist, out_tokens in parts:
        if n == 0:
            continue
        lengths = random.Random(f"{shape.seed}:batch:{part}:lengths")
        words = random.Random(f"{shape.seed}:batch:{part}:words:{label}")
        ecal = cal.for_endpoint(endpoint)
        reqs = []
        for i in range(n):
            p = sample_length(dist, lengths)
            reqs.append(
                PlannedRequest(
                    id=f"{part}-{i:05d}",
                    flow=f"batch/{part}",
                    klass=shape.klass,
                    app=shape.app,
                    endpoint=endpoint,
                    model=scenario.models.for_endpoint(endpoint),
                    stream=False,
                    scheduled_s=0.0,
                    prompt_tokens=p,
                    output_tokens=out_tokens,
                    priority=priority,
                    warmup=False,
                    prompt=build_prompt(p, words, ecal),
                )
            )
        out[ENDPOINT_PATHS[endpoint]] = reqs
    return out


def batch_line(req: PlannedRequest) -> dict[str, Any]:
    """One line of a Batch API input file for ``req`` (the body the load tester sends)."""
    return {
        "custom_id": req.id,
        "method": "POST",
        "url": req.path,
        "body": req.body(send_priority=False),
    }


def to_jsonl(reqs: Sequence[PlannedRequest]) -> bytes:
    return "".join(json.dumps(batch_line(r)) + "\n" for r in reqs).encode()


# ---------------------------------------------------------------- rates and aggregation


def lines_per_s(lines: int, start: float, end: float | None) -> float | None:
    """``lines`` / (``end`` - ``start``); None without an end or a positive span."""
    if end is None or end <= start:
        return None
    return lines / (end - start)


def done_at(polls: Sequence[tuple[float, int]], t: float) -> float:
    """Lines done at time ``t``, linearly interpolated between polls (time, done)."""
    if not polls:
        return 0.0
    if t <= polls[0][0]:
        return float(polls[0][1])
    for (t0, d0), (t1, d1) in itertools.pairwise(polls):
        if t0 <= t <= t1:
            return d0 + (d1 - d0) * ((t - t0) / (t1 - t0)) if t1 > t0 else float(d1)
    return float(polls[-1][1])


def rate_in_window(
    polls: Sequence[tuple[float, int]], lo: float, hi: float, ended: float | None = None
) -> tuple[float | None, float]:
    """(lines per second within [lo, hi], the fraction of [lo, hi] the batch was running).
    A batch that ended at ``ended`` inside the window is counted up to then; one that ended
    before ``lo`` has no rate."""
    if hi <= lo:
        return None, 0.0
    top = hi if ended is None else min(hi, ended)
    coverage = max(0.0, (top - lo) / (hi - lo))
    if top <= lo:
        return None, 0.0
    return (done_at(polls, top) - done_at(polls, lo)) / (top - lo), coverage


def median(values: Sequence[float | None]) -> float | None:
    xs = [float(v) for v in values if v is not None]
    return statistics.median(xs) if xs else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def aggregate(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds with each round's value, B - A in points, C / D, and
    whether the targets are met. A round is ``{"A": {"attainment"}, "B": {"attainment",
    "lines_per_s"}, "C": {"lines_per_s"}, "D": {"lines_per_s"}}`` (E is B's lines_per_s)."""

    def runs(step: str, key: str) -> list[float | None]:
        return [(r.get(step) or {}).get(key) for r in rounds]

    series = {
        "A": runs("A", "attainment"),
        "B": runs("B", "attainment"),
        "C": runs("C", "lines_per_s"),
        "D": runs("D", "lines_per_s"),
        "E": runs("B", "lines_per_s"),
    }
    out: dict[str, Any] = {k: {"median": median(v), "runs": v} for k, v in series.items()}
    deltas = [
        None if a is None or b is None else b - a
        for a, b in zip(series["A"], series["B"], strict=True)
    ]
    ratios = [_ratio(c, d) for c, d in zip(series["C"], series["D"], strict=True)]
    a_med, b_med = out["A"]["median"], out["B"]["median"]
    delta = None if a_med is None or b_med is None else b_med - a_med
    ratio = _ratio(out["C"]["median"], out["D"]["median"])
    out["B_minus_A"] = {"median": delta, "runs": deltas}
    out["C_over_D"] = {"median": ratio, "runs": ratios}
    out["E_over_C"] = {"median": _ratio(out["E"]["median"], out["C"]["median"])}
    out["targets"] = {
        "attainment_within_1_point": None if delta is None else delta >= -ATTAINMENT_TOLERANCE,
        "throughput_ratio_at_least_0.9": None if ratio is None else ratio >= THROUGHPUT_TARGET,
    }
    return out


# ---------------------------------------------------------------- the report


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


# ---------------------------------------------------------------- talking to the gateway


class BatchClient:
    """The Files and Batches endpoints of a gateway, as app ``key``."""

    def __init__(self, session: aiohttp.ClientSession, url: str, key: str) -> None:
        self.s = session
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {key}"}

    async def _json(self, resp: aiohttp.ClientResponse, what: str) -> dict[str, Any]:
        text = await resp.text()
        if resp.status != 200:
            raise RuntimeError(f"{what}: HTTP {resp.status}: {text[:300]}")
        obj: dict[str, Any] = json.loads(text)
        return obj

    async def upload(self, data: bytes, name: str) -> str:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", data, filename=name, content_type="application/jsonl")
        async with self.s.post(f"{self.url}/v1/files", data=form, headers=self.headers) as resp:
            return str((await self._json(resp, f"upload {name}"))["id"])

    async def create(self, file_id: str, endpoint: str) -> dict[str, Any]:
        body = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"}
        async with self.s.post(f"{self.url}/v1/batches", json=body, headers=self.headers) as r:
            return await self._json(r, f"create batch on {endpoint}")

    async def get(self, bid: str) -> dict[str, Any]:
        async with self.s.get(f"{self.url}/v1/batches/{bid}", headers=self.headers) as resp:
            return await self._json(resp, f"get {bid}")

    async def cancel(self, bid: str) -> dict[str, Any]:
        async with self.s.post(f"{self.url}/v1/batches/{bid}/cancel", headers=self.headers) as r:
            return await self._json(r, f"cancel {bid}")


@dataclass
class BatchRun:
    """One submission of the batches and what the polls saw."""

    created_s: float  # just before the first POST /v1/batches
    lines: int
    ids: dict[str, str] = field(default_factory=dict)  # endpoint -> batch id
    sizes: dict[str, int] = field(default_factory=dict)  # endpoint -> lines
    ended_s: dict[str, float] = field(default_factory=dict)  # endpoint -> first final poll
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)  # last seen
    polls: list[tuple[float, int]] = field(default_factory=list)  # (time, lines done)
    # the same per batch (endpoint -> (time, its lines done))
    polls_by: dict[str, list[tuple[float, int]]] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return len(self.ended_s) == len(self.ids)

    @property
    def end_s(self) -> float | None:
        return max(self.ended_s.values()) if self.finished and self.ended_s else None

    def statuses(self) -> dict[str, str]:
        return {ep: str(o.get("status")) for ep, o in self.objects.items()}

    def all_completed(self) -> bool:
        return self.finished and all(s == "completed" for s in self.statuses().values())

    def per_batch(self) -> dict[str, dict[str, Any]]:
        out = {}
        for ep, bid in self.ids.items():
            counts = (self.objects.get(ep) or {}).get("request_counts") or {}
            end = self.ended_s.get(ep)
            out[ep] = {
                "id": bid,
                "lines": self.sizes[ep],
                "status": (self.objects.get(ep) or {}).get("status"),
                "completed": counts.get("completed"),
                "failed": counts.get("failed"),
                "seconds": None if end is None else round(end - self.created_s, 3),
                "lines_per_s": _r(lines_per_s(self.sizes[ep], self.created_s, end)),
            }
        return out


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


async def submit_and_poll(
    client: BatchClient,
    files: dict[str, tuple[str, int]],
    *,
    interval_s: float = 0.5,
    stop: asyncio.Event | None = None,
    timeout_s: float = 3600.0,
    clock: Callable[[], float] = time.perf_counter,
) -> BatchRun:
    """Create one batch per ``files`` entry (endpoint -> (file id, lines)) at once, then poll
    them every ``interval_s`` until all are final, ``stop`` is set or ``timeout_s`` passed."""
    run = BatchRun(created_s=clock(), lines=sum(n for _, n in files.values()))
    created = await asyncio.gather(*(client.create(fid, ep) for ep, (fid, _) in files.items()))
    for (ep, (_, n)), obj in zip(files.items(), created, strict=True):
        run.ids[ep], run.sizes[ep], run.objects[ep] = str(obj["id"]), n, obj
    while True:
        tick = clock()
        objs = await asyncio.gather(*(client.get(b) for b in run.ids.values()))
        t = clock()
        done = 0
        for ep, obj in zip(run.ids, objs, strict=True):
            run.objects[ep] = obj
            counts = obj.get("request_counts") or {}
            mine = int(counts.get("completed") or 0) + int(counts.get("failed") or 0)
            run.polls_by.setdefault(ep, []).append((t, mine))
            done += mine
            if obj.get("status") in FINAL and ep not in run.ended_s:
                run.ended_s[ep] = t
        run.polls.append((t, done))
        if run.finished or (stop is not None and stop.is_set()):
            return run
        if t - run.created_s > timeout_s:
            raise TimeoutError(f"batches {run.statuses()} not done after {timeout_s:g} s")
        wait = max(0.0, interval_s - (clock() - tick))
        if stop is None:
            await asyncio.sleep(wait)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=wait)


async def cancel_all(client: BatchClient, run: BatchRun, timeout_s: float = 120.0) -> None:
    """Cancel the run's batches that are still going and wait until they are final."""
    going = [bid for ep, bid in run.ids.items() if ep not in run.ended_s]
    for bid in going:
        with contextlib.suppress(RuntimeError):
            await client.cancel(bid)
    deadline = time.monotonic() + timeout_s
    while going and time.monotonic() < deadline:
        objs = await asyncio.gather(*(client.get(b) for b in going))
        going = [b for b, o in zip(going, objs, strict=True) if o.get("status") not in FINAL]
        if going:
            await asyncio.sleep(0.5)
    if going:
        raise TimeoutError(f"batches {going} not final {timeout_s:g} s after cancel")


async def upload_all(
    client: BatchClient, lines: dict[str, list[PlannedRequest]], label: str
) -> dict[str, tuple[str, int]]:
    """Upload each endpoint's lines as one file; endpoint -> (file id, lines)."""
    out = {}
    for ep, reqs in lines.items():
        name = f"{label}-{ep.strip('/').replace('/', '-')}.jsonl"
        out[ep] = (await client.upload(to_jsonl(reqs), name), len(reqs))
    return out


# ---------------------------------------------------------------- one measurement


def _top_error(recs: Sequence[RequestRecord]) -> str | None:
    errors = [r.error for r in recs if r.outcome != "ok" and r.error]
    return max(set(errors), key=errors.count) if errors else None


async def gateway_batch(
    url: str,
    key: str,
    lines: dict[str, list[PlannedRequest]],
    label: str,
    *,
    interval_s: float,
    timeout_s: float,
) -> dict[str, Any]:
    """C (and the warm-up batch): upload, create both batches, poll until they end."""
    async with aiohttp.ClientSession() as session:
        client = BatchClient(session, url, key)
        files = await upload_all(client, lines, label)
        run = await submit_and_poll(client, files, interval_s=interval_s, timeout_s=timeout_s)
    ok = run.all_completed()
    return {
        "lines": run.lines,
        "lines_per_s": _r(lines_per_s(run.lines, run.created_s, run.end_s) if ok else None),
        "seconds": _r(None if run.end_s is None else run.end_s - run.created_s),
        "per_batch": run.per_batch(),
        "polls": len(run.polls),
        **({} if ok else {"error": f"batches ended {run.statuses()}"}),
    }


async def direct_lines(
    scenario: Scenario,
    lines: dict[str, list[PlannedRequest]],
    gen_url: str,
    embed_url: str,
    concurrency: int,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """D: every line straight to its vLLM worker, at most ``concurrency`` in flight per
    endpoint, both endpoints at once (the runner's warm-up sender, which is exactly that)."""
    target = Endpoints(name="direct", base_url=gen_url, embed_url=embed_url)
    ends: dict[str, float] = {}
    recs: dict[str, list[RequestRecord]] = {}

    async def part(ep: str, reqs: list[PlannedRequest]) -> None:
        recs[ep] = await prime(scenario, reqs, target, concurrency=concurrency)
        ends[ep] = clock()

    t0 = clock()
    await asyncio.gather(*(part(ep, reqs) for ep, reqs in lines.items()))
    t1 = max(ends.values())
    n = sum(len(r) for r in lines.values())
    failed = sum(1 for rs in recs.values() for r in rs if r.outcome != "ok")
    return {
        "lines": n,
        "lines_per_s": _r(lines_per_s(n, t0, t1)),
        "seconds": _r(t1 - t0),
        "failed": failed,
        "per_endpoint": {
            ep: {
                "lines": len(reqs),
                "seconds": _r(ends[ep] - t0),
                "lines_per_s": _r(lines_per_s(len(reqs), t0, ends[ep])),
                "failed": sum(1 for r in recs[ep] if r.outcome != "ok"),
                "top_error": _top_error(recs[ep]),
            }
            for ep, reqs in lines.items()
        },
    }


async def interactive_run(
    scenario: Scenario,
    reqs: list[PlannedRequest],
    prime_reqs: list[PlannedRequest],
    endpoints: Endpoints,
    *,
    batch: tuple[str, dict[str, list[PlannedRequest]], str] | None = None,
    lead_s: float = 5.0,
    interval_s: float = 0.5,
    timeout_s: float = 3600.0,
    progress: bool = True,
    log: Log = bench.stderr_log,
    info: dict[str, Any] | None = None,
) -> tuple[bench.TargetOutcome, dict[str, Any]]:
    """A (``batch`` None) or B: the interactive workload through the gateway, warm-up
    requests first, open loop, as ``bench.run_one`` runs it. With ``batch`` = (key, lines,
    label), the batch is uploaded, created ``lead_s`` before the warm-up requests, polled
    throughout and cancelled after the run; E is its lines/s over the arrival window."""
    async with aiohttp.ClientSession() as session:
        client = None
        poller: asyncio.Task[BatchRun] | None = None
        stop = asyncio.Event()
        if batch is not None:
            key, lines, label = batch
            client = BatchClient(session, endpoints.base_url, key)
            files = await upload_all(client, lines, label)
            poller = asyncio.create_task(
                submit_and_poll(
                    client, files, interval_s=interval_s, stop=stop, timeout_s=timeout_s
                )
            )
            await asyncio.sleep(lead_s)
            if poller.done():
                poller.result()  # a failed create raises here
        try:
            primed = await prime(scenario, prime_reqs, endpoints) if prime_reqs else []
            update, close = bench.progress_bar(endpoints.name, len(reqs), progress)
            log(f"batchbench: {endpoints.name}: {len(reqs)} interactive requests")
            t_call = time.perf_counter()
            try:
                result = await run_workload(scenario, reqs, endpoints, progress=update)
            finally:
                close()
        finally:
            stop.set()
        failures = sum(1 for r in primed if r.outcome != "ok")
        outcome = bench.TargetOutcome(endpoints, result, dict(info or {}), failures)
        att = summarize(result, scenario)["interactive"]["attainment"]
        row: dict[str, Any] = {"attainment": att, "prime_failures": failures}
        if poller is not None and client is not None:
            run = await poller
            # run_workload starts its clock 0.2 s after it is called (its lead_s)
            lo = t_call + 0.2
            hi = lo + scenario.duration_s
            ended = max(run.ended_s.values()) if run.ended_s else None
            rate, coverage = rate_in_window(run.polls, lo, hi, ended if run.finished else None)
            top = min(hi, ended) if run.finished and ended is not None else hi
            row.update(
                lines_per_s=_r(rate),
                batch_coverage=round(coverage, 3),
                lines_in_window={
                    ep: round(done_at(p, top) - done_at(p, lo)) for ep, p in run.polls_by.items()
                },
                batch_statuses=run.statuses(),
                per_batch=run.per_batch(),
            )
            await cancel_all(client, run)
    return outcome, row


# ---------------------------------------------------------------- processes


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
        from hearthgate.loadtests.targets import Launcher, TargetSpec

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


def effective_settings(settings: dict[str, Any]) -> dict[str, Any] | None:
    """The gateway's own view of the parts that matter here (its defaults filled in)."""
    try:
        from hearthgate.gateway.settings import load_settings

        s = load_settings(None, **settings)
    except Exception:  # best effort: the report still has the settings file
        return None
    gen = next((w for w in s.workers if w.role != "embeddings"), None)
    return {
        "batch": s.batch.model_dump(by_alias=True),
        "batch_class": s.classes[s.batch_class()].model_dump(),
        "scheduler": s.scheduler.model_dump(),
        "gen_worker_limits": gen.limits.model_dump() if gen is not None else None,
    }


def build_report(
    plan_: Plan,
    rig: Rig,
    got: dict[str, Any],
    *,
    tag: str,
    command: str,
    wall_s: float,
) -> dict[str, Any]:
    """The JSON summary: config, layout, settings, rounds, aggregated results."""
    rounds = got["rounds"]
    outcomes = got["outcomes"]
    inter: dict[str, Any] = {}
    if outcomes:
        s = bench.build_summary(plan_.inter, got["cal"], got["inter_reqs"], outcomes)
        inter = {
            "scenario": s["scenario"],
            "targets": {
                n: {"interactive": t["interactive"], "classes": t["classes"]}
                for n, t in s["targets"].items()
            },
        }
    lay = rig.layout
    gw_settings = rig.gateway_settings()
    notes = []
    for r in rounds:
        for step in ORDER:
            err = (r.get(step) or {}).get("error")
            if err:
                notes.append(f"round {r['round']} {step}: {err}")
        c_failed = sum(
            int(b.get("failed") or 0) for b in ((r.get("C") or {}).get("per_batch") or {}).values()
        )
        d_failed = int((r.get("D") or {}).get("failed") or 0)
        if c_failed or d_failed:
            tops = [
                e["top_error"]
                for e in ((r.get("D") or {}).get("per_endpoint") or {}).values()
                if e.get("top_error")
            ]
            notes.append(
                f"round {r['round']}: failed lines: C {c_failed}, D {d_failed}"
                + (f" (D: {tops[0]})" if tops else "")
            )
        cov = (r.get("B") or {}).get("batch_coverage")
        if cov is not None and cov < 1:
            notes.append(
                f"round {r['round']} B: the batch ran over {100 * cov:.0f}% of the interactive "
                "arrivals only (it finished early): B understates the batch's effect; use more "
                "--lines or a shorter --duration"
            )
    return {
        "version": 1,
        "kind": "batch",
        "tag": tag,
        "command": command,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "wall_s": round(wall_s, 1),
        "timings": got["timings"],
        "config": {
            "batch": plan_.shape.describe(),
            "endpoints": plan_.shape.endpoints(),
            "repeat": plan_.repeat,
            "order": list(ORDER),
            "concurrency": plan_.concurrency,
            "concurrency_scope": "per worker (both workers at once)",
            "batch_lead_s": plan_.batch_lead_s,
            "poll_interval_s": plan_.poll_interval_s,
            "warmup_lines": plan_.warmup_lines,
            "restart_warmup_s": plan_.restart_warmup_s,
            "interactive_scenario": plan_.inter.name,
            "interactive_flows": [f.label for f in plan_.inter.flows],
        },
        "layout": [
            {
                "what": f"vLLM gen worker (tiny-llama, :{rig.gen.port})",
                "core": lay.gen_worker.core,
                "nice": lay.gen_worker.nice,
                "detail": "OMP threads bound to this core; its API server and EngineCore "
                "processes are not pinned",
            },
            {
                "what": f"vLLM embeddings worker (minilm, :{rig.embed.port})",
                "core": lay.embed_worker.core,
                "nice": lay.embed_worker.nice,
                "detail": "OMP threads bound to this core",
            },
            {
                "what": f"gateway (:{lay.gateway_port}, fresh per measurement)",
                "core": lay.gateway_core,
                "detail": "process pinned",
            },
            {
                "what": "load generator (interactive runs, batch client, D client)",
                "core": lay.client_core,
                "detail": "this process, pinned after the workers started",
            },
            {
                "what": f"Redis (:{rig.redis.port}, {rig.redis.data_dir})",
                "core": lay.client_core,
                "detail": "appendonly everysec; inherits the load generator's pin",
            },
        ],
        "vllm": {
            w.kind: {
                "command": w.command(),
                "env": " ".join(
                    f"{k}={w.environment({}).get(k)}"
                    for k in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND")
                ),
                "ready_after_s": _r(w.ready_after, 1),
            }
            for w in (rig.gen, rig.embed)
        },
        "gateway": {
            "settings": {k: v for k, v in gw_settings.items() if k not in ("listen",)},
            "effective": effective_settings(gw_settings),
        },
        "calibration": got["calibration"],
        "rounds": rounds,
        "results": aggregate(rounds),
        "interactive": inter,
        "notes": notes,
    }


# ---------------------------------------------------------------- command line


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
