"""Cross-check the runner against vLLM's own serving benchmark (`vllm.benchmarks.serve`).

For a single-class Poisson load sent straight to a vLLM worker, the runner's median TTFT and
TPOT should agree with what vLLM's benchmark measures on the same settings (within 10%).
Both use streaming `/v1/completions` with `ignore_eos`, fixed input and output lengths, the
same rate and request count; rounds alternate between the two tools so that drift on a
shared machine hits both. vLLM's benchmark runs in the vLLM environment (`.venv-vllm`) as a
child process, since the gateway environment does not have vLLM.

    hearthgate bench crosscheck --url http://127.0.0.1:18200 --rate 4 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from loadtests.calibrate import calibrate
from loadtests.runner import Endpoints, run_workload
from loadtests.scenario import Scenario, validate_scenario
from loadtests.stats import percentile
from loadtests.workload import plan

REPO_ROOT = Path(__file__).resolve().parents[1]

_VLLM_BENCH = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""


def scenario_for(args: argparse.Namespace, seed: int) -> Scenario:
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


def run_ours(args: argparse.Namespace, seed: int) -> dict[str, float | None]:
    sc = scenario_for(args, seed)

    async def go() -> dict[str, float | None]:
        cal = await calibrate(args.url, args.model)
        reqs = plan(sc, cal)
        result = await run_workload(sc, reqs, Endpoints("hearthgate-bench", args.url))
        ok = [r for r in result.records if r.outcome == "ok"]
        ttft = [t for r in ok if (t := r.ttft_s) is not None]
        tpot = [t for r in ok if (t := r.tpot_s) is not None]
        p50_ttft, p50_tpot = percentile(ttft, 50), percentile(tpot, 50)
        return {
            "completed": len(ok),
            "requests": len(result.records),
            "median_ttft_ms": None if p50_ttft is None else 1000 * p50_ttft,
            "median_tpot_ms": None if p50_tpot is None else 1000 * p50_tpot,
            "prompt_tokens_mean": statistics.fmean(r.prompt_tokens or 0 for r in ok)
            if ok
            else None,
        }

    return asyncio.run(go())


def run_vllm(args: argparse.Namespace, seed: int, workdir: Path) -> dict[str, float | None]:
    name = f"vllm-bench-{seed}.json"
    cmd = [
        str(REPO_ROOT / args.vllm_python),
        "-c",
        _VLLM_BENCH,
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
        "--num-prompts",
        str(args.num_prompts),
        "--request-rate",
        str(args.rate),
        "--ignore-eos",
        "--temperature",
        "0",
        "--seed",
        str(seed),
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(workdir),
        "--result-filename",
        name,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"vllm bench failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    data = json.loads((workdir / name).read_text())
    return {
        "completed": data.get("completed"),
        "requests": args.num_prompts,
        "median_ttft_ms": data.get("median_ttft_ms"),
        "median_tpot_ms": data.get("median_tpot_ms"),
        "prompt_tokens_mean": (data.get("total_input_tokens") or 0) / max(1, args.num_prompts),
    }


def _rel(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b - 1, 4)


def compare(rounds: list[dict[str, Any]], tolerance: float) -> dict[str, Any]:
    def med(tool: str, key: str) -> float | None:
        xs = [r[tool][key] for r in rounds if r[tool][key] is not None]
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
    return out


def render(result: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        "# Cross-check: hearthgate bench versus vLLM's serving benchmark",
        "",
        f"Single class, Poisson {args.rate:g} req/s, {args.num_prompts} requests, "
        f"{args.input_len} prompt tokens, {args.output_len} output tokens (`ignore_eos`), "
        f"streaming `/v1/completions` on {args.url}; {args.rounds} alternating rounds, "
        "medians of the per-round medians.",
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
    lines += ["", f"Within {100 * args.tolerance:.0f}%: the two {verdict}.", ""]
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
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--tolerance", type=float, default=0.10)
    p.add_argument("--out", type=Path, default=Path("loadtests/results"))


def run(args: argparse.Namespace) -> int:
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            seed = 1000 + i
            print(f"crosscheck: round {i + 1}/{args.rounds}", file=sys.stderr, flush=True)
            # Alternate which tool goes first, so slow drift affects both alike.
            if i % 2 == 0:
                ours, theirs = run_ours(args, seed), run_vllm(args, seed, Path(tmp))
            else:
                theirs, ours = run_vllm(args, seed, Path(tmp)), run_ours(args, seed)
            rounds.append({"hearthgate": ours, "vllm": theirs})
    result = compare(rounds, args.tolerance)
    result["settings"] = {
        k: getattr(args, k)
        for k in ("url", "model", "rate", "num_prompts", "input_len", "output_len", "rounds")
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "crosscheck.json").write_text(json.dumps(result, indent=1) + "\n")
    md = render(result, args)
    (args.out / "crosscheck.md").write_text(md)
    print(md)
    return 0 if result["agree"] else 1
