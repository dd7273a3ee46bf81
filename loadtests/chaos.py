"""Chaos soak (`hearthgate bench chaos`): real vLLM workers and a real gateway on loopback,
mixed load with clients leaving at every phase, the generation worker killed and restarted.

What runs where: a vLLM generation worker (tiny-llama, core 0) and an embeddings worker
(MiniLM, core 1), started with ``deploy.vllm_worker``; ``hearthgate serve`` as its own process
(pinned to ``--gateway-core``, default 1); this driver, unpinned. Everything listens on
127.0.0.1 only and is stopped on every exit path.

The run: a priming round of every request shape, then ``warmup_s`` of load without
disconnects or kills, a pause until the gateway is idle (RSS sampled: the baseline), then
``duration_s`` of Poisson arrivals of chat (short prompt, streaming, 48 tokens with
``ignore_eos``), RAG (600-word prompt, streaming or not) and groups of small embeddings
requests sent at once (so they coalesce), a fraction of them disconnecting at a planned
moment (``loadtests.chaos_client``). At the kill times a small burst of requests is sent
and, while they are queued or in prefill, the generation worker's whole process group gets
SIGKILL; it is restarted at once. Load goes on until the duration is over and the worker
has been back for ``post_restart_s``. Then the driver waits for its requests to finish,
lets the gateway settle and checks the end state.

Modules: ``chaos_client`` (the plan and one request with its disconnect), ``chaos_driver``
(the run), ``chaos_outcomes`` (outcome labels, relation to the kills, the checks; pure),
``chaos_report`` (the markdown report; pure), this one (processes and the command line).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shlex
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import FrameType

from hearthgate.deploy.gateway_process import GatewayProcess, free_port
from hearthgate.deploy.vllm_worker import VllmWorker, start_all, stop_all
from hearthgate.loadtests.chaos_client import LoadShape
from hearthgate.loadtests.chaos_driver import Driver, SoakConfig, soak_settings
from hearthgate.loadtests.chaos_report import SoakResult, render

DEFAULT_OUT = Path("loadtests/results/chaos-soak.md")
__all__ = ["SoakConfig", "add_args", "config_from_args", "run", "run_soak", "soak_settings"]


def run_soak(cfg: SoakConfig) -> SoakResult:
    """Start the workers and the gateway, run the soak, stop everything (on every path)."""
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    gp, ep = free_port(), free_port()
    gen = VllmWorker("gen", gp, 0, cfg.run_dir / f"vllm-gen-{gp}.log")
    embed = VllmWorker("embed", ep, 1, cfg.run_dir / f"vllm-embed-{ep}.log")
    gw = GatewayProcess(
        soak_settings(gen.url, embed.url),
        run_dir=cfg.run_dir,
        name="chaos-gateway",
        core=cfg.gateway_core,
    )
    try:
        print(f"chaos: starting vLLM workers (logs in {cfg.run_dir})", flush=True)
        start_all([gen, embed], timeout=cfg.start_timeout_s)
        gw.start()
        print(f"chaos: gateway {gw.url} pid {gw.pid}, log {gw.log_path}", flush=True)
        return asyncio.run(Driver(cfg, gen, embed, gw).run())
    finally:
        gw.stop()
        stop_all([gen, embed])


def write_report(result: SoakResult, out: Path, raw: Path | None = None) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(result))
    if raw is not None:
        raw.parent.mkdir(parents=True, exist_ok=True)
        raw.write_text(json.dumps(result.to_json(), indent=None, default=str))


# ---------------------------------------------------------------- command line


def add_args(p: argparse.ArgumentParser) -> None:
    d = SoakConfig()
    s = LoadShape()
    p.add_argument("--duration", type=float, default=d.duration_s, help="seconds of load")
    p.add_argument("--warmup", type=float, default=d.warmup_s, help="seconds before measuring")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--kills", type=int, default=d.kills, help="generation worker kills")
    p.add_argument("--kill-at", help="kill times in seconds (comma-separated)")
    p.add_argument("--no-burst", action="store_true", help="no requests sent just before kills")
    p.add_argument("--chat-rate", type=float, default=s.chat_rate)
    p.add_argument("--rag-rate", type=float, default=s.rag_rate)
    p.add_argument("--embed-rate", type=float, default=s.embed_rate, help="groups per second")
    p.add_argument("--embed-group", type=int, default=s.embed_group)
    p.add_argument("--disconnect-fraction", type=float, default=s.disconnect_fraction)
    p.add_argument(
        "--rag-burst-every",
        type=float,
        default=s.rag_burst_every_s,
        help="seconds between groups of long prompts at once (0: none)",
    )
    p.add_argument(
        "--gateway-core", type=int, default=d.gateway_core, help="-1: do not pin the gateway"
    )
    p.add_argument("--memory-tolerance", type=float, default=d.memory_tolerance)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="markdown report")
    p.add_argument("--raw", type=Path, help="also write every request record (JSON) here")
    p.add_argument("--run-dir", type=Path, default=d.run_dir, help="logs and settings")


def config_from_args(args: argparse.Namespace, command: str = "") -> SoakConfig:
    shape = replace(
        LoadShape(),
        chat_rate=args.chat_rate,
        rag_rate=args.rag_rate,
        embed_rate=args.embed_rate,
        embed_group=args.embed_group,
        disconnect_fraction=args.disconnect_fraction,
        rag_burst_every_s=args.rag_burst_every,
    )
    kill_at = tuple(float(x) for x in args.kill_at.split(",") if x.strip()) if args.kill_at else ()
    return SoakConfig(
        duration_s=args.duration,
        warmup_s=args.warmup,
        seed=args.seed,
        kills=args.kills,
        kill_at_s=kill_at,
        shape=shape,
        burst=not args.no_burst,
        gateway_core=None if args.gateway_core < 0 else args.gateway_core,
        memory_tolerance=args.memory_tolerance,
        run_dir=args.run_dir.resolve(),
        command=command,
    )


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM ends the run like Ctrl-C, so every process is stopped on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace) -> int:
    """`hearthgate bench chaos`: 0 when every end-state check passed, 1 otherwise."""
    argv = sys.argv[sys.argv.index("chaos") + 1 :] if "chaos" in sys.argv else []
    command = " ".join(["hearthgate bench chaos", shlex.join(argv)]).strip()
    cfg = config_from_args(args, command)
    with _sigterm_as_interrupt():
        result = run_soak(cfg)
    write_report(result, args.out, args.raw)
    print(render(result))
    print(f"wrote {args.out}" + (f" and {args.raw}" if args.raw else ""))
    return 0 if result.ok else 1
