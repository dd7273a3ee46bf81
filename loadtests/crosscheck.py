"""Cross-check the runner against vLLM's own serving benchmark (`vllm.benchmarks.serve`).

For a single-class Poisson load sent straight to a vLLM worker, the runner's median TTFT and
TPOT should agree with what vLLM's benchmark measures on the same load (within 10%).

Both tools send the same kind of workload, built by vLLM's own code: the prompts of vLLM's
`random` dataset and the send times of its `get_request` (exactly `--num-prompts` requests,
Poisson gaps rescaled so the last one leaves at num_prompts / rate), streaming
`/v1/completions` with `ignore_eos`, no warm-up request (vLLM skips its ready check by
default). A helper run in the vLLM environment (`.venv-vllm`, which the gateway environment
does not have) dumps that workload for a seed, and the runner sends it. Each run has its own
seed: prompts sent twice would hit vLLM's prefix cache the second time. vLLM's benchmark runs
with aiohttp's `trust_env` off, like the runner (see `_VLLM_BENCH`; `--vllm-trust-env` keeps
it on). Rounds alternate which tool goes first, so that drift on a shared machine hits both.

Around every run the worker's `/metrics` are read: the server-side mean TTFT (vLLM's
histogram) is a third opinion on the same requests, and the prefix-cache hit rate shows how
much of the prompts the worker had cached.

    hearthgate bench crosscheck --url http://127.0.0.1:18200 --rate 4 --rounds 6
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hearthgate.loadtests.runner import Endpoints, run_workload
from hearthgate.loadtests.sampler import worker_values
from hearthgate.loadtests.scenario import Scenario, validate_scenario
from hearthgate.loadtests.stats import percentile
from hearthgate.loadtests.workload import PlannedRequest

REPO_ROOT = Path(__file__).resolve().parents[1]

# vLLM's benchmark, unchanged except that, unless HEARTHGATE_VLLM_TRUST_ENV=1, its aiohttp
# session is made with trust_env=False (as the runner's is). With trust_env=True (serve.py's
# ClientSession), aiohttp looks up ~/.netrc and the proxy variables for every request in the
# default thread pool (`run_in_executor`, then `asyncio.to_thread`) after the benchmark has
# started the request's TTFT clock: two thread handoffs per request, which on a busy 2-core
# machine raised vLLM's median TTFT by 3 to 20 ms (14-35%) over the runner's; see
# loadtests/results/crosscheck.md. Nothing sent changes: no proxy is set, no .netrc.
_VLLM_BENCH = """
import os, sys
import aiohttp
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
if os.environ.get("HEARTHGATE_VLLM_TRUST_ENV") != "1":
    _session = aiohttp.ClientSession
    def _session_without_env(*args, **kwargs):
        kwargs["trust_env"] = False
        return _session(*args, **kwargs)
    aiohttp.ClientSession = _session_without_env
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""

# The workload `vllm.benchmarks.serve` sends for the same arguments, by its own code and in the
# order of its `main_async`: seed `random` and numpy, load the tokenizer, sample the dataset,
# align it to the server's tokenizer; then `get_request` draws the gaps (numpy's global
# generator) and sleeps until each send time, here on a virtual clock so that it returns at
# once. Writes {"vllm": version, "requests": [{prompt, prompt_len, output_len, t}]} to argv[1].
_VLLM_WORKLOAD = """
import asyncio, json, random, sys, time
import numpy as np
import vllm
from vllm.benchmarks import serve
from vllm.benchmarks.datasets import get_samples
from vllm.tokenizers import get_tokenizer
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = sys.argv[1]
parser = FlexibleArgumentParser()
serve.add_cli_args(parser)
args = parser.parse_args(sys.argv[2:])
random.seed(args.seed)
np.random.seed(args.seed)
tokenizer = get_tokenizer(
    args.tokenizer, tokenizer_mode=args.tokenizer_mode, trust_remote_code=args.trust_remote_code
)
requests = get_samples(args, tokenizer)
requests = asyncio.run(
    serve._align_prompts_to_server_tokenizer(args.base_url, args.model, requests)
)
now = [0.0]
async def virtual_sleep(seconds):
    now[0] += seconds
time.time = lambda: now[0]
asyncio.sleep = virtual_sleep
async def send_times():
    return [now[0] async for _ in serve.get_request(requests, args.request_rate, args.burstiness)]
times = asyncio.run(send_times())
rows = [
    {"prompt": r.prompt, "prompt_len": r.prompt_len, "output_len": r.expected_output_len, "t": t}
    for r, t in zip(requests, times, strict=True)
]
with open(out, "w") as fh:
    json.dump({"vllm": vllm.__version__, "requests": rows}, fh)
"""

# Server-side series read around each run (summed over label sets).
SERVER_METRICS: tuple[str, ...] = (
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
)


def vllm_args(args: argparse.Namespace, seed: int) -> list[str]:
    """The arguments of `vllm.benchmarks.serve` for one run (also given to the workload
    helper, so both read the same settings)."""
    return [
        "--backend",
        "vllm",
        "--base-url",
        args.url,
        "--endpoint",
        "/v1/completions",
        "--model",
        args.model,
        "--tokenizer",
        str(REPO_ROOT / args.tokenizer),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(args.input_len),
        "--random-output-len",
        str(args.output_len),
        "--random-range-ratio",
        "0",
        "--random-prefix-len",
        "0",
        "--num-prompts",
        str(args.num_prompts),
        "--request-rate",
        str(args.rate),
        "--burstiness",
        "1",
        "--ignore-eos",
        "--temperature",
        "0",
        "--seed",
        str(seed),
    ]


def scenario_for(args: argparse.Namespace, seed: int) -> Scenario:
    """The scenario the runner needs around the planned requests (app, class, timeout)."""
    return validate_scenario(
        {
            "name": "crosscheck",
            "seed": seed,
            "duration_s": args.num_prompts / args.rate,
            "warmup_s": 0,
            "prime_requests": 0,
            "apps": {"bench": {}},
            "classes": {"single": {}},
            "flows": [
                {
                    "class": "single",
                    "app": "bench",
                    "endpoint": "completions",
                    "model": args.model,
                    "prompt_tokens": args.input_len,
                    "output_tokens": args.output_len,
                    "arrival": {"process": "poisson", "rate": args.rate},
                }
            ],
        }
    )


def vllm_workload(args: argparse.Namespace, seed: int, workdir: Path) -> list[dict[str, Any]]:
    """vLLM's random-dataset prompts and send times for `seed` (run in the vLLM venv)."""
    out = workdir / f"workload-{seed}.json"
    cmd = [
        str(REPO_ROOT / args.vllm_python),
        "-c",
        _VLLM_WORKLOAD,
        str(out),
        *vllm_args(args, seed),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"vLLM workload failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    rows: list[dict[str, Any]] = json.loads(out.read_text())["requests"]
    return rows


def planned_requests(rows: Sequence[dict[str, Any]], model: str) -> list[PlannedRequest]:
    """The runner's requests for a vLLM workload: same prompt text, output length, send time."""
    return [
        PlannedRequest(
            id=f"single#{i}",
            flow="single/bench",
            klass="single",
            app="bench",
            endpoint="completions",
            model=model,
            stream=True,
            scheduled_s=round(float(row["t"]), 6),
            prompt_tokens=int(row["prompt_len"]),
            output_tokens=int(row["output_len"]),
            priority=0,
            warmup=False,
            prompt=str(row["prompt"]),
        )
        for i, row in enumerate(rows)
    ]


def send_lags(sent: Sequence[float], scheduled: Sequence[float]) -> list[float]:
    """How late each request left, when the clock's origin is unknown (vLLM's start times are
    absolute): lags relative to the least late request."""
    offsets = [s - t for s, t in zip(sent, scheduled, strict=True)]
    base = min(offsets, default=0.0)
    return [o - base for o in offsets]


def _server(url: str) -> dict[str, float]:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=10) as resp:
            return worker_values(resp.read().decode(), SERVER_METRICS)
    except OSError:
        return {}


def server_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """Server-side mean TTFT and prefix-cache hit rate over the requests between two reads."""

    def d(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    count = d("vllm:time_to_first_token_seconds_count")
    queries = d("vllm:prefix_cache_queries_total")
    return {
        "server_mean_ttft_ms": round(1000 * d("vllm:time_to_first_token_seconds_sum") / count, 3)
        if count > 0
        else None,
        "prefix_cache_hit_rate": round(d("vllm:prefix_cache_hits_total") / queries, 4)
        if queries > 0
        else None,
    }


def _ms(value: float | None) -> float | None:
    return None if value is None else round(1000 * value, 3)


def run_ours(args: argparse.Namespace, seed: int, workdir: Path) -> dict[str, Any]:
    rows = vllm_workload(args, seed, workdir)
    reqs = planned_requests(rows, args.model)
    sc = scenario_for(args, seed)
    target = Endpoints("hearthgate-bench", args.url)

    async def go() -> dict[str, Any]:
        before = _server(args.url)
        result = await run_workload(sc, reqs, target)
        after = _server(args.url)
        ok = [r for r in result.records if r.outcome == "ok"]
        ttft = [t for r in ok if (t := r.ttft_s) is not None]
        tpot = [t for r in ok if (t := r.tpot_s) is not None]
        sent = [r for r in result.records if r.sent_s is not None]
        lags = send_lags([r.sent_s or 0.0 for r in sent], [r.scheduled_s for r in sent])
        return {
            "seed": seed,
            "completed": len(ok),
            "requests": len(result.records),
            "median_ttft_ms": _ms(percentile(ttft, 50)),
            "median_tpot_ms": _ms(percentile(tpot, 50)),
            "prompt_tokens_mean": statistics.fmean(r.prompt_tokens or 0 for r in ok)
            if ok
            else None,
            "send_lag_p50_ms": _ms(percentile(lags, 50)),
            "send_lag_p99_ms": _ms(percentile(lags, 99)),
            **server_delta(before, after),
        }

    return asyncio.run(go())


def run_vllm(args: argparse.Namespace, seed: int, workdir: Path) -> dict[str, Any]:
    # The same workload as the benchmark draws itself, only to measure its send lag.
    rows = vllm_workload(args, seed, workdir)
    name = f"vllm-bench-{seed}.json"
    cmd = [
        str(REPO_ROOT / args.vllm_python),
        "-c",
        _VLLM_BENCH,
        *vllm_args(args, seed),
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(workdir),
        "--result-filename",
        name,
    ]
    env = dict(os.environ, HEARTHGATE_VLLM_TRUST_ENV="1" if args.vllm_trust_env else "0")
    before = _server(args.url)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800, env=env)
    after = _server(args.url)
    if proc.returncode != 0:
        raise RuntimeError(f"vllm bench failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    data = json.loads((workdir / name).read_text())
    starts = data.get("start_times") or []
    lags = send_lags(starts, [float(r["t"]) for r in rows]) if len(starts) == len(rows) else []
    return {
        "seed": seed,
        "completed": data.get("completed"),
        "requests": args.num_prompts,
        "median_ttft_ms": data.get("median_ttft_ms"),
        "median_tpot_ms": data.get("median_tpot_ms"),
        "prompt_tokens_mean": (data.get("total_input_tokens") or 0) / max(1, args.num_prompts),
        "send_lag_p50_ms": _ms(percentile(lags, 50)),
        "send_lag_p99_ms": _ms(percentile(lags, 99)),
        **server_delta(before, after),
    }


def _rel(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b - 1, 4)


def compare(rounds: list[dict[str, Any]], tolerance: float) -> dict[str, Any]:
    def med(tool: str, key: str) -> float | None:
        xs = [r[tool][key] for r in rounds if r[tool].get(key) is not None]
        return round(statistics.median(xs), 3) if xs else None

    out: dict[str, Any] = {"rounds": rounds}
    for key in ("median_ttft_ms", "median_tpot_ms"):
        ours, theirs = med("hearthgate", key), med("vllm", key)
        diff = _rel(ours, theirs)
        out[key] = {
            "hearthgate": ours,
            "vllm": theirs,
            "relative_difference": diff,
            "within_tolerance": diff is not None and abs(diff) <= tolerance,
        }
    out["agree"] = all(out[k]["within_tolerance"] for k in ("median_ttft_ms", "median_tpot_ms"))
    out["server_mean_ttft_ms"] = {
        "hearthgate": med("hearthgate", "server_mean_ttft_ms"),
        "vllm": med("vllm", "server_mean_ttft_ms"),
    }
    return out


def _fmt(value: Any, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def render(result: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        "# Cross-check: hearthgate bench versus vLLM's serving benchmark",
        "",
        f"Single class, {args.num_prompts} requests at {args.rate:g} req/s (Poisson), "
        f"{args.input_len} prompt tokens, {args.output_len} output tokens (`ignore_eos`), "
        f"streaming `/v1/completions` on {args.url}; {args.rounds} alternating rounds, "
        "medians of the per-round medians. Both tools send the same workload, built by "
        "vLLM's own code: the prompts of its `random` dataset and the send times of its "
        "`get_request`; each run has its own seed. vLLM's benchmark runs with aiohttp's "
        f"`trust_env` {'on (as shipped)' if args.vllm_trust_env else 'off, like the runner'}.",
        "",
        "| metric | hearthgate bench | vllm bench serve | difference |",
        "|---|---|---|---|",
    ]
    for key, label in (("median_ttft_ms", "TTFT p50 (ms)"), ("median_tpot_ms", "TPOT p50 (ms)")):
        row = result[key]
        diff = row["relative_difference"]
        lines.append(
            f"| {label} | {row['hearthgate']} | {row['vllm']} | "
            f"{'-' if diff is None else f'{100 * diff:+.1f}%'} |"
        )
    verdict = "agree" if result["agree"] else "do NOT agree"
    lines += [
        "",
        f"Within {100 * args.tolerance:.0f}%: the two {verdict}.",
        "",
        "Per run: client-side medians, the worker's own mean TTFT over the same requests "
        "(`vllm:time_to_first_token_seconds`), how late requests left (send lag, relative to "
        "the least late one) and the prefix-cache hit rate.",
        "",
        "| round | tool | seed | TTFT p50 | TPOT p50 | server TTFT mean | send lag p50 / p99 "
        "| prefix hits |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, rnd in enumerate(result["rounds"], start=1):
        for tool in ("hearthgate", "vllm"):
            r = rnd[tool]
            lines.append(
                f"| {i} | {tool} | {r.get('seed', '-')} | {_fmt(r.get('median_ttft_ms'))} | "
                f"{_fmt(r.get('median_tpot_ms'), '.2f')} | "
                f"{_fmt(r.get('server_mean_ttft_ms'))} | "
                f"{_fmt(r.get('send_lag_p50_ms'))} / {_fmt(r.get('send_lag_p99_ms'))} | "
                f"{_fmt(r.get('prefix_cache_hit_rate'), '.1%')} |"
            )
    lines.append("")
    return "\n".join(lines)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="vLLM worker base URL")
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--tokenizer", default=".models/tiny-llama", help="model folder for vLLM")
    p.add_argument("--vllm-python", default=".venv-vllm/bin/python")
    p.add_argument("--rate", type=float, default=4.0)
    p.add_argument("--num-prompts", type=int, default=120)
    p.add_argument("--input-len", type=int, default=200)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument(
        "--seed",
        type=int,
        default=1000,
        help="first seed; run k uses seed + k (change it to re-run on the same worker, whose "
        "prefix cache still holds the earlier prompts)",
    )
    p.add_argument(
        "--vllm-trust-env",
        action="store_true",
        help="run vLLM's benchmark with its own aiohttp trust_env=True (netrc and proxy "
        "look-ups in a thread pool inside its TTFT clock); by default it is turned off",
    )
    p.add_argument("--tolerance", type=float, default=0.10)
    p.add_argument("--out", type=Path, default=Path("loadtests/results"))


def run(args: argparse.Namespace) -> int:
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for i in range(args.rounds):
            ours_seed, vllm_seed = args.seed + 2 * i, args.seed + 2 * i + 1
            print(f"crosscheck: round {i + 1}/{args.rounds}", file=sys.stderr, flush=True)
            # Alternate which tool goes first, so slow drift affects both alike.
            if i % 2 == 0:
                ours = run_ours(args, ours_seed, work)
                theirs = run_vllm(args, vllm_seed, work)
            else:
                theirs = run_vllm(args, vllm_seed, work)
                ours = run_ours(args, ours_seed, work)
            rounds.append({"hearthgate": ours, "vllm": theirs})
    result = compare(rounds, args.tolerance)
    keys = ("url", "model", "rate", "num_prompts", "input_len", "output_len", "rounds")
    keys_more = ("seed", "vllm_trust_env")
    result["settings"] = {k: getattr(args, k) for k in (*keys, *keys_more)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "crosscheck.json").write_text(json.dumps(result, indent=1) + "\n")
    md = render(result, args)
    (args.out / "crosscheck.md").write_text(md)
    print(md)
    return 0 if result["agree"] else 1
