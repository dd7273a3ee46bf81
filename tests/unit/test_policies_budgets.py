"""Admission budgets per worker: slots, per-class caps, prefill tokens, interactive reserve,
scraped saturation, placement; and a property test that they are never exceeded."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from hearthgate.policies import Admission, Scheduler, WorkerBudget, WorkerSnapshot
from hearthgate.policies.budgets import Verdict, WorkerLoad, check, upstream_priority
from tests.unit.test_policies_support import (
    CLASSES,
    OP_CLASSES,
    Mirror,
    Op,
    budgets,
    log_settings,
    ops,
    req,
    run_log,
    worker,
)


def ids(admissions: list[Admission]) -> list[str]:
    return [a.request.id for a in admissions]


def test_total_and_per_class_caps() -> None:
    sched = Scheduler(CLASSES)
    for i in range(5):
        sched.enqueue(req(f"c{i}", "chat", arrival=i), 0.0)
        sched.enqueue(req(f"e{i}", "embed", arrival=i), 0.0)
    w = [worker(max_in_flight=4, max_in_flight_per_class={"chat": 2})]
    assert ids(sched.admit(0.0, w)) == ["c0", "c1", "e0", "e1"]
    assert sched.admit(0.0, w) == []
    sched.on_finish("c0", None, None, 1.0)
    assert ids(sched.admit(1.0, w)) == ["c2"]


def test_prefill_budget_counts_prompts_until_their_first_token() -> None:
    sched = Scheduler(CLASSES)
    for i in range(4):
        sched.enqueue(req(f"g{i}", "rag", arrival=i, prompt=400), 0.0)
    w = [worker(prefill_token_budget=1000)]
    assert ids(sched.admit(0.0, w)) == ["g0", "g1"]
    assert sched.worker_usage()["w0"].prefill_tokens == 800
    assert sched.on_first_token("g0", 0.5)
    assert not sched.on_first_token("g0", 0.6)  # released once only
    assert ids(sched.admit(0.6, w)) == ["g2"]
    sched.on_progress("g1", 1, 0.7)  # output implies the first token
    assert ids(sched.admit(0.7, w)) == ["g3"]
    sched.on_finish("g2", None, None, 0.8)  # ended before a first token: released too
    assert sched.worker_usage()["w0"].prefill_tokens == 400


def test_oversized_prompt_goes_alone_and_holds_smaller_background_work() -> None:
    sched = Scheduler(CLASSES)
    sched.enqueue(req("g0", "rag", arrival=0, prompt=500), 0.0)
    w = [worker(prefill_token_budget=2048, interactive_reserved_prefill_tokens=512)]
    assert ids(sched.admit(0.0, w)) == ["g0"]
    sched.enqueue(req("big", "rag", arrival=1, prompt=3000), 1.0)
    sched.enqueue(req("e0", "embed", arrival=1, prompt=100), 1.0)
    # big does not fit next to g0; e0 would, but must not overtake the higher band's head.
    assert sched.admit(1.0, w) == []
    sched.on_first_token("g0", 2.0)
    assert ids(sched.admit(2.0, w)) == ["big"]  # alone: nothing else is in prefill
    assert sched.admit(2.0, w) == []  # e0 waits while big is in prefill
    # The interactive reserve stays usable next to the oversized prompt.
    sched.enqueue(req("v0", "voice", arrival=2, prompt=300), 2.0)
    sched.enqueue(req("v1", "voice", arrival=2, prompt=300), 2.0)
    assert ids(sched.admit(2.0, w)) == ["v0"]  # v1 would pass the 512 reserve
    sched.on_first_token("big", 3.0)
    assert ids(sched.admit(3.0, w)) == ["v1", "e0"]


def test_background_keeps_off_the_reserved_prefill_tokens() -> None:
    sched = Scheduler(CLASSES)
    for i in range(3):
        sched.enqueue(req(f"g{i}", "rag", arrival=i, prompt=500), 0.0)
    w = [worker(prefill_token_budget=2000, interactive_reserved_prefill_tokens=600)]
    assert ids(sched.admit(0.0, w)) == ["g0", "g1"]  # a third would need 1500 > 1400
    sched.enqueue(req("c0", "chat", arrival=1, prompt=900), 1.0)
    assert ids(sched.admit(1.0, w)) == ["c0"]


def test_saturation_holds_background_but_not_interactive() -> None:
    sched = Scheduler(CLASSES)
    sched.enqueue(req("b0", "batch"), 0.0)
    sched.enqueue(req("c0", "chat"), 0.0)
    limits: dict[str, Any] = {"max_scraped_waiting": 2.0, "max_kv_usage": 0.9}
    assert ids(sched.admit(0.0, [worker(waiting=3, **limits)])) == ["c0"]
    assert sched.admit(0.0, [worker(kv=0.95, **limits)]) == []
    assert ids(sched.admit(0.0, [worker(waiting=2, kv=0.9, **limits)])) == ["b0"]


def test_placement_least_in_flight_then_name_and_never_unhealthy() -> None:
    sched = Scheduler(CLASSES)
    for i in range(5):
        sched.enqueue(req(f"c{i}", arrival=i), 0.0)
    ws = [worker("b"), worker("a"), worker("z", healthy=False)]
    got = [(a.request.id, a.worker) for a in sched.admit(0.0, ws)]
    assert got == [("c0", "a"), ("c1", "b"), ("c2", "a"), ("c3", "b"), ("c4", "a")]
    assert sched.worker_of("c4") == "a" and sched.worker_of("nope") is None


def test_requests_go_only_to_their_workers_and_holds_are_per_worker() -> None:
    sched = Scheduler(CLASSES)
    gen, emb = frozenset({"gen"}), frozenset({"emb"})
    sched.enqueue(replace(req("g0", "rag", prompt=900), workers=gen), 0.0)
    sched.enqueue(replace(req("g1", "rag", arrival=1, prompt=900), workers=gen), 0.0)
    sched.enqueue(replace(req("e0", "embed", arrival=2, prompt=50), workers=emb), 0.0)
    sched.enqueue(req("b0", "batch", arrival=3, prompt=50), 0.0)
    ws = [worker("gen", prefill_token_budget=1000), worker("emb")]
    got = [(a.request.id, a.worker) for a in sched.admit(0.0, ws)]
    # g1 waits for gen's prefill; e0 and b0 go to emb, which g1 cannot use anyway.
    assert got == [("g0", "gen"), ("e0", "emb"), ("b0", "emb")]
    sched.enqueue(replace(req("v0", "voice"), workers=emb), 0.0)
    sched.enqueue(req("b1", "batch", arrival=4, prompt=50), 0.0)
    assert [(a.request.id, a.worker) for a in sched.admit(0.0, ws)] == [
        ("v0", "emb"),
        ("b1", "emb"),
    ]
    sched.enqueue(replace(req("v1", "voice"), workers=frozenset({"gone"})), 0.0)
    assert sched.admit(0.0, ws) == []  # no such worker: stays queued, blocks nothing
    assert sched.is_queued("v1")


def test_a_head_waiting_for_its_worker_does_not_block_its_class_elsewhere() -> None:
    sched = Scheduler(CLASSES)
    a, b = frozenset({"a"}), frozenset({"b"})
    sched.enqueue(replace(req("x0", tenant="t1", arrival=0), workers=b), 0.0)
    sched.enqueue(replace(req("x1", tenant="t1", arrival=1), workers=a), 0.0)
    sched.enqueue(replace(req("y0", tenant="t2", arrival=2), workers=b), 0.0)
    sched.enqueue(replace(req("y1", tenant="t2", arrival=3), workers=a), 0.0)
    ws = [worker("a"), worker("b", healthy=False)]
    # t1 is VTC's pick but its head needs the down worker b: its next request goes to a,
    # then t2 (now the smaller counter) skips its own b-bound head the same way.
    assert ids(sched.admit(0.0, ws)) == ["x1", "y1"]
    ws = [worker("a"), worker("b", max_in_flight=1)]
    assert ids(sched.admit(1.0, ws)) == ["x0"]  # t1 then t2 by counter; b holds one
    assert sched.is_queued("y0")


def test_no_healthy_worker_admits_nothing() -> None:
    sched = Scheduler(CLASSES)
    sched.enqueue(req("c0"), 0.0)
    assert sched.admit(0.0, []) == []
    assert sched.admit(0.0, [worker(healthy=False)]) == []
    assert sched.queued_count == 1


def test_check_reports_the_first_limit_in_the_way() -> None:
    load = WorkerLoad("w0")
    load.add("chat", True, 100)
    usage = load.usage()
    snap = worker(
        max_in_flight=2, interactive_reserved_slots=1, max_in_flight_per_class={"chat": 1}
    )
    assert check(snap, usage, "chat", True, 10) is Verdict.CLASS_CAP
    assert check(snap, usage, "rag", False, 10) is Verdict.SLOTS
    assert check(snap, usage, "voice", True, 10) is Verdict.FITS
    assert check(worker(healthy=False), usage, "voice", True, 1) is Verdict.UNHEALTHY


def check_invariants(
    sched: Scheduler, workers: list[WorkerSnapshot], mirror: Mirror, admitted: list[Admission]
) -> None:
    interactive = {c.name: c.interactive for c in OP_CLASSES}
    snaps = {w.name: w for w in workers}
    for a in admitted:
        assert snaps[a.worker].healthy
        assert a.request.workers is None or a.worker in a.request.workers
        if not interactive[a.request.cls]:
            assert not snaps[a.worker].saturated
    usage = sched.worker_usage()
    for w in workers:
        mine = [(r, p) for r, name, p in mirror.running.values() if name == w.name]
        in_prefill = [r for r, p in mine if p]
        background = [r for r, _ in mine if not interactive[r.cls]]
        bg_prefill = [r for r in in_prefill if not interactive[r.cls]]
        prefill = sum(r.prompt_tokens for r in in_prefill)
        # The scheduler's own view agrees with the test's account.
        u = usage[w.name]
        assert u.in_flight == len(mine)
        assert dict(u.in_flight_by_class) == dict(Counter(r.cls for r, _ in mine))
        assert u.prefill_tokens == prefill
        lim: WorkerBudget = w.limits
        for cls, cap in lim.max_in_flight_per_class.items():
            assert u.in_flight_by_class.get(cls, 0) <= cap
        if lim.max_in_flight is not None:
            assert len(mine) <= lim.max_in_flight
            assert len(background) <= lim.max_in_flight - lim.interactive_reserved_slots
        budget = lim.prefill_token_budget
        if budget is not None:
            reserve = lim.interactive_reserved_prefill_tokens
            bg_tokens = sum(r.prompt_tokens for r in bg_prefill)
            biggest_bg = max((r.prompt_tokens for r in bg_prefill), default=0)
            # Background stays off the reserve, except one oversized prompt that went alone
            # (zero-token prompts occupy no budget).
            assert bg_tokens <= budget - reserve or bg_tokens == biggest_bg
            if prefill > budget:  # only one oversized request, plus interactive in reserve
                assert any(
                    all(
                        interactive[r.cls] or not r.prompt_tokens for r in in_prefill if r is not r0
                    )
                    and prefill - r0.prompt_tokens <= reserve
                    for r0 in in_prefill
                )
        # Work conservation: an idle, healthy worker means nothing it could take is queued.
        if w.healthy and not mine:
            assert not [
                r
                for r in mirror.queued.values()
                if (r.workers is None or w.name in r.workers)
                and (interactive[r.cls] or not w.saturated)
            ]


@log_settings(120)
@given(ops, st.lists(budgets, min_size=1, max_size=2))
def test_budgets_are_never_exceeded(log: list[Op], limits: list[WorkerBudget]) -> None:
    run = run_log(log, limits, after_admit=check_invariants)
    # Finishing everything returns every budget to zero, exactly once per request.
    for rid in run.mirror.running:
        assert run.sched.on_finish(rid, None, None, run.now)
        assert not run.sched.on_finish(rid, None, None, run.now)
    assert run.sched.in_flight_count == 0
    for u in run.sched.worker_usage().values():
        assert (u.in_flight, u.prefill_tokens, u.interactive_prefill_tokens) == (0, 0, 0)
        assert u.prefill_requests == 0 and not u.in_flight_by_class
        assert not u.awaiting and not u.interactive_by_app  # no light app left "waiting"


def test_n_completions_take_a_slot_each_and_too_many_run_alone() -> None:
    sched = Scheduler(CLASSES)
    sched.enqueue(replace(req("n3", "chat", arrival=0), sequences=3), 0.0)
    sched.enqueue(replace(req("n2", "chat", arrival=1), sequences=2), 0.0)
    sched.enqueue(req("one", "chat", arrival=2), 0.0)
    w = [worker(max_in_flight=2)]
    # n3 has more sequences than the worker's slots: it runs alone, and holds all of them.
    assert ids(sched.admit(0.0, w)) == ["n3"]
    assert sched.worker_usage()["w0"].in_flight == 3
    sched.on_finish("n3", 1, 3, 1.0)
    assert ids(sched.admit(1.0, w)) == ["n2"]  # 2 sequences fill the 2 slots
    assert sched.admit(1.0, w) == []
    sched.on_finish("n2", 1, 2, 2.0)
    assert ids(sched.admit(2.0, w)) == ["one"]
    assert sched.worker_usage()["w0"].in_flight == 1


@given(st.integers(-50, 50), st.integers(-50, 50), st.booleans(), st.booleans())
def test_upstream_priority_keeps_class_order_and_puts_a_flood_last_within_its_class(
    p: int, q: int, p_floods: bool, q_floods: bool
) -> None:
    a, b = upstream_priority(p, p_floods), upstream_priority(q, q_floods)
    if p < q:
        assert a < b  # a flood of a more urgent class still goes before a less urgent class
    elif p == q and p_floods != q_floods:
        assert (a > b) == p_floods  # within a class, the flooding app goes after
