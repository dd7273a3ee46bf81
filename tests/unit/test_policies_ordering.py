"""Ordering inside a tenant: FCFS and EDF (deadline = arrival + class TTFT target)."""

from __future__ import annotations

from hearthgate.policies import ClassPolicy, Scheduler
from hearthgate.policies.ordering import Edf, effective_deadline
from tests.unit.test_policies_support import req, worker


def order(policy: ClassPolicy, requests: list[tuple[str, float, float | None]]) -> list[str]:
    sched = Scheduler([policy])
    for rid, arrival, deadline in requests:
        sched.enqueue(req(rid, policy.name, "t", arrival, deadline=deadline), arrival)
    return [a.request.id for a in sched.admit(10.0, [worker()])]


def test_fcfs_serves_by_arrival_then_id() -> None:
    chat = ClassPolicy("chat", 1, ttft_s=1.0)
    assert order(chat, [("b", 1.0, None), ("c", 0.5, 0.1), ("a", 1.0, None)]) == ["c", "a", "b"]


def test_edf_serves_by_deadline() -> None:
    chat = ClassPolicy("chat", 1, ttft_s=1.0, ordering="edf")
    # Deadlines: late 0+5 (explicit), x 1+1, y 1.5+1, z 0.2 (explicit).
    got = order(chat, [("late", 0.0, 5.0), ("x", 1.0, None), ("y", 1.5, None), ("z", 3.0, 0.2)])
    assert got == ["z", "x", "y", "late"]


def test_effective_deadline_defaults() -> None:
    with_ttft = ClassPolicy("chat", 1, ttft_s=0.8)
    without = ClassPolicy("batch", 4)
    assert effective_deadline(req("r", arrival=2.0), with_ttft) == 2.8
    assert effective_deadline(req("r", arrival=2.0), without) == 2.0
    assert effective_deadline(req("r", arrival=2.0, deadline=9.0), with_ttft) == 9.0
    assert Edf().sort_key(req("r", arrival=2.0), with_ttft) == (2.8, 2.0, "r")
