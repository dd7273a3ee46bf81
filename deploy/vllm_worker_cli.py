"""``python -m hearthgate.deploy.vllm_worker`` (or ``-m hearthgate.deploy.vllm_worker_cli``):
run one CPU vLLM worker (any kind: gen, embed, stt, rerank) until Ctrl-C/SIGTERM, printing its
URL when ready; arguments after ``--`` go to vLLM.

``run_until_stopped`` is the loop itself, shared with ``python -m hearthgate.deploy.tts_server``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
import types
from collections.abc import Sequence

from hearthgate.deploy.server_process import ServerProcess, WorkerError
from hearthgate.deploy.vllm_worker import SERVED_NAMES, VllmWorker

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum: int, frame: types.FrameType | None) -> None:
    raise _Interrupted(signum)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; see the module docstring."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in args_in:
        cut = args_in.index("--")
        args_in, extra = args_in[:cut], args_in[cut + 1 :]
    parser = argparse.ArgumentParser(
        prog="python -m hearthgate.deploy.vllm_worker",
        description="Run one CPU vLLM worker until Ctrl-C/SIGTERM. "
        "Arguments after `--` are passed to vLLM.",
    )
    parser.add_argument("--kind", choices=sorted(SERVED_NAMES), required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--core", default="0", help="VLLM_CPU_OMP_THREADS_BIND, e.g. 0 or 1")
    parser.add_argument("--log", required=True, help="log file (appended)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--python", default=None, help="vLLM venv python")
    parser.add_argument("--model", default=None, help="model folder")
    parser.add_argument("--timeout", type=float, default=180.0, help="start-up timeout, s")
    parser.add_argument(
        "--nice", type=int, default=0, help="CPU niceness of the worker's session (0-19)"
    )
    args = parser.parse_args(args_in)

    worker = VllmWorker(
        args.kind,
        port=args.port,
        core=args.core,
        log_path=args.log,
        extra_args=extra,
        python=args.python,
        model_dir=args.model,
        host=args.host,
        nice=args.nice,
    )
    return run_until_stopped(worker, timeout=args.timeout)


def run_until_stopped(server: ServerProcess, timeout: float = 180.0) -> int:
    """Start ``server``, print its URL once ready, and wait until Ctrl-C or SIGTERM (exit
    code 130 or 143) or until it exits by itself (1, its log tail printed); 1 also when it
    does not start. The server is stopped in every case; the signal handlers of SIGINT and
    SIGTERM are restored on return."""
    previous = {sig: signal.signal(sig, _raise_interrupted) for sig in _STOP_SIGNALS}
    try:
        server.start()
        print(f"starting {server.kind} worker, log {server.log_path}", flush=True)
        seconds = server.wait_ready(timeout=timeout)
        print(
            f"ready {server.url} model={server.served_model_name} after {seconds:.1f}s",
            flush=True,
        )
        while server.running:
            time.sleep(0.5)
        print(f"worker exited; log tail:\n{server.log_tail()}", file=sys.stderr, flush=True)
        return 1
    except _Interrupted as exc:
        print(f"{exc}: stopping worker", file=sys.stderr, flush=True)
        return 128 + exc.signum if exc.signum != signal.SIGINT else 130
    except WorkerError as exc:
        print(str(exc), file=sys.stderr, flush=True)
        return 1
    finally:
        # Ignore further signals while shutting down so the group is always reaped.
        for sig in _STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        try:
            server.stop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
