"""`hearthgate bench box`: how fast this box runs the CPU vLLM worker, next to the figures
the project's results were measured at (VLLM_CPU.md). A few minutes: one generation worker
on core 1, this client on core 0, every shape sent three times before it is timed."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp

from hearthgate.deploy import box
from hearthgate.deploy.vllm_worker import VllmWorker
from hearthgate.loadtests.prompts import build_text

# VLLM_CPU.md's table (AVX-512 machines, bf16): what "as fast as the results' box" means.
REFERENCE = {"short_ttft_ms": 90, "short_ms_per_token": 4.5, "long_ttft_ms": 200, "tok_s_32": 2400}


async def _stream(
    session: aiohttp.ClientSession, url: str, model: str, words: int, out: int
) -> tuple[float, float, int]:
    """(seconds to the first token, seconds per later token, tokens) of one streamed request."""
    body = {
        "model": model,
        "prompt": build_text(words, random.Random(words)),
        "max_tokens": out,
        "ignore_eos": True,
        "stream": True,
    }
    t0 = time.perf_counter()
    first: float | None = None
    n = 0
    async with session.post(url, json=body) as resp:
        resp.raise_for_status()
        async for raw in resp.content:
            line = raw.strip()
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                n += 1
                first = first if first is not None else time.perf_counter()
    assert first is not None, "no token streamed"
    return first - t0, (time.perf_counter() - first) / max(n - 1, 1), n


async def measure(base_url: str, model: str) -> dict[str, float]:
    url = base_url + "/v1/completions"
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        for _ in range(3):  # a fresh worker compiles for new shapes: send each first
            await _stream(s, url, model, 20, 32)
            await _stream(s, url, model, 600, 8)
            await asyncio.gather(*(_stream(s, url, model, 20, 128) for _ in range(32)))
        short = [await _stream(s, url, model, 20, 32) for _ in range(5)]
        long = [await _stream(s, url, model, 600, 1) for _ in range(5)]
        rates = []
        for _ in range(3):
            t0 = time.perf_counter()
            got = await asyncio.gather(*(_stream(s, url, model, 20, 128) for _ in range(32)))
            rates.append(sum(g[2] for g in got) / (time.perf_counter() - t0))
    return {
        "short_ttft_ms": round(statistics.median(x[0] for x in short) * 1e3, 1),
        "short_ms_per_token": round(statistics.median(x[1] for x in short) * 1e3, 2),
        "long_ttft_ms": round(statistics.median(x[0] for x in long) * 1e3, 1),
        "tok_s_32": round(statistics.median(rates)),
    }


def render(result: dict[str, Any]) -> str:
    got = result["figures"]
    rows = [
        ("short completion alone (20 words, 32 out): TTFT p50", "short_ttft_ms", " ms"),
        ("short completion alone: time per output token p50", "short_ms_per_token", " ms"),
        ("600-word prompt alone: TTFT p50", "long_ttft_ms", " ms"),
        ("32 concurrent streams x 128 tokens: output tok/s (median of 3)", "tok_s_32", ""),
    ]
    lines = [box.line(result["box"]), f"Worker flags: {result['worker_args'] or 'none'}", ""]
    lines += ["| what | this box | results' box (VLLM_CPU.md) |", "|---|---|---|"]
    lines += [f"| {what} | {got[k]:g}{unit} | {REFERENCE[k]:g}{unit} |" for what, k, unit in rows]
    return "\n".join(lines) + "\n"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=18310)
    p.add_argument("--core", type=int, default=1, help="the worker's core (client: the other)")
    p.add_argument("--worker-arg", action="append", default=[], help="extra vLLM flag (repeat)")
    p.add_argument("--out", type=Path, help="also write the figures here as JSON")


def run(args: argparse.Namespace) -> int:
    log = Path(".run") / f"vllm-box-{args.port}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    worker = VllmWorker("gen", args.port, args.core, log, args.worker_arg)
    worker.start()
    try:
        worker.wait_ready(600)
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)) - {args.core} or {args.core})
        figures = asyncio.run(measure(worker.url, worker.served_model_name))
    finally:
        worker.stop()
    result = {"box": box.describe(), "worker_args": args.worker_arg, "figures": figures}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(render(result))
    return 0
