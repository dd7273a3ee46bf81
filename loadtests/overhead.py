"""Gateway overhead: time to first token added by the gateway, its CPU per relayed token, and
its CPU per embeddings request (single texts, merged by the coalescer, 384-float vectors).

Run: ``make bench-overhead`` (or ``python -m hearthgate.loadtests.overhead``). Each upstream (an
instant local upstream, and a real CPU vLLM worker unless ``--no-vllm``) is measured directly and
through the gateway in alternating blocks within one run, at each concurrency, so both
sides see the same machine noise. The gateway's CPU time is read from /proc for the
through-gateway blocks only. Placement: gateway on core 0; client, instant upstream and the
vLLM worker on core 1 (``taskset``-style affinity), so the gateway's cost is isolated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from hearthgate.loadtests.markdown import _table as markdown_table

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / ".run" / "overhead"
GATEWAY_CORE, OTHER_CORE = 0, 1


@dataclass
class Side:
    ttfts: list[float] = field(default_factory=list)
    tokens: int = 0
    errors: int = 0
    cpu_s: float = 0.0


def _pct(values: list[float], q: float) -> float:
    data = sorted(values)
    return data[min(len(data) - 1, max(0, round(q / 100 * len(data)) - 1))]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(
    cmd: list[str], core: int, log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    out = log.open("wb")
    return subprocess.Popen(
        cmd,
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env,
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),
    )


async def _wait_worker_up(
    session: aiohttp.ClientSession, gateway: str, worker: str, timeout: float = 60
) -> None:
    """Until the gateway's health checks report ``worker`` up."""
    line = f'hearthgate_worker_up{{worker="{worker}"}} 1.0'
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        async with session.get(gateway + "/metrics") as r:
            if line in await r.text():
                return
        await asyncio.sleep(0.5)
    raise SystemExit(f"the gateway never saw worker {worker} up")


async def _wait(session: aiohttp.ClientSession, url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            async with session.get(url) as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise TimeoutError(url)


async def _one(
    session: aiohttp.ClientSession, base: str, model: str, max_tokens: int, side: Side
) -> None:
    body = {
        "model": model,
        "prompt": "Please summarise the shopping list for the weekend",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    t0 = time.perf_counter()
    first: float | None = None
    n = 0
    try:
        async with session.post(base + "/v1/completions", json=body) as r:
            if r.status != 200:
                side.errors += 1
                await r.read()
                return
            async for line in r.content:
                if line.startswith(b"data: {") and b'"text"' in line:
                    if first is None:
                        first = time.perf_counter() - t0
                    n += 1
    except aiohttp.ClientError:
        side.errors += 1
        return
    if first is not None:
        side.ttfts.append(first)
        side.tokens += n


async def _block(
    session: aiohttp.ClientSession,
    base: str,
    model: str,
    max_tokens: int,
    concurrency: int,
    per_stream: int,
    side: Side,
) -> None:
    async def stream_loop() -> None:
        for _ in range(per_stream):
            await _one(session, base, model, max_tokens, side)

    await asyncio.gather(*(stream_loop() for _ in range(concurrency)))


async def measure(
    direct: str,
    gateway: str,
    gateway_pid: int,
    model: str,
    max_tokens: int,
    concurrency: int,
    per_stream: int,
    rounds: int,
) -> dict[str, Any]:
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=300)
    d, g = Side(), Side()
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        # Warm-up both paths (connections, JIT-free but caches and vLLM shapes).
        await _block(session, direct, model, max_tokens, concurrency, 1, Side())
        await _block(session, gateway, model, max_tokens, concurrency, 1, Side())
        for _ in range(rounds):
            await _block(session, direct, model, max_tokens, concurrency, per_stream, d)
            cpu0 = _cpu_seconds(gateway_pid)
            await _block(session, gateway, model, max_tokens, concurrency, per_stream, g)
            g.cpu_s += _cpu_seconds(gateway_pid) - cpu0
    return {
        "concurrency": concurrency,
        "requests_per_side": len(d.ttfts),
        "errors": d.errors + g.errors,
        "direct_ttft_p50_ms": _pct(d.ttfts, 50) * 1e3,
        "direct_ttft_p99_ms": _pct(d.ttfts, 99) * 1e3,
        "gateway_ttft_p50_ms": _pct(g.ttfts, 50) * 1e3,
        "gateway_ttft_p99_ms": _pct(g.ttfts, 99) * 1e3,
        "added_ttft_p50_ms": (_pct(g.ttfts, 50) - _pct(d.ttfts, 50)) * 1e3,
        "added_ttft_p99_ms": (_pct(g.ttfts, 99) - _pct(d.ttfts, 99)) * 1e3,
        "gateway_cpu_us_per_token": g.cpu_s / max(1, g.tokens) * 1e6,
        "tokens_relayed": g.tokens,
    }


async def _embed_block(
    session: aiohttp.ClientSession,
    base: str,
    model: str,
    concurrency: int,
    n: int,
    lat: list[float],
) -> int:
    """``n`` single-text embeddings requests, ``concurrency`` at a time; their latencies go to
    ``lat``; returns the number of errors."""
    errors = 0
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        nonlocal errors
        text = " ".join(["the shopping list for the weekend"] * (1 + i % 8)) + f" {i}"
        async with sem:
            t0 = time.perf_counter()
            try:
                async with session.post(
                    base + "/v1/embeddings", json={"model": model, "input": text}
                ) as r:
                    await r.read()
                    errors += r.status != 200
            except aiohttp.ClientError:
                errors += 1
                return
            lat.append(time.perf_counter() - t0)

    await asyncio.gather(*(one(i) for i in range(n)))
    return errors


async def measure_embeddings(
    direct: str, gateway: str, gateway_pid: int, model: str, concurrency: int, n: int, rounds: int
) -> dict[str, Any]:
    """Single-text embeddings requests straight to the upstream and through the gateway
    (where concurrent ones are merged into one call), alternating blocks; the gateway's CPU
    per request."""
    timeout = aiohttp.ClientTimeout(total=300)
    d: list[float] = []
    g: list[float] = []
    d_errors = g_errors = 0
    cpu_s = 0.0
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=timeout
    ) as session:
        await _embed_block(session, direct, model, concurrency, n, [])
        await _embed_block(session, gateway, model, concurrency, n, [])
        for _ in range(rounds):
            d_errors += await _embed_block(session, direct, model, concurrency, n, d)
            cpu0 = _cpu_seconds(gateway_pid)
            g_errors += await _embed_block(session, gateway, model, concurrency, n, g)
            cpu_s += _cpu_seconds(gateway_pid) - cpu0
    return {
        "concurrency": concurrency,
        "requests_per_side": n * rounds,
        "direct_errors": d_errors,
        "gateway_errors": g_errors,
        "direct_p50_ms": _pct(d, 50) * 1e3,
        "direct_p99_ms": _pct(d, 99) * 1e3,
        "gateway_p50_ms": _pct(g, 50) * 1e3,
        "gateway_p99_ms": _pct(g, 99) * 1e3,
        "gateway_cpu_us_per_request": cpu_s / max(1, len(g)) * 1e6,
    }


def _embed_table(rows: list[dict[str, Any]]) -> str:
    head = [
        "embeddings upstream (384 floats each)",
        "in flight",
        "requests/side",
        "direct p50 / p99 (ms)",
        "via gateway p50 / p99 (ms)",
        "failed direct / via gateway",
        "gateway CPU per request (µs)",
    ]
    body = [
        [
            str(r["upstream"]),
            str(r["concurrency"]),
            str(r["requests_per_side"]),
            f"{r['direct_p50_ms']:.2f} / {r['direct_p99_ms']:.2f}",
            f"{r['gateway_p50_ms']:.2f} / {r['gateway_p99_ms']:.2f}",
            f"{r['direct_errors']} / {r['gateway_errors']}",
            f"{r['gateway_cpu_us_per_request']:.0f}",
        ]
        for r in rows
    ]
    return "\n".join(markdown_table(head, body))


def _table(rows: list[dict[str, Any]]) -> str:
    head = [
        "upstream",
        "streams",
        "requests/side",
        "direct TTFT p50 / p99 (ms)",
        "via gateway p50 / p99 (ms)",
        "added p50 / p99 (ms)",
        "gateway CPU per token (µs)",
    ]
    body = [
        [
            str(r["upstream"]),
            str(r["concurrency"]),
            str(r["requests_per_side"]),
            f"{r['direct_ttft_p50_ms']:.2f} / {r['direct_ttft_p99_ms']:.2f}",
            f"{r['gateway_ttft_p50_ms']:.2f} / {r['gateway_ttft_p99_ms']:.2f}",
            f"{r['added_ttft_p50_ms']:+.2f} / {r['added_ttft_p99_ms']:+.2f}",
            f"{r['gateway_cpu_us_per_token']:.0f}",
        ]
        for r in rows
    ]
    return "\n".join(markdown_table(head, body))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-vllm", action="store_true", help="skip the real vLLM upstream")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=str(REPO / "loadtests/results/overhead.json"))
    parser.add_argument(
        "--gateway-src",
        default=None,
        help="run the gateway from this checkout of the repository (a before/after comparison)",
    )
    args = parser.parse_args(argv)
    # Stopped with SIGTERM: still stop the upstream, the gateway and the workers (finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    RUN.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    workers: list[Any] = []
    up_port, gw_port = _free_port(), _free_port()
    cfg_workers: list[dict[str, Any]] = [
        {"name": "instant", "url": f"http://127.0.0.1:{up_port}", "models": ["instant"]}
    ]
    try:
        procs.append(
            _spawn(
                [
                    sys.executable,
                    "-m",
                    "hearthgate.loadtests.instant_upstream",
                    "--port",
                    str(up_port),
                    "--dims",
                    "384",
                ],
                OTHER_CORE,
                RUN / "instant.log",
            )
        )
        vllm_url = embed_url = None
        embed: Any = None
        if not args.no_vllm:
            from hearthgate.deploy.vllm_worker import VllmWorker, start_all, stop_all

            port = _free_port()
            w = VllmWorker("gen", port, OTHER_CORE, RUN / "vllm-gen.log")
            workers.append(w)
            start_all([w], timeout=300)
            vllm_url = w.url
            cfg_workers.append({"name": "vllm", "url": vllm_url, "models": ["tiny-llama"]})
            # Started after the streams are measured (and the generation worker stopped), so
            # each measurement has core 1 as the streams' always had it.
            embed = VllmWorker("embed", _free_port(), OTHER_CORE, RUN / "vllm-embed.log")
            embed_url = embed.url
            cfg_workers.append(
                {"name": "emb", "url": embed_url, "models": ["minilm"], "role": "embeddings"}
            )
        cfg = RUN / "gateway.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {"listen": {"port": gw_port}, "workers": cfg_workers, "log_level": "warning"}
            )
        )
        py, gw_env = [sys.executable], None
        if args.gateway_src:  # that checkout's code only, not the one this runs from
            py.append("-P")
            gw_env = {**os.environ, "PYTHONPATH": str(Path(args.gateway_src).resolve())}
        gw = _spawn(
            [*py, "-m", "hearthgate.gateway.cli", "serve", "--config", str(cfg)],
            GATEWAY_CORE,
            RUN / "gateway.log",
            gw_env,
        )
        procs.append(gw)
        os.sched_setaffinity(0, {OTHER_CORE})
        gateway = f"http://127.0.0.1:{gw_port}"

        async def run_all() -> list[dict[str, Any]]:
            async with aiohttp.ClientSession() as s:
                await _wait(s, f"http://127.0.0.1:{up_port}/health")
                await _wait(s, gateway + "/readyz")
            rows = []
            plan = [("instant", f"http://127.0.0.1:{up_port}", "instant", 32)]
            if vllm_url:
                plan.append(("vllm-cpu", vllm_url, "tiny-llama", 16))
            for name, direct, model, max_tokens in plan:
                for conc, per_stream in ((1, 40), (64, 2)):
                    r = await measure(
                        direct, gateway, gw.pid, model, max_tokens, conc, per_stream, args.rounds
                    )
                    r["upstream"] = name
                    rows.append(r)
                    print(json.dumps(r), flush=True)
            embed_plan = [("instant", f"http://127.0.0.1:{up_port}", "instant")]
            if embed is not None:
                stop_all([w])
                start_all([embed], timeout=300)
                workers.append(embed)
                async with aiohttp.ClientSession() as s:
                    await _wait_worker_up(s, gateway, "emb")
                embed_plan.append(("minilm-cpu", embed.url, "minilm"))
            for name, direct, model in embed_plan:
                for conc in (1, 32):
                    e = await measure_embeddings(
                        direct, gateway, gw.pid, model, conc, 500, args.rounds
                    )
                    e["upstream"] = name
                    embed_rows.append(e)
                    print(json.dumps(e), flush=True)
            return rows

        embed_rows: list[dict[str, Any]] = []
        rows = asyncio.run(run_all())
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
        if workers:
            from hearthgate.deploy.vllm_worker import stop_all

            stop_all(workers)
    result = {
        "command": "make bench-overhead"
        + (f" (gateway from {args.gateway_src})" if args.gateway_src else ""),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "placement": "gateway on core 0; client, instant upstream and vLLM workers on core 1",
        "rounds": args.rounds,
        "rows": rows,
        "embeddings": embed_rows,
        "median_added_p50_ms": statistics.median(r["added_ttft_p50_ms"] for r in rows),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(_table(rows))
    print(_embed_table(embed_rows))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
