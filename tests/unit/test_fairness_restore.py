"""Fair-share state across a restart: ``Scheduler.fairness_snapshot`` / ``restore_fairness``.

A restored VTC class must behave as the snapshotted one would have if its backlog had
emptied at that moment: a tenant that consumed more than the others still owes them the
difference above the class's floor, a lag below the floor is not credit, a tenant missing
from the snapshot starts like any new one, and junk in the snapshot is ignored.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hearthgate.policies import Scheduler, TenantPolicy
from tests.unit.test_policies_support import (
    BATCH,
    CHAT,
    OP_CLASSES,
    OP_TENANTS,
    RAG,
    Op,
    budgets,
    log_settings,
    ops,
    req,
    run_log,
    with_,
    worker,
)

TENANTS = (TenantPolicy("heavy"), TenantPolicy("light"), TenantPolicy("idle"))
FCFS_RAG = with_(RAG, fair_share="fcfs")


def build(*tenants: TenantPolicy) -> Scheduler:
    return Scheduler([CHAT, FCFS_RAG, BATCH], tenants or TENANTS)


def restored(snapshot: Any, *tenants: TenantPolicy, **kw: Any) -> Scheduler:
    """A new scheduler restored from ``snapshot`` after a trip through JSON."""
    sched = build(*tenants)
    sched.restore_fairness(json.loads(json.dumps(snapshot)), **kw)
    return sched


def backlog(sched: Scheduler, cls: str, tenant: str, count: int, prompt: int = 100) -> None:
    """``count`` requests costing ``prompt`` weighted tokens each (no output)."""
    for i in range(count):
        rid = f"{cls}-{tenant}-{i:03d}"
        assert sched.enqueue(req(rid, cls, tenant, prompt=prompt, max_tokens=0), 0.0) is None


def serve(sched: Scheduler, limit: int = 1000) -> dict[str, list[str]]:
    """Admit one request at a time on one slot, finishing each at once: class -> the tenants
    in service order."""
    w = [worker(max_in_flight=1)]
    order: dict[str, list[str]] = {}
    for _ in range(limit):
        admitted = sched.admit(0.0, w)
        if not admitted:
            break
        (a,) = admitted
        order.setdefault(a.request.cls, []).append(a.request.tenant)
        assert sched.on_finish(a.request.id, None, None, 0.0)
    return order


# ------------------------------------------------------------------- who goes first


def test_the_tenant_that_owes_is_served_after_the_other_until_the_difference_is_made_up() -> None:
    # In chat heavy owes 450 weighted tokens, in batch light owes 250; requests cost 100.
    sched = restored({"chat": {"heavy": 450.0, "light": 0.0}, "batch": {"light": 250.0}})
    backlog(sched, "chat", "light", 12)  # the one owed comes first: nothing to lift
    backlog(sched, "chat", "heavy", 12)
    backlog(sched, "batch", "heavy", 12)
    backlog(sched, "batch", "light", 12)
    assert sched.tenant_counters()["chat"] == {"heavy": 450.0, "light": 0.0}
    order = serve(sched)
    # Light is served 5 times (0 -> 500 passes 450), then the two alternate (1:1).
    assert order["chat"] == ["light"] * 5 + ["heavy", "light"] * 7 + ["heavy"] * 5
    # The classes keep separate accounts: in batch it is light that waits, 3 turns.
    assert order["batch"] == ["heavy"] * 3 + ["light", "heavy"] * 9 + ["light"] * 3


def test_without_a_restore_the_heavy_tenant_gets_a_fresh_start() -> None:
    sched = build()
    backlog(sched, "chat", "light", 6)
    backlog(sched, "chat", "heavy", 6)
    assert serve(sched)["chat"] == ["heavy", "light"] * 6  # ties: head id


def drained_scheduler() -> Scheduler:
    """A scheduler that ran, then emptied: idle was served long ago, light and heavy shared
    the class since, and heavy's long answer was charged after it left the backlog."""
    sched = build()
    backlog(sched, "chat", "idle", 1, prompt=10)
    serve(sched)
    backlog(sched, "chat", "light", 10)
    backlog(sched, "chat", "heavy", 10)
    serve(sched)
    sched.enqueue(req("long", "chat", "heavy", prompt=100, max_tokens=200), 0.0)
    (a,) = sched.admit(0.0, [worker()])
    assert sched.on_finish(a.request.id, 100, 200, 0.0)  # 2 * 200 = 400 after it left
    assert sched.tenant_counters()["chat"] == {"heavy": 1510.0, "idle": 10.0, "light": 1010.0}
    return sched


@pytest.mark.parametrize("newcomer", ["idle", "light", "newbie"])
def test_a_restart_changes_nothing_the_debt_survives_and_an_idle_lag_is_no_credit(
    newcomer: str,
) -> None:
    before = drained_scheduler()
    # The floor is 1110 (heavy's counter as it left the backlog): heavy owes the 400 of its
    # answer's output, the others nothing; idle's lag of 1100 below the floor is no credit.
    snapshot = before.fairness_snapshot()
    assert snapshot == {"chat": {"heavy": 400.0, "idle": 0.0, "light": 0.0}, "rag": {}, "batch": {}}
    after = restored(snapshot)
    for sched in (before, after):
        backlog(sched, "chat", newcomer, 10)  # "newbie" is unknown to the snapshot
        backlog(sched, "chat", "heavy", 10)
    order = serve(after)["chat"]
    assert order == serve(before)["chat"]
    assert order[:5] == [newcomer] * 4 + ["heavy"]  # 400 made up, then a tie: head id


def test_a_plain_copy_of_the_counters_would_turn_an_idle_lag_into_credit() -> None:
    copied = restored(drained_scheduler().tenant_counters())  # what restoring must not do
    backlog(copied, "chat", "idle", 20)
    backlog(copied, "chat", "heavy", 20)
    assert serve(copied)["chat"][:16] == ["idle"] * 15 + ["heavy"]  # 1500, not 400


def test_a_tenant_coming_back_while_only_one_that_owes_more_waits_is_lifted_as_before() -> None:
    before = drained_scheduler()
    after = restored(before.fairness_snapshot())
    for sched in (before, after):
        backlog(sched, "chat", "heavy", 6)  # heavy first: nobody is owed anything yet
        backlog(sched, "chat", "light", 6)
    counters = after.tenant_counters()["chat"]
    assert counters["light"] == counters["heavy"] == 400.0  # VTC's lift, as while running
    assert serve(after) == serve(before) == {"chat": ["heavy", "light"] * 6}


def test_a_snapshot_taken_mid_run_measures_from_the_smallest_backlogged_counter() -> None:
    sched = build()
    backlog(sched, "chat", "light", 3)
    backlog(sched, "chat", "idle", 3)
    sched.enqueue(req("chat-heavy-x", "chat", "heavy", prompt=100, max_tokens=200), 0.0)
    admitted = sched.admit(0.0, [worker(max_in_flight=2)])
    assert [a.request.tenant for a in admitted] == ["heavy", "idle"]  # ties: head id
    sched.on_progress("chat-heavy-x", 200, 1.0)
    assert sched.tenant_counters()["chat"] == {"heavy": 500.0, "idle": 100.0, "light": 0.0}
    # light and idle are waiting, light at 0: idle owes it one request, heavy five.
    snapshot = sched.fairness_snapshot()
    assert snapshot["chat"] == {"heavy": 500.0, "idle": 100.0, "light": 0.0}
    after = restored(snapshot)
    for tenant in ("light", "idle", "heavy"):
        backlog(after, "chat", tenant, 6)
    assert serve(after)["chat"][:6] == ["light", "idle", "light", "idle", "light", "idle"]


@settings(max_examples=40, deadline=None)
@given(
    st.floats(0, 3000, allow_nan=False),
    st.integers(50, 200),
    st.sampled_from([1.0, 2.0]),
)
def test_service_ratio_until_the_difference_is_made_up(
    debt: float, cost: int, heavy_weight: float
) -> None:
    tenants = (TenantPolicy("heavy", heavy_weight), TenantPolicy("light"))
    sched = restored({"chat": {"heavy": debt}}, *tenants)
    catch_up = 0  # light's turns: it goes first while its counter is below heavy's debt
    while catch_up * cost < debt:
        catch_up += 1
    backlog(sched, "chat", "light", catch_up + 40, prompt=cost)
    backlog(sched, "chat", "heavy", 80, prompt=cost)
    w = [worker(max_in_flight=1)]
    order = []
    for _ in range(catch_up + 60):
        (a,) = sched.admit(0.0, w)
        order.append(a.request.tenant)
        sched.on_finish(a.request.id, None, None, 0.0)
        counters = sched.tenant_counters()["chat"]
        if len(order) > catch_up:  # made up: VTC's bound for one slot, one request size
            assert abs(counters["light"] - counters["heavy"]) <= cost
    assert order[: catch_up + 1] == ["light"] * catch_up + ["heavy"]
    rest = order[catch_up:]  # then turns in proportion to the weights
    assert abs(rest.count("heavy") / heavy_weight - rest.count("light")) <= 2


# ------------------------------------------------------- what is restored, what ignored


def test_removed_classes_and_tenants_are_ignored_listed_extras_are_kept() -> None:
    snapshot = {
        "gone": {"heavy": 5.0},
        "chat": {"heavy": 100.0, "retired": 50.0, "anonymous": 30.0},
        "rag": {"heavy": 7.0},  # FCFS keeps no state
    }
    assert restored(snapshot).fairness_snapshot() == {
        "chat": {"heavy": 100.0},
        "rag": {},
        "batch": {},  # absent from the snapshot: starts afresh
    }
    kept = restored(snapshot, extra_tenants=["anonymous"]).fairness_snapshot()
    assert kept["chat"] == {"anonymous": 30.0, "heavy": 100.0}


JUNK = [-1, -1e-9, math.nan, math.inf, -math.inf, "12", None, True, False, [1], {"x": 1}, 10**400]


@pytest.mark.parametrize("value", JUNK, ids=repr)
def test_malformed_values_are_ignored(value: Any) -> None:
    sched = build()
    sched.restore_fairness({"chat": {"heavy": value, "light": 3}})
    assert sched.fairness_snapshot()["chat"] == {"light": 3.0}


@pytest.mark.parametrize("snapshot", [None, 3, "x", [], [["chat", {}]], {"chat": [1]}, {1: {}}])
def test_malformed_structure_is_ignored(snapshot: Any) -> None:
    sched = build()
    sched.restore_fairness(snapshot)
    assert sched.fairness_snapshot() == {"chat": {}, "rag": {}, "batch": {}}


def test_valid_edge_values() -> None:
    sched = build()
    sched.restore_fairness({"chat": {"heavy": -0.0, "light": 7, "idle": 1e300}})
    restored_chat = sched.fairness_snapshot()["chat"]
    assert restored_chat == {"heavy": 0.0, "idle": 1e300, "light": 7.0}
    assert math.copysign(1.0, restored_chat["heavy"]) == 1.0
    assert all(type(v) is float for v in restored_chat.values())


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=12,
)
names = st.sampled_from(["chat", "rag", "batch", "gone", "heavy", "light", "idle", "x"])


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(names, st.dictionaries(names, json_values) | json_values) | json_values)
def test_any_json_restores_without_raising_and_keeps_only_valid_entries(snapshot: Any) -> None:
    sched = build()
    sched.restore_fairness(snapshot)
    result = sched.fairness_snapshot()
    assert list(result) == ["chat", "rag", "batch"] and result["rag"] == {}
    for cls, tenants in result.items():
        for tenant, value in tenants.items():
            assert tenant in ("heavy", "light", "idle")
            assert math.isfinite(value) and value >= 0
            assert value == float(snapshot[cls][tenant])  # kept exactly (as a float)
    assert restored(result).fairness_snapshot() == result


def test_restore_needs_nothing_queued_or_in_flight() -> None:
    sched = build()
    sched.enqueue(req("q", "chat", "heavy"), 0.0)
    with pytest.raises(ValueError, match="nothing queued or in flight"):
        sched.restore_fairness({"chat": {"heavy": 1.0}})
    sched.admit(0.0, [worker()])
    with pytest.raises(ValueError, match="nothing queued or in flight"):
        sched.restore_fairness({"chat": {"heavy": 1.0}})
    sched.on_finish("q", None, None, 0.0)
    sched.restore_fairness({"chat": {"heavy": 1.0}})
    assert sched.tenant_counters()["chat"] == {"heavy": 1.0}


# ------------------------------------------------------------ properties over event logs


def op_scheduler() -> Scheduler:
    return Scheduler(OP_CLASSES, OP_TENANTS)


@log_settings(40)
@given(ops, st.lists(budgets, min_size=1, max_size=2))
def test_snapshot_restore_snapshot_is_stable(log: list[Op], limits: list[Any]) -> None:
    # Taken mid-run: requests queued and in flight, tenants backlogged.
    first = run_log(log, limits).sched.fairness_snapshot()
    again = op_scheduler()
    again.restore_fairness(json.loads(json.dumps(first)))
    assert again.fairness_snapshot() == first
    assert again.tenant_counters() == {c: dict(t) for c, t in first.items()}


@log_settings(40)
@given(ops, ops, st.lists(budgets, min_size=1, max_size=2))
def test_a_restored_scheduler_decides_as_the_drained_one_would(
    log: list[Op], later: list[Op], limits: list[Any]
) -> None:
    """Weights 1, 2 and 0.5 and whole tokens keep the counters exact, so even ties match."""
    run = run_log(log, limits)
    before = run.sched
    for rid in run.mirror.queued:
        assert before.cancel(rid, run.now)
    for rid in run.mirror.running:
        assert before.on_finish(rid, None, None, run.now)
    after = op_scheduler()
    after.restore_fairness(json.loads(json.dumps(before.fairness_snapshot())))
    expected = run_log(later, limits, sched=before)
    got = run_log(later, limits, sched=after)
    assert got.trace[:-2] == expected.trace[:-2]  # all but the views (absolute counters)
    assert after.fairness_snapshot() == before.fairness_snapshot()
