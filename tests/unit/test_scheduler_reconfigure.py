"""``Scheduler.reconfigure``: new settings applied in place (a settings reload) keep every
queued and in-flight request, and act on the very next admission."""

from __future__ import annotations

import pytest

from hearthgate.policies import Scheduler, TenantPolicy
from tests.unit.test_policies_support import BATCH, CHAT, RAG, req, with_, worker


def admit_order(sched: Scheduler, slots: int = 1, limit: int = 100) -> list[str]:
    """Admit one at a time on ``slots`` slots, finishing each at once: ids in order."""
    w = [worker(max_in_flight=slots)]
    out: list[str] = []
    for _ in range(limit):
        got = sched.admit(0.0, w)
        if not got:
            break
        for a in got:
            out.append(a.request.id)
            assert sched.on_finish(a.request.id, None, None, 0.0)
    return out


def test_a_new_priority_reorders_what_is_already_queued() -> None:
    sched = Scheduler([CHAT, RAG])
    assert sched.enqueue(req("r1", "rag", arrival=0.0), 0.0) is None
    assert sched.enqueue(req("c1", "chat", arrival=1.0), 1.0) is None
    sched.reconfigure([CHAT, with_(RAG, priority=0)])
    assert sched.classes["rag"].priority == 0
    assert admit_order(sched) == ["r1", "c1"]


def test_without_reconfigure_the_same_queue_serves_chat_first() -> None:
    """The control of the test above: the order did change because of reconfigure."""
    sched = Scheduler([CHAT, RAG])
    assert sched.enqueue(req("r1", "rag", arrival=0.0), 0.0) is None
    assert sched.enqueue(req("c1", "chat", arrival=1.0), 1.0) is None
    assert admit_order(sched) == ["c1", "r1"]


def test_requests_in_flight_finish_normally_after_a_reconfigure() -> None:
    sched = Scheduler([CHAT, RAG])
    w = [worker(max_in_flight=1)]
    assert sched.enqueue(req("c1", "chat"), 0.0) is None
    (a,) = sched.admit(0.0, w)
    assert sched.enqueue(req("c2", "chat"), 0.0) is None
    sched.reconfigure([with_(CHAT, priority=3), RAG, BATCH])
    assert sched.admit(0.0, w) == []  # the slot is still taken by c1
    assert sched.on_finish(a.request.id, 5, 5, 0.0)
    assert [x.request.id for x in sched.admit(0.0, w)] == ["c2"]


def test_a_new_tenant_cap_counts_requests_already_in_flight() -> None:
    sched = Scheduler([CHAT], [TenantPolicy("a"), TenantPolicy("b")])
    w = [worker(max_in_flight=10)]
    for i in range(2):
        assert sched.enqueue(req(f"a{i}", tenant="a", arrival=i), 0.0) is None
    assert len(sched.admit(0.0, w)) == 2
    assert sched.enqueue(req("a2", tenant="a", arrival=2), 0.0) is None
    assert sched.enqueue(req("b0", tenant="b", arrival=3), 0.0) is None
    sched.reconfigure([CHAT], [TenantPolicy("a", max_in_flight=2), TenantPolicy("b")])
    assert [x.request.id for x in sched.admit(0.0, w)] == ["b0"]  # a is at its cap
    assert sched.on_finish("a0", None, None, 0.0)
    assert [x.request.id for x in sched.admit(0.0, w)] == ["a2"]


def test_new_weights_weigh_later_service_only() -> None:
    sched = Scheduler([CHAT], [TenantPolicy("a"), TenantPolicy("b")], w_in=1.0, w_out=0.0)
    w = [worker(max_in_flight=1)]
    assert sched.enqueue(req("a0", tenant="a", prompt=100, max_tokens=0), 0.0) is None
    (x,) = sched.admit(0.0, w)
    sched.on_finish(x.request.id, None, None, 0.0)
    before = sched.tenant_counters()["chat"]["a"]
    sched.reconfigure([CHAT], [TenantPolicy("a", weight=4.0), TenantPolicy("b")], w_out=0.0)
    assert sched.tenant_counters()["chat"]["a"] == before == 100.0
    assert sched.enqueue(req("a1", tenant="a", prompt=100, max_tokens=0), 0.0) is None
    (x,) = sched.admit(0.0, w)
    sched.on_finish(x.request.id, None, None, 0.0)
    assert sched.tenant_counters()["chat"]["a"] == 125.0  # 100 + 100 / 4


def test_a_new_ordering_resorts_the_queued_requests() -> None:
    sched = Scheduler([CHAT])
    # Arrival order c0, c1, c2; deadlines the other way round.
    for i, deadline in enumerate((30.0, 20.0, 10.0)):
        assert sched.enqueue(req(f"c{i}", arrival=float(i), deadline=deadline), 0.0) is None
    sched.reconfigure([with_(CHAT, ordering="edf")])
    assert admit_order(sched) == ["c2", "c1", "c0"]


def test_a_new_fair_share_kind_takes_over_the_backlogged_tenants() -> None:
    sched = Scheduler([CHAT], [TenantPolicy("a"), TenantPolicy("b")])
    w = [worker(max_in_flight=1)]
    assert sched.enqueue(req("a0", tenant="a", prompt=1000), 0.0) is None
    (x,) = sched.admit(0.0, w)
    sched.on_finish(x.request.id, None, None, 0.0)  # a has used far more than b
    assert sched.enqueue(req("a1", tenant="a", arrival=1.0), 0.0) is None
    assert sched.enqueue(req("b1", tenant="b", arrival=2.0), 0.0) is None
    sched.reconfigure([with_(CHAT, fair_share="fcfs")], [TenantPolicy("a"), TenantPolicy("b")])
    assert admit_order(sched) == ["a1", "b1"]  # arrival order now, not VTC's "b first"


def test_a_class_can_be_added_and_an_idle_one_removed() -> None:
    sched = Scheduler([CHAT, BATCH])
    sched.reconfigure([with_(RAG, priority=0), CHAT])
    assert list(sched.classes) == ["rag", "chat"]
    assert sched.enqueue(req("r", "rag"), 0.0) is None
    with pytest.raises(ValueError, match="unknown class"):
        sched.enqueue(req("b", "batch"), 0.0)
    assert admit_order(sched) == ["r"]


@pytest.mark.parametrize("where", ["queued", "in flight"])
def test_removing_a_busy_class_is_refused_and_changes_nothing(where: str) -> None:
    sched = Scheduler([CHAT, BATCH], [TenantPolicy("a")])
    assert sched.enqueue(req("b0", "batch"), 0.0) is None
    if where == "in flight":
        assert len(sched.admit(0.0, [worker()])) == 1
    with pytest.raises(ValueError, match="class batch still has requests"):
        sched.reconfigure([with_(CHAT, priority=7)], [TenantPolicy("a", max_in_flight=1)])
    assert sched.classes["chat"].priority == CHAT.priority
    assert list(sched.classes) == ["chat", "batch"]


def test_invalid_settings_are_refused_and_change_nothing() -> None:
    sched = Scheduler([CHAT])
    with pytest.raises(ValueError, match="listed twice"):
        sched.reconfigure([with_(CHAT, priority=5), CHAT])
    with pytest.raises(ValueError, match="unknown ordering"):
        sched.reconfigure([with_(CHAT, ordering="lifo")])
    with pytest.raises(ValueError, match="at least one class"):
        sched.reconfigure([])
    assert sched.classes["chat"] == CHAT
