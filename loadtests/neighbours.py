"""`hearthgate bench neighbours`: whether a generating vLLM worker lets other processes run.

vLLM's engine-core process waits for each step of its compute worker in a loop of
``sched_yield()`` (vllm/distributed/device_communicators/shm_broadcast.py). The gateway,
the load generator and the tests all share the box with it. This starts one generation
worker on ``--core`` with its whole session there (make run's way) or with only its compute
threads there (how the benches ran before 2026-12-06), in turn, and while the worker writes
one long completion, a process on each core sleeps 5 ms at a time and notes how late it
wakes. A neighbour that wakes seconds late is one that could not run: a gateway there
answers nobody for that long.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from hearthgate.deploy import box
from hearthgate.deploy.vllm_worker import VllmWorker

# The sleeper: 5 ms naps for the given seconds; prints its worst lateness.
_SLEEPER = """
import sys, time
end = time.monotonic() + float(sys.argv[1]); last = time.monotonic(); worst = 0.0
while time.monotonic() < end:
    time.sleep(0.005); now = time.monotonic(); worst = max(worst, now - last - 0.005); last = now
print(worst)
"""


def _generate(url: str, tokens: int) -> float:
    body = {"model": "tiny-llama", "prompt": "hello there", "max_tokens": tokens}
    body |= {"temperature": 0, "ignore_eos": True}
    start = time.perf_counter()
    r = httpx.post(url + "/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    return time.perf_counter() - start


def one_try(url: str, tokens: int, seconds: float) -> dict[str, float]:
    """One long completion with a sleeper on every core: its seconds, each core's worst
    lateness in seconds."""
    sleepers = {
        cpu: subprocess.Popen(
            [sys.executable, "-c", _SLEEPER, str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=functools.partial(os.sched_setaffinity, 0, {cpu}),
        )
        for cpu in sorted(os.sched_getaffinity(0))
    }
    time.sleep(0.2)
    took = _generate(url, tokens)
    out = {"generate_s": round(took, 2)}
    for cpu, proc in sleepers.items():
        out[f"core{cpu}_late_s"] = round(float(proc.communicate()[0]), 3)
    return out


def measure(core: int, port: int, tokens: int, tries: int, blocks: int) -> dict[str, Any]:
    run_dir = Path(".run")
    run_dir.mkdir(exist_ok=True)
    got: dict[str, list[dict[str, float]]] = {"whole session": [], "compute threads": []}
    for _ in range(blocks):
        for label, pin in (("whole session", True), ("compute threads", False)):
            log = run_dir / f"vllm-neighbours-{port}.log"
            worker = VllmWorker("gen", port, core, log, pin_session=pin)
            worker.start()
            try:
                worker.wait_ready(600)
                warm = max(_generate(worker.url, tokens) for _ in range(2))
                for _ in range(tries):
                    got[label].append(one_try(worker.url, tokens, 1.5 * warm + 1))
                    print(label, got[label][-1], flush=True)
            finally:
                worker.stop()
    return {"box": box.describe(), "core": core, "tokens": tokens, "tries": got}


def render(result: dict[str, Any]) -> str:
    lines = [box.line(result["box"]), ""]
    lines.append(
        f"One completion of {result['tokens']} tokens at a time, worker on core "
        f"{result['core']}; sleepers (5 ms naps) on every core. Median (range) over tries."
    )
    lines.append("")
    tries = result["tries"]
    keys = [k for k in next(iter(tries.values()))[0] if k.endswith("_late_s")]
    head = ["vLLM pinned", "tries", "completion s"] + [f"worst lateness {k[:5]} s" for k in keys]
    head.append("tries with a neighbour over 0.1 s late")
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(xs: list[float]) -> str:
        return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"

    for label, rows in tries.items():
        late = sum(1 for r in rows if max(r[k] for k in keys) > 0.1)
        cells = [label, str(len(rows)), cell([r["generate_s"] for r in rows])]
        cells += [cell([r[k] for r in rows]) for k in keys] + [f"{late} of {len(rows)}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=18312)
    p.add_argument("--core", type=int, default=1, help="the worker's core")
    p.add_argument("--tokens", type=int, default=3500, help="tokens of each completion")
    p.add_argument("--tries", type=int, default=4, help="completions per worker start")
    p.add_argument("--blocks", type=int, default=2, help="starts of each kind, alternating")
    p.add_argument("--out", type=Path, help="also write the tries here as JSON")


def run(args: argparse.Namespace) -> int:
    result = measure(args.core, args.port, args.tokens, args.tries, args.blocks)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(render(result))
    return 0
