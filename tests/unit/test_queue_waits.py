"""What each class's oldest queued request waited for: the scheduler names the limit after
every pass, the ledger sums seconds per limit, /metrics exports them and the bench keeps
their increase over the steady window."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from hearthgate.gateway.metrics import SchedulerCollector
from hearthgate.loadtests.records import Sample
from hearthgate.loadtests.report import steady_gauges
from hearthgate.loadtests.sampler import QUEUE_BLOCKED, gateway_values
from hearthgate.policies import Scheduler, TenantPolicy, WorkerSnapshot
from hearthgate.policies.budgets import Verdict, WorkerLoad
from hearthgate.policies.placement import Blocked, place
from hearthgate.policies.waits import WaitLedger
from tests.unit.test_policies_support import CLASSES, req, worker


def test_the_ledger_charges_each_interval_to_the_reasons_found_at_its_start() -> None:
    ledger = WaitLedger()
    assert ledger.seconds(5.0) == {}
    ledger.settle(0.0, {"rag": "prefill"})
    ledger.settle(2.0, {"rag": "slots", "chat": "held"})
    assert ledger.current() == {"rag": "slots", "chat": "held"}
    assert ledger.seconds(5.0) == {
        ("rag", "prefill"): 2.0,
        ("rag", "slots"): 3.0,
        ("chat", "held"): 3.0,
    }
    assert ledger.seconds(1.0) == {("rag", "prefill"): 2.0}  # before the open interval
    ledger.settle(6.0, {})  # queues empty: nothing accrues any more
    assert ledger.seconds(100.0) == {
        ("rag", "prefill"): 2.0,
        ("rag", "slots"): 4.0,
        ("chat", "held"): 4.0,
    }


def test_the_scheduler_names_the_budget_in_the_way_and_counts_its_seconds() -> None:
    sched = Scheduler(CLASSES)
    for i in range(3):
        sched.enqueue(req(f"g{i}", "rag", arrival=0, prompt=400), 0.0)
    w = [worker(prefill_token_budget=1000)]
    assert len(sched.admit(0.0, w)) == 2
    assert sched.admit(2.0, w) == []  # still waiting, for the same reason
    assert sched.queue_waits(3.0) == {("rag", "prefill"): 3.0}
    sched.on_first_token("g0", 3.0)
    assert [a.request.id for a in sched.admit(3.0, w)] == ["g2"]
    assert sched.queue_waits(50.0) == {("rag", "prefill"): 3.0}  # queue empty since 3.0


def test_a_head_held_behind_a_higher_class_is_held_not_blocked_by_its_own_limit() -> None:
    sched = Scheduler(CLASSES)
    w = [worker(prefill_token_budget=2048, interactive_reserved_prefill_tokens=512)]
    sched.enqueue(req("g0", "rag", arrival=0, prompt=500), 0.0)
    sched.admit(0.0, w)
    sched.enqueue(req("big", "rag", arrival=1, prompt=3000), 1.0)
    sched.enqueue(req("e0", "embed", arrival=1, prompt=100), 1.0)
    assert sched.admit(1.0, w) == []
    assert sched.queue_waits(2.0) == {("rag", "prefill"): 1.0, ("embed", "held"): 1.0}


def test_slots_class_caps_app_caps_and_no_worker() -> None:
    def waits_of(sched: Scheduler, workers: list[WorkerSnapshot]) -> dict[tuple[str, str], float]:
        sched.admit(0.0, workers)
        sched.admit(1.0, workers)  # a second pass, one second later
        return sched.queue_waits(1.0)

    def two_chats(sched: Scheduler) -> Scheduler:
        sched.enqueue(req("c0", "chat"), 0.0)
        sched.enqueue(req("c1", "chat"), 0.0)
        return sched

    assert waits_of(two_chats(Scheduler(CLASSES)), [worker(max_in_flight=1)]) == {
        ("chat", "slots"): 1.0
    }
    capped = [worker(max_in_flight_per_class={"chat": 1})]
    assert waits_of(two_chats(Scheduler(CLASSES)), capped) == {("chat", "class_cap"): 1.0}
    one_each = Scheduler(CLASSES, [TenantPolicy("a", max_in_flight=1)])
    assert waits_of(two_chats(one_each), [worker()]) == {("chat", "app_cap"): 1.0}
    assert waits_of(two_chats(Scheduler(CLASSES)), [worker(healthy=False)]) == {
        ("chat", "no_worker"): 1.0
    }
    assert waits_of(two_chats(Scheduler(CLASSES)), []) == {("chat", "no_worker"): 1.0}


def test_placement_names_the_limit_on_the_best_scoring_worker() -> None:
    loads = {"a": WorkerLoad("a"), "b": WorkerLoad("b")}
    for name, running in (("a", 2), ("b", 1)):
        for _ in range(running):
            loads[name].add("chat", True, 10, 1, "x")
    usage = {name: load.usage() for name, load in loads.items()}
    workers = [
        worker("a", max_in_flight=2),  # full: slots
        worker("b", max_in_flight_per_class={"chat": 1}),  # fewer in flight: scores best
    ]
    spot = place(workers, usage, "chat", True, 10)
    assert (spot.worker, spot.blocked, spot.limit) == (None, Blocked.SHARED, Verdict.CLASS_CAP)
    fits = place([worker("a")], {"a": WorkerLoad("a").usage()}, "chat", True, 10)
    assert (fits.worker, fits.limit) == ("a", None)


def test_metrics_export_the_seconds_and_the_bench_keeps_their_increase() -> None:
    sched = Scheduler(CLASSES)
    sched.enqueue(req("c0", "chat"), 0.0)
    sched.enqueue(req("c1", "chat"), 0.0)
    sched.admit(0.0, [worker(max_in_flight=1)])
    registry = CollectorRegistry()
    now = [4.0]
    registry.register(SchedulerCollector(sched, None, lambda: now[0]))
    key = f'{QUEUE_BLOCKED}{{cls="chat",reason="slots"}}'
    text = generate_latest(registry).decode()
    assert f"# TYPE {QUEUE_BLOCKED} counter" in text
    first = gateway_values(text)
    now[0] = 10.0
    later = gateway_values(generate_latest(registry).decode())
    assert (first[key], later[key]) == (4.0, 10.0)
    samples = [Sample("gw", "gateway", 4.0, first), Sample("gw", "gateway", 10.0, later)]
    assert steady_gauges(samples, warmup_s=5.0, duration_s=20.0)[key] == {"increase": 6.0}
