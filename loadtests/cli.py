"""`hearthgate bench`: load tests with per-class goodput reports.

    hearthgate bench validate SCENARIO...            check scenario files
    hearthgate bench plan SCENARIO                   show the planned workload, send nothing
    hearthgate bench run SCENARIO --url URL          one target that is already running
    hearthgate bench compare SCENARIO --targets F    several targets, started in turn
    hearthgate bench sweep SCENARIO --targets F --rates 0.5,1,1.5
    hearthgate bench report RAW_DIR                  recompute summary and report from raw
    hearthgate bench crosscheck --url URL            agree with vLLM's own serving benchmark?
    hearthgate bench fuzz --url URL | --start        generated odd requests: no gateway 5xx
    hearthgate bench chaos --duration 1200 --kills 2 chaos soak: disconnects, worker kills
    hearthgate bench batch [--lines 5000]            Batch API: interactive attainment with and
                                                     without a batch, batch lines/s vs vLLM

SCENARIO is a YAML file or the name of a shipped one (home-mix, noisy-neighbour, rag-burst).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hearthgate.deploy.vllm_worker import WorkerError
from hearthgate.loadtests import bench
from hearthgate.loadtests.markdown import LAG_WARN_S
from hearthgate.loadtests.matrix import Options, run_matrix
from hearthgate.loadtests.scenario import Scenario, ScenarioError, load_scenario
from hearthgate.loadtests.targets import TargetError, TargetsFile, load_targets, url_target
from hearthgate.loadtests.workload import describe, plan

DEFAULT_OUT = Path("loadtests/results")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario YAML file or shipped scenario name")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (%(default)s)")
    p.add_argument("--tag", help="output file prefix (default: the scenario name)")
    p.add_argument("--duration", type=float, help="override duration_s")
    p.add_argument("--warmup", type=float, help="override warmup_s")
    p.add_argument("--rate-scale", type=float, help="multiply every arrival rate")
    p.add_argument("--seed", type=int, help="override the scenario seed")
    p.add_argument("--prime-rounds", type=int, default=1, help="warm-up rounds of every shape")
    p.add_argument("--no-prime", action="store_true", help="skip the warm-up requests")
    p.add_argument(
        "--restart-warmup",
        type=float,
        default=20.0,
        help="seconds of unmeasured load after a worker (re)start (%(default)s)",
    )
    p.add_argument("--tokenize-url", help="worker URL whose /tokenize calibrates prompts")
    p.add_argument("--no-calibrate", action="store_true", help="assume 1 token per word")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--no-raw", action="store_true", help="do not write raw JSONL records")
    p.add_argument("--without", help="leave these classes' flows out (comma-separated)")
    p.add_argument("--without-apps", help="leave these apps' flows out (comma-separated)")


def _scenario(args: argparse.Namespace) -> Scenario:
    sc = load_scenario(args.scenario)
    without = getattr(args, "without", None)
    without_apps = getattr(args, "without_apps", None)
    overrides = (args.duration, args.warmup, args.rate_scale, args.seed, without, without_apps)
    if any(x is not None for x in overrides):
        sc = sc.with_overrides(
            duration_s=args.duration,
            warmup_s=args.warmup,
            rate_scale=args.rate_scale,
            seed=args.seed,
            without=_names(without),
            without_apps=_names(without_apps),
        )
    return sc


def _names(csv: str | None) -> set[str] | None:
    """A comma-separated option as a set of names (None when not given)."""
    return {c.strip() for c in csv.split(",") if c.strip()} if csv else None


def _headers(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition(":")
        if not sep:
            key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ScenarioError(f"--header {item!r}: expected NAME: VALUE")
        out[key.strip()] = value.strip()
    return out


def _options(args: argparse.Namespace) -> Options:
    return Options(
        prime=not args.no_prime,
        prime_rounds=args.prime_rounds,
        calibrate=not args.no_calibrate,
        tokenize_url=args.tokenize_url,
        progress=not args.no_progress,
        restart_warmup_s=args.restart_warmup,
    )


def _finish(
    args: argparse.Namespace,
    sc: Scenario,
    summary: dict[str, Any],
    outcomes: dict[str, list[bench.TargetOutcome]],
) -> int:
    tag = args.tag or sc.name
    paths = bench.write_outputs(
        args.out,
        tag,
        sc,
        summary,
        outcomes,
        write_raw=not args.no_raw,
        draw=not args.no_plots,
    )
    _print_table(summary)
    for p in paths:
        print(f"wrote {p}")
    return 0


def _warn_lag(summary: dict[str, Any]) -> None:
    for name, t in summary["targets"].items():
        lag = t["run"].get("send_lag_p99_s")
        if lag is not None and lag > LAG_WARN_S:
            print(
                f"hearthgate bench: warning: {name}: requests left up to {1000 * lag:.0f} ms "
                "late (p99): the load generator was starved; results under-state the load",
                file=sys.stderr,
            )


def _print_table(summary: dict[str, Any]) -> None:
    _warn_lag(summary)
    targets = summary["targets"]
    print(
        f"{'target':<16} {'class':<8} {'attain':>7} {'done':>5} {'rej':>4} {'fail':>4} "
        f"{'ttft50':>8} {'ttft99':>8} {'tpot50':>7} {'out tok/s':>9}"
    )
    for name, t in targets.items():
        for c, cs in t["classes"].items():

            def ms(x: float | None) -> str:
                return "-" if x is None else f"{1000 * x:.0f}"

            att = "-" if cs["attainment"] is None else f"{100 * cs['attainment']:.0f}%"
            print(
                f"{name:<16} {c:<8} {att:>7} {cs['completed']:>5} {cs['rejected']:>4} "
                f"{cs['failed']:>4} {ms(cs['ttft_p50_s']):>8} {ms(cs['ttft_p99_s']):>8} "
                f"{ms(cs['tpot_p50_s']):>7} {cs['output_tokens_per_s']:>9.1f}"
            )


# ---------------------------------------------------------------- modes


def cmd_validate(args: argparse.Namespace) -> int:
    bad = 0
    for path in args.scenarios:
        try:
            sc = load_scenario(path)
        except ScenarioError as err:
            print(err, file=sys.stderr)
            bad += 1
            continue
        print(f"{path}: ok ({len(sc.flows)} flows, {len(sc.classes)} classes)")
    return 1 if bad else 0


def cmd_plan(args: argparse.Namespace) -> int:
    sc = _scenario(args)
    reqs = plan(sc)
    rows = describe(sc, reqs)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(
        f"{sc.name}: {len(reqs)} requests over {sc.duration_s:g} s "
        f"(warm-up {sc.warmup_s:g} s, seed {sc.seed})"
    )
    for r in rows:
        print(
            f"  {r['flow']:<24} {r['endpoint']:<12} {r['requests']:>5} req "
            f"{r['rate_planned']:>7.2f}/s  prompt {r['prompt_tokens_mean']:>7.1f}  "
            f"out {r['output_tokens_mean']:>6.1f}"
        )
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    sc = _scenario(args)
    spec = url_target(
        args.name,
        args.url,
        embed_url=args.embed_url,
        headers=_headers(args.header),
        send_priority=args.send_priority,
        worker_metrics=args.worker_metrics,
        embed_metrics=args.embed_metrics,
        gateway_metrics=args.gateway_metrics,
    )
    if args.tokenize_url is None and not args.no_calibrate:
        args.tokenize_url = args.url
    cal, plans, cells = run_matrix([(sc.name, sc)], TargetsFile(targets=[spec]), _options(args))
    outcomes = {spec.name: [c.outcome for c in cells]}
    summary = bench.build_summary(sc, cal, plans[sc.name], outcomes)
    return _finish(args, sc, summary, outcomes)


def _targets_for(args: argparse.Namespace) -> TargetsFile:
    if args.target:
        specs = []
        for item in args.target:
            name, sep, url = item.partition("=")
            if not sep:
                raise TargetError(f"--target {item!r}: expected NAME=URL")
            specs.append(url_target(name, url))
        return TargetsFile(targets=specs)
    tf = load_targets(args.targets)
    if args.only:
        keep = [n.strip() for n in args.only.split(",")]
        unknown = set(keep) - {t.name for t in tf.targets}
        if unknown:
            raise TargetError(f"--only: unknown targets {', '.join(sorted(unknown))}")
        tf = tf.model_copy(update={"targets": [t for t in tf.targets if t.name in keep]})
    return tf


def cmd_compare(args: argparse.Namespace) -> int:
    sc = _scenario(args)
    tf = _targets_for(args)
    cal, plans, cells = run_matrix(
        [(sc.name, sc)], tf, _options(args), rounds=args.repeat, order="round-major"
    )
    outcomes: dict[str, list[bench.TargetOutcome]] = {}
    for cell in cells:
        outcomes.setdefault(cell.target, []).append(cell.outcome)
    summary = bench.build_summary(sc, cal, plans[sc.name], outcomes)
    return _finish(args, sc, summary, outcomes)


def cmd_sweep(args: argparse.Namespace) -> int:
    from hearthgate.loadtests.sweep import run_sweep

    return run_sweep(args)


def cmd_matrix(args: argparse.Namespace) -> int:
    from hearthgate.loadtests.scenario_matrix import run_matrix_command

    return run_matrix_command(args)


def cmd_matrix_report(args: argparse.Namespace) -> int:
    """The matrix's tables from a summary it wrote, also a ``*.partial.summary.json`` left
    by a run cut short (the rounds it finished)."""
    from hearthgate.loadtests.scenario_matrix import render_markdown

    try:
        md = render_markdown(json.loads(Path(args.summary).read_text()))
    except (OSError, ValueError) as e:
        print(f"hearthgate bench matrix-report: cannot read {args.summary}: {e}", file=sys.stderr)
        return 2
    except (KeyError, TypeError, AttributeError) as e:
        print(
            f"hearthgate bench matrix-report: {args.summary} is not a bench matrix summary "
            f"(no {e})",
            file=sys.stderr,
        )
        return 2
    if args.out is not None:
        args.out.write_text(md)
        print(f"wrote {args.out}")
    else:
        print(md, end="")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    raw = Path(args.raw_dir)
    sc, summary, outcomes = bench.rebuild(raw)
    tag = args.tag or raw.name
    out = args.out or raw.parent.parent
    paths = bench.write_outputs(
        out, tag, sc, summary, outcomes, write_raw=False, draw=not args.no_plots
    )
    _print_table(summary)
    for p in paths:
        print(f"wrote {p}")
    return 0


def cmd_fuzz(args: argparse.Namespace) -> int:
    """Generated requests per endpoint through a gateway (``loadtests/fuzz.py``); exit 1 on
    any gateway-made 5xx, malformed 4xx, bad stream or hang."""
    from hearthgate.loadtests import fuzz  # needs the [bench] extra (hearthgate bench says so)

    return fuzz.main(args)


def _fuzz_args(f: argparse.ArgumentParser) -> None:
    where = f.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="base URL of a running gateway (without /v1)")
    where.add_argument(
        "--start",
        action="store_true",
        help="start a vLLM generation worker (core 0), the embeddings worker (core 1) and a "
        "gateway (core 1) in front of them, on free loopback ports",
    )
    f.add_argument("--per-endpoint", type=int, default=10_000, help="requests (%(default)s)")
    f.add_argument("--seed", type=int, default=1, help="Hypothesis seed (%(default)s)")
    f.add_argument("--key", help="the valid API key (with --start: fuzz-key unless given)")
    f.add_argument("--endpoints", default="chat,completions,embeddings")
    f.add_argument("--concurrency", type=int, default=4, help="sending threads (%(default)s)")
    f.add_argument("--timeout", type=float, default=60.0, help="a hang after (%(default)s s)")
    f.add_argument("--slow", type=float, default=10.0, help="list answers slower (%(default)s s)")
    f.add_argument(
        "--body-limit",
        type=int,
        default=200_000,
        help="the gateway's limits.max_body_bytes; bodies are sized around it (%(default)s)",
    )
    f.add_argument(
        "--worker-arg",
        action="append",
        default=[],
        help="with --start: a vLLM flag for the generation worker (repeatable; use "
        "--worker-arg=--flag for flags)",
    )
    f.add_argument(
        "--no-seed-field",
        action="store_true",
        help="send no `seed` (vLLM 0.32 on CPU dies on a seeded request whose prefill is split)",
    )
    f.add_argument("--gen-model", default="tiny-llama")
    f.add_argument("--embed-model", default="minilm")
    f.add_argument("--out", type=Path, help="write the markdown report here")
    f.add_argument("--failures", type=Path, help="write failing requests as JSON lines")
    f.add_argument("--client-core", type=int, help="pin the fuzzing process to this core")
    f.add_argument("--note", action="append", default=[], help="a line for the report")
    f.add_argument("--no-progress", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hearthgate bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="mode", required=True)

    v = sub.add_parser("validate", help="validate scenario files")
    v.add_argument("scenarios", nargs="+")
    v.set_defaults(func=cmd_validate)

    p = sub.add_parser("plan", help="print the planned workload without sending anything")
    p.add_argument("scenario")
    p.add_argument("--duration", type=float)
    p.add_argument("--warmup", type=float)
    p.add_argument("--rate-scale", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)

    r = sub.add_parser("run", help="run against one target that is already running")
    _common(r)
    r.add_argument("--url", required=True, help="base URL (without /v1)")
    r.add_argument("--name", default="target", help="target name in the report")
    r.add_argument("--embed-url", help="send /v1/embeddings here instead")
    r.add_argument("--header", action="append", default=[], help="NAME: VALUE (repeatable)")
    r.add_argument("--send-priority", action="store_true", help="send class priorities")
    r.add_argument("--worker-metrics", help="vLLM /metrics URL to sample")
    r.add_argument("--embed-metrics", help="embeddings worker /metrics URL to sample")
    r.add_argument("--gateway-metrics", help="gateway /metrics URL to sample")
    r.set_defaults(func=cmd_run)

    c = sub.add_parser("compare", help="the same workload against several targets in turn")
    _common(c)
    c.add_argument("--targets", default="local", help="targets file or shipped name (%(default)s)")
    c.add_argument(
        "--target",
        action="append",
        default=[],
        help="NAME=URL (repeatable; replaces --targets with already running targets)",
    )
    c.add_argument("--only", help="comma-separated target names to keep")
    c.add_argument("--repeat", type=int, default=1, help="rounds over all targets, interleaved")
    c.set_defaults(func=cmd_compare)

    s = sub.add_parser("sweep", help="raise the rate to find each target's capacity")
    _common(s)
    s.add_argument("--targets", default="local")
    s.add_argument("--target", action="append", default=[])
    s.add_argument("--only")
    s.add_argument("--rates", default="0.5,0.75,1,1.25,1.5", help="rate scales to try")
    s.add_argument("--classes", help="scale only these classes' rates (comma-separated)")
    s.add_argument("--threshold", type=float, default=0.9, help="interactive attainment bar")
    s.add_argument("--repeat", type=int, default=1)
    s.add_argument(
        "--interleave",
        action="store_true",
        help="run round by round over all targets and rates (the box drifts between runs); "
        "workers restart whenever the next target needs other vLLM flags",
    )
    s.set_defaults(func=cmd_sweep)

    m = sub.add_parser(
        "matrix", help="every scenario of the product's targets, vLLM alone and the gateway"
    )
    m.add_argument(
        "points",
        nargs="?",
        default="loadtests/targets/matrix-points.yaml",
        help="the workloads (%(default)s)",
    )
    m.add_argument("--targets", default="loadtests/targets/matrix.yaml", help="(%(default)s)")
    m.add_argument("--target", action="append", default=[], help=argparse.SUPPRESS)
    m.add_argument("--only", help="comma-separated target names to keep")
    m.add_argument("--only-points", help="comma-separated point names to keep")
    m.add_argument("--repeat", type=int, default=3, help="rounds (%(default)s)")
    m.add_argument("--duration", type=float, help="override every point's duration_s")
    m.add_argument("--warmup", type=float, help="override every point's warmup_s")
    m.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (%(default)s)")
    m.add_argument("--tag", help="output file prefix (default: matrix)")
    m.add_argument("--prime-rounds", type=int, default=1)
    m.add_argument("--no-prime", action="store_true")
    m.add_argument(
        "--restart-warmup",
        type=float,
        default=Options.restart_warmup_s,
        help="seconds of unmeasured load on a freshly started worker (%(default)s)",
    )
    m.add_argument("--tokenize-url")
    m.add_argument("--no-calibrate", action="store_true")
    m.add_argument("--no-progress", action="store_true")
    m.set_defaults(func=cmd_matrix)

    mr = sub.add_parser(
        "matrix-report", help="the matrix's tables again from its (partial) summary file"
    )
    mr.add_argument("summary", help="a *.summary.json or *.partial.summary.json of bench matrix")
    mr.add_argument("--out", type=Path, help="write the markdown here (default: print it)")
    mr.set_defaults(func=cmd_matrix_report)

    bx = sub.add_parser("box", help="how fast this box runs the CPU vLLM worker")
    from hearthgate.loadtests import boxspeed

    boxspeed.add_args(bx)
    bx.set_defaults(func=boxspeed.run)

    nb = sub.add_parser(
        "neighbours", help="whether a generating vLLM worker lets other processes run"
    )
    from hearthgate.loadtests import neighbours

    neighbours.add_args(nb)
    nb.set_defaults(func=neighbours.run)

    x = sub.add_parser("crosscheck", help="compare the runner with vLLM's serving benchmark")
    from hearthgate.loadtests import crosscheck

    crosscheck.add_args(x)
    x.set_defaults(func=crosscheck.run)

    ch = sub.add_parser("chaos", help="chaos soak: disconnects at every phase, worker kills")
    from hearthgate.loadtests import chaos

    chaos.add_args(ch)
    ch.set_defaults(func=chaos.run)

    bt = sub.add_parser(
        "batch", help="Batch API with real vLLM and Redis: attainment with a batch, lines/s"
    )
    from hearthgate.loadtests.batchbench import cli as batchbench

    batchbench.add_args(bt)
    bt.set_defaults(func=batchbench.run)

    vt = sub.add_parser(
        "voice-turn", help="speech in, a Responses turn, speech out: idle and under home-mix"
    )
    from hearthgate.loadtests import voice_turn

    voice_turn.add_args(vt)
    vt.set_defaults(func=voice_turn.run)

    fz = sub.add_parser("fuzz", help="generated odd requests through a gateway (issue 11)")
    _fuzz_args(fz)
    fz.set_defaults(func=cmd_fuzz)

    rep = sub.add_parser("report", help="recompute the summary and report from raw records")
    rep.add_argument("raw_dir", help="folder {out}/raw/{tag} written by run/compare")
    rep.add_argument("--out", type=Path, help="output folder (default: next to raw/)")
    rep.add_argument("--tag")
    rep.add_argument("--no-plots", action="store_true")
    rep.set_defaults(func=cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `hearthgate bench`; returns the exit code (2 for bad input)."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    args.argv = list(argv)
    if getattr(args, "repeat", 1) < 1:
        parser.error("--repeat must be at least 1")
    try:
        code: int = args.func(args)
    except (ScenarioError, TargetError, WorkerError) as err:
        print(f"hearthgate bench: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hearthgate bench: interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
