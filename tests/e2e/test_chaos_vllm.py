"""A short chaos soak against real vLLM: clients leaving at every phase, the generation
worker killed once and restarted, then the end-state checks (loadtests/chaos.py).

It starts its own workers, gateway and load (the session's shared workers are neither used
nor touched) and stops them on every exit path; about 3 to 4 minutes, most of it the
workers' start-up and the one restart (40-65 s each, more on a busy machine). One kill, not
two: a second restart would add another minute. The full soak, with two kills, is
``hearthgate bench chaos`` (loadtests/results/chaos-soak.md).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from hearthgate.loadtests.chaos import SoakConfig, run_soak, write_report
from hearthgate.loadtests.chaos_client import LoadShape
from hearthgate.loadtests.chaos_report import render
from tests.support import RUN_DIR

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def _processes_of(run_dir: Path) -> set[int]:
    """Live processes started for the soak: vLLM (and its engine processes) runs with
    ``run_dir`` as its working directory; the gateway's settings file lies in it."""
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cwd = os.readlink(proc / "cwd")
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = next(
                line for line in (proc / "status").read_text().splitlines() if line[:6] == "State:"
            )
        except (OSError, StopIteration):
            continue
        if "Z" in state.split()[1:2]:
            continue
        if cwd == str(run_dir) or str(run_dir) in cmdline:
            found.add(int(proc.name))
    return found


@pytest.mark.timeout(900)
def test_short_chaos_soak_ends_clean() -> None:
    if not (REPO / ".models" / "tiny-llama" / ".stamp").exists():
        pytest.skip("run `make setup` first (tiny model missing)")
    run_dir = RUN_DIR / "chaos-e2e"
    cfg = SoakConfig(
        duration_s=45.0,
        warmup_s=10.0,
        seed=3,
        kills=1,
        # Late enough for every disconnect phase to happen before the outage.
        kill_at_s=(25.0,),
        # The two requests of each RAG burst planned to leave while queued leave 50-120 ms
        # after sending, before the two ahead of them (prefill from ~50 ms, then 48 tokens)
        # can free the RAG cap: with the full soak's 0.5 s, a fast hour of this box admitted
        # all of them first and the run saw no queued disconnect at all (CI, 2026-12-04).
        shape=LoadShape(disconnect_fraction=0.35, rag_burst_every_s=8.0, queued_within_s=0.12),
        post_restart_s=10.0,
        settle_timeout_s=30.0,
        run_dir=run_dir,
        command="pytest tests/e2e/test_chaos_vllm.py",
    )
    try:
        result = run_soak(cfg)
    finally:
        # Nothing the soak started is left: workers, engine processes, gateway.
        leftover = _processes_of(run_dir)
        for pid in leftover:
            os.kill(pid, signal.SIGKILL)
        assert not leftover, f"processes left running: {sorted(leftover)}"
    report = run_dir / "chaos-e2e.md"
    write_report(result, report, run_dir / "chaos-e2e.json")
    failed = [c for c in result.checks if not c.ok]
    assert not failed, f"{render(result)}\n(report: {report})"
