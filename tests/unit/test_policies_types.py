"""Value types validate on construction; views and repr show the scheduler's state."""

from __future__ import annotations

import dataclasses

import pytest

from hearthgate.policies import ClassPolicy, QueuedRequest, Scheduler, TenantPolicy, WorkerBudget
from tests.unit.test_policies_support import CLASSES, req, worker


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: req(""), "id"),
        (lambda: req("r", prompt=-1), "prompt_tokens"),
        (lambda: req("r", arrival=float("nan")), "arrival"),
        (lambda: ClassPolicy("x", 1, min_share=0.0), "min_share"),
        (lambda: ClassPolicy("x", 1, max_wait_s=0.0), "max_wait_s"),
        (lambda: ClassPolicy("x", 1, max_queue=0), "max_queue"),
        (lambda: TenantPolicy("t", 0.0), "weight"),
        (lambda: WorkerBudget(max_in_flight=2, interactive_reserved_slots=2), "reserved_slots"),
        (
            lambda: WorkerBudget(prefill_token_budget=10, interactive_reserved_prefill_tokens=11),
            "prefill",
        ),
        (lambda: WorkerBudget(max_in_flight_per_class={"chat": 0}), "chat"),
        (lambda: WorkerBudget(max_kv_usage=1.5), "max_kv_usage"),
    ],
)
def test_bad_values_are_rejected(build: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()  # type: ignore[operator]


def test_values_are_frozen_and_own_their_mappings() -> None:
    caps = {"chat": 2}
    budget = WorkerBudget(max_in_flight_per_class=caps)
    caps["chat"] = 99
    assert budget.max_in_flight_per_class["chat"] == 2
    with pytest.raises(TypeError):
        budget.max_in_flight_per_class["chat"] = 3  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        req("r").prompt_tokens = 3  # type: ignore[misc]
    assert isinstance(req("r"), QueuedRequest)


def test_saturation_needs_both_a_gauge_and_its_limit() -> None:
    assert not worker(waiting=100).saturated
    assert not worker(max_scraped_waiting=2, waiting=2).saturated
    assert worker(max_scraped_waiting=2, waiting=2.5).saturated
    assert worker(max_kv_usage=0.9, kv=0.91).saturated
    assert not worker(max_kv_usage=0.9).saturated


def test_scheduler_configuration_errors() -> None:
    with pytest.raises(ValueError, match="at least one class"):
        Scheduler([])
    with pytest.raises(ValueError, match="twice"):
        Scheduler([ClassPolicy("a", 1), ClassPolicy("a", 2)])
    with pytest.raises(ValueError, match="twice"):
        Scheduler(CLASSES, [TenantPolicy("t"), TenantPolicy("t")])
    sched = Scheduler(CLASSES)
    with pytest.raises(ValueError, match="twice"):
        sched.admit(0.0, [worker("w"), worker("w")])


def test_views_and_repr() -> None:
    sched = Scheduler(CLASSES, [TenantPolicy("notes", 2.0)])
    assert repr(sched) == "Scheduler(queued=0 [], in_flight=0 [])"
    sched.enqueue(req("c0", "chat", "app", 1.0, 100, 10), 1.0)
    sched.enqueue(req("g0", "rag", "notes", 2.0, 400, 10), 2.0)
    sched.enqueue(req("g1", "rag", "notes", 3.0, 300, 10), 3.0)
    assert [a.request.id for a in sched.admit(3.0, [worker("gpu0", max_in_flight=2)])] == [
        "c0",
        "g0",
    ]
    assert repr(sched) == "Scheduler(queued=1 [rag=1], in_flight=2 [gpu0=2])"
    stats = sched.queue_stats()
    assert list(stats) == ["voice", "chat", "rag", "embed", "batch"]
    assert (stats["rag"].depth, stats["rag"].tokens, stats["rag"].oldest_arrival) == (1, 300, 3.0)
    assert stats["rag"].dispatched_tokens == 410 and stats["voice"].oldest_arrival is None
    assert sched.tenant_counters()["rag"] == {"notes": 200.0}
    assert sched.tenant_counters()["chat"] == {"app": 100.0}
    usage = sched.worker_usage()["gpu0"]
    assert (usage.in_flight, usage.prefill_tokens, usage.interactive_prefill_tokens) == (
        2,
        500,
        100,
    )
    assert dict(usage.in_flight_by_class) == {"chat": 1, "rag": 1}
    assert sched.classes["rag"].priority == 2
