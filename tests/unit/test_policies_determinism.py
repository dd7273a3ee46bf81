"""The same event log gives the same decisions: across runs, worker list order and hash
seeds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.unit.test_policies_support import Op, budgets, log_settings, ops, run_log

ROOT = Path(__file__).resolve().parents[2]


@log_settings(60)
@given(ops, st.lists(budgets, min_size=1, max_size=2))
def test_same_log_same_decisions(log: list[Op], limits: list[Any]) -> None:
    first = run_log(log, limits).trace
    assert run_log(log, limits).trace == first
    assert run_log(log, limits, reverse_workers=True).trace == first


SCRIPT = """
import random
from hearthgate.policies import WorkerBudget
from tests.unit.test_policies_support import _OP_MIX, Op, run_log

rng = random.Random(20240601)
log = [
    Op(rng.choice(_OP_MIX), rng.randrange(61), rng.randrange(2001), rng.randrange(65),
       rng.randrange(-50, 51), rng.choice([0.1, 0.5, 1.0, 2.5]), rng.random() < 0.8,
       rng.random())
    for _ in range(1500)
]
limits = [
    WorkerBudget(max_in_flight=6, prefill_token_budget=3000, interactive_reserved_slots=1,
                 interactive_reserved_prefill_tokens=500, max_kv_usage=0.9),
    WorkerBudget(max_in_flight=3, max_in_flight_per_class={"rag": 1}),
]
print(repr(run_log(log, limits).trace))
"""


def test_decisions_do_not_depend_on_the_hash_seed() -> None:
    outputs = []
    for seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1]
    assert "admit" in outputs[0] and len(outputs[0]) > 10_000
