"""Shedding (queue caps, queue timeouts) and cancellation: removed requests leave no trace."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hearthgate.policies import Rejection, Scheduler, TenantPolicy
from hearthgate.policies.shedding import StandingLine, line_keeps
from tests.unit.test_policies_support import (
    CHAT,
    CLASSES,
    EMBED,
    RAG,
    Op,
    budgets,
    classes,
    log_settings,
    make_op,
    ops,
    req,
    run_log,
    with_,
    worker,
)


def views(sched: Scheduler) -> tuple[Any, ...]:
    return (
        sched.queue_stats(),
        sched.tenant_counters(),
        sched.worker_usage(),
        sched.queued_count,
        sched.in_flight_count,
        repr(sched),
    )


def test_queue_cap_by_count() -> None:
    sched = Scheduler(classes(with_(CHAT, max_queue=2)))
    assert sched.enqueue(req("c0", prompt=5), 0.0) is None
    assert sched.enqueue(req("c1", prompt=7), 0.0) is None
    assert sched.enqueue(req("c2"), 0.0) == Rejection("queue_full", "chat", 2, 12)
    assert not sched.is_queued("c2")
    assert sched.enqueue(req("v0", "voice"), 0.0) is None  # other classes are not capped
    assert sched.cancel("c0", 1.0)
    assert sched.enqueue(req("c2"), 1.0) is None  # the rejected id left nothing behind


def test_queue_cap_by_tokens_admits_an_oversized_request_into_an_empty_queue() -> None:
    sched = Scheduler(classes(with_(RAG, max_queued_tokens=1000)))
    assert sched.enqueue(req("huge", "rag", prompt=5000), 0.0) is None
    assert sched.enqueue(req("g1", "rag", prompt=1), 0.0) == Rejection(
        "queue_tokens_full", "rag", 1, 5000
    )
    sched.cancel("huge", 0.0)
    assert sched.enqueue(req("g1", "rag", prompt=600), 0.0) is None
    assert sched.enqueue(req("g2", "rag", prompt=400), 0.0) is None  # exactly at the cap
    assert sched.enqueue(req("g3", "rag", prompt=1), 0.0) is not None
    assert sched.queue_stats()["rag"].tokens == 1000


def test_expire_removes_requests_at_their_queue_timeout_oldest_first() -> None:
    sched = Scheduler(classes(with_(CHAT, queue_timeout_s=5.0), with_(RAG, queue_timeout_s=2.0)))
    sched.enqueue(req("c0", arrival=1.0), 1.0)
    sched.enqueue(req("c1", arrival=0.0), 1.0)
    sched.enqueue(req("g0", "rag", arrival=3.0), 3.0)
    sched.enqueue(req("v0", "voice", arrival=0.0), 3.0)  # no timeout: never expires
    assert sched.expire(4.9) == []
    assert [r.id for r in sched.expire(5.0)] == ["c1", "g0"]
    assert [r.id for r in sched.expire(100.0)] == ["c0"]
    assert sched.queued_count == 1 and sched.is_queued("v0")


def test_cancel_is_for_queued_requests_only() -> None:
    sched = Scheduler(CLASSES)
    sched.enqueue(req("c0"), 0.0)
    sched.admit(0.0, [worker()])
    assert not sched.cancel("c0", 1.0)  # in flight: ends through on_finish
    assert not sched.cancel("nope", 1.0)
    assert sched.on_finish("c0", None, None, 1.0)


def test_unknown_class_and_repeated_ids_are_errors() -> None:
    sched = Scheduler(CLASSES)
    with pytest.raises(ValueError, match="unknown class"):
        sched.enqueue(req("x", "video"), 0.0)
    sched.enqueue(req("c0"), 0.0)
    with pytest.raises(ValueError, match="already"):
        sched.enqueue(req("c0"), 0.0)
    sched.admit(0.0, [worker()])
    with pytest.raises(ValueError, match="already"):
        sched.enqueue(req("c0"), 0.0)


def busy_scheduler() -> Scheduler:
    """Tenant a served and still backlogged, a worker full: nothing else can be admitted."""
    sched = Scheduler(
        classes(with_(CHAT, queue_timeout_s=3.0)), [TenantPolicy("a", 2.0), TenantPolicy("b")]
    )
    for i in range(3):
        sched.enqueue(req(f"a{i}", tenant="a", prompt=40, max_tokens=8), 0.0)
    sched.admit(0.0, [worker(max_in_flight=1)])
    sched.on_progress("a0", 3, 0.5)
    return sched


@pytest.mark.parametrize("tenant", ["a", "b", "newcomer"])
def test_cancelled_request_leaves_no_trace(tenant: str) -> None:
    sched, twin = busy_scheduler(), busy_scheduler()
    before = views(sched)
    # b or the newcomer would be lifted to a's counter; a cancel must undo that too.
    sched.enqueue(req("x", tenant=tenant, arrival=1.0, prompt=99), 1.0)
    assert views(sched) != before
    assert sched.cancel("x", 1.0)
    assert views(sched) == before
    assert not sched.is_queued("x") and not sched.cancel("x", 1.0)
    assert not sched.on_finish("x", 1, 1, 1.0) and not sched.on_first_token("x", 1.0)
    # ...and every later decision is the one the twin, which never saw x, makes.
    for s in (sched, twin):
        s.on_finish("a0", 40, 3, 2.0)
        s.enqueue(req("b1", tenant="b", arrival=2.0), 2.0)
    ws = [worker(max_in_flight=3)]
    assert sched.admit(2.0, ws) == twin.admit(2.0, ws)
    assert views(sched) == views(twin)


def test_expired_request_leaves_no_trace() -> None:
    sched, twin = busy_scheduler(), busy_scheduler()
    sched.enqueue(req("x", tenant="newcomer", arrival=1.0, prompt=99), 1.0)
    full = [worker(max_in_flight=1)]
    assert sched.admit(2.0, full) == []
    # a1, a2 arrived at 0 and time out too; the twin expires them the same way.
    assert [r.id for r in sched.expire(4.0)] == ["a1", "a2", "x"]
    assert [r.id for r in twin.expire(4.0)] == ["a1", "a2"]
    assert views(sched) == views(twin)
    assert not sched.cancel("x", 4.0) and not sched.on_finish("x", None, None, 4.0)


ghost = st.builds(
    make_op, st.just("ghost"), st.integers(0, 60), st.integers(0, 2000), st.integers(0, 64)
)


@log_settings(80)
@given(
    ops,
    st.lists(budgets, min_size=1, max_size=2),
    st.lists(st.tuples(st.integers(0, 100), ghost), max_size=10),
)
def test_requests_cancelled_on_arrival_change_no_decision(
    log: list[Op], limits: list[Any], ghosts: list[tuple[int, Op]]
) -> None:
    haunted = list(log)
    for at, g in sorted(ghosts, key=lambda x: x[0], reverse=True):
        haunted.insert(min(at, len(haunted)), g)
    assert run_log(haunted, limits).trace == run_log(log, limits).trace


# ------------------------------------------------- late shedding (ClassPolicy.shed_late)

LATE_RAG = with_(RAG, shed_late=True)  # ttft_s 3.0


def fill(sched: Scheduler, n: int, tenant: str = "a", cls: str = "rag") -> None:
    for i in range(n):
        assert sched.enqueue(req(f"{tenant}{i}", cls, tenant, arrival=i), 0.0) is None


def test_a_request_that_would_wait_past_its_target_is_shed_with_a_justified_wait() -> None:
    sched = Scheduler([CHAT, LATE_RAG])
    fill(sched, 6)  # at 2 requests/s, 6 ahead is a 3 s wait: still within the target
    assert sched.enqueue(req("a6", "rag", "a"), 0.0, drain_rate=2.0) is None
    got = sched.enqueue(req("a7", "rag", "a"), 0.0, drain_rate=2.0)  # 7 ahead: 3.5 s
    assert got == Rejection("target_unreachable", "rag", 7, 70, 1.0, ahead=7)
    got = sched.enqueue(req("a8", "rag", "a"), 0.0, drain_rate=0.5)  # 14 s: retry in 11 s
    assert got is not None and got.retry_after_s == pytest.approx(11.0)
    assert sched.queued_count == 7  # the shed requests left no trace


def test_requests_waiting_in_a_worker_count_as_ahead() -> None:
    """A class no budget holds back (embeddings) is sent to the worker at once: its line is
    the ``unanswered`` requests in flight there, not the gateway's (empty) queue."""
    sched = Scheduler([with_(EMBED, ttft_s=2.0, shed_late=True)])
    # 4 in the worker at 2/s: a 2 s wait, within target; 5 make it 2.5 s
    assert sched.enqueue(req("e4", "embed"), 0.0, drain_rate=2.0, unanswered=4) is None
    got = sched.enqueue(req("e5", "embed"), 0.0, drain_rate=2.0, unanswered=4)
    assert got == Rejection("target_unreachable", "embed", 1, 10, 1.0, ahead=5)
    sched.cancel("e4", 0.0)
    got = sched.enqueue(req("e6", "embed"), 0.0, drain_rate=2.0, unanswered=5)
    assert got is not None and got.ahead == 5 and got.queued == 0


def test_no_shedding_without_a_drain_rate_or_with_nothing_ahead() -> None:
    sched = Scheduler([CHAT, LATE_RAG])
    fill(sched, 50)
    assert sched.enqueue(req("x", "rag", "a"), 0.0, drain_rate=0.0) is None  # rate unknown
    empty = Scheduler([CHAT, LATE_RAG])
    assert empty.enqueue(req("y", "rag", "a"), 0.0, drain_rate=0.001) is None


@pytest.mark.parametrize(
    "policy",
    [RAG, with_(CHAT, shed_late=True), with_(RAG, shed_late=True, ttft_s=None)],
    ids=["not asked", "interactive", "no target"],
)
def test_only_background_classes_with_a_target_that_ask_for_it_shed(policy: Any) -> None:
    sched = Scheduler([policy])
    fill(sched, 50, cls=policy.name)
    assert sched.enqueue(req("x", policy.name, "a"), 0.0, drain_rate=1.0) is None


def test_a_light_app_is_not_shed_for_a_heavy_apps_backlog() -> None:
    """With fair sharing, a request of an app with nothing queued goes near the front: it
    is not refused because another app filled the queue; the flooding app is."""
    sched = Scheduler([LATE_RAG], [TenantPolicy("heavy"), TenantPolicy("light")])
    fill(sched, 20, tenant="heavy")
    assert sched.enqueue(req("l0", "rag", "light"), 0.0, drain_rate=2.0) is None
    got = sched.enqueue(req("h20", "rag", "heavy"), 0.0, drain_rate=2.0)
    assert got is not None and got.reason == "target_unreachable"
    fcfs = Scheduler([with_(LATE_RAG, fair_share="fcfs")])
    fill(fcfs, 20, tenant="heavy")  # arrival order between apps: everyone is behind all
    got = fcfs.enqueue(req("l0", "rag", "light"), 0.0, drain_rate=2.0)
    assert got is not None and got.reason == "target_unreachable"


def test_the_requests_own_prefill_counts_towards_its_first_token() -> None:
    sched = Scheduler([CHAT, LATE_RAG])
    fill(sched, 4)  # at 2/s: 2 s in the queue, then 0.9 s of prefill: 2.9 s, within 3 s
    assert sched.enqueue(req("a4", "rag", "a"), 0.0, drain_rate=2.0, service_s=0.9) is None
    got = sched.enqueue(req("a5", "rag", "a"), 0.0, drain_rate=2.0, service_s=1.5)
    assert got is not None and got.retry_after_s == pytest.approx(1.0)  # 2.5 + 1.5 - 3


# ------------------------------------- a standing line (ClassPolicy.shed_after_wait_s)

STANDING_RAG = with_(RAG, shed_late=True, shed_after_wait_s=9.0)  # ttft_s 3.0


def test_a_short_line_is_not_shed_for_a_prediction_alone() -> None:
    """A burst the box will catch up with: the prediction says late, but nobody in the
    queue has waited 9 s yet, so the request is queued (shed_late alone would refuse it)."""
    sched = Scheduler([CHAT, STANDING_RAG])
    fill(sched, 10)  # arrivals 0..9 s
    assert sched.enqueue(req("a10", "rag", "a", arrival=8.5), 8.5, drain_rate=1.0) is None
    plain = Scheduler([CHAT, LATE_RAG])
    fill(plain, 10)
    got = plain.enqueue(req("a10", "rag", "a", arrival=8.5), 8.5, drain_rate=1.0)
    assert got is not None and got.reason == "target_unreachable"


def test_once_the_oldest_has_waited_long_enough_late_requests_are_shed() -> None:
    sched = Scheduler([CHAT, STANDING_RAG])
    fill(sched, 10)  # the oldest arrived at 0 s
    got = sched.enqueue(req("a10", "rag", "a", arrival=9.0), 9.0, drain_rate=1.0)
    assert got == Rejection("target_unreachable", "rag", 10, 100, 7.0, ahead=10)
    assert sched.queued_count == 10


def test_a_line_that_stood_sheds_until_nothing_was_shed_for_as_long() -> None:
    """Shedding goes on after the oldest request left, and after the queue emptied (the
    shedding itself keeps the line short while the flood goes on); it stops once 9 s
    passed with no request shed. Then a new line must stand again first."""
    sched = Scheduler([CHAT, STANDING_RAG])
    fill(sched, 10)
    assert sched.enqueue(req("x", "rag", "a", arrival=9.0), 9.0, drain_rate=1.0) is not None
    for i in range(5):
        sched.cancel(f"a{i}", 9.0)  # served: the oldest left arrived at 5 s
    got = sched.enqueue(req("y", "rag", "a", arrival=10.0), 10.0, drain_rate=1.0)
    assert got is not None and got.reason == "target_unreachable"  # 5 ahead, 5 s: late
    # a request the line lets through (within its target) is queued while it stands
    assert sched.enqueue(req("z", "rag", "a", arrival=10.0), 10.0, drain_rate=3.0) is None
    for i in range(5, 10):
        sched.cancel(f"a{i}", 10.0)
    sched.cancel("z", 10.0)  # the queue is empty; 5 sent to the worker are unanswered
    got = sched.enqueue(req("v", "rag", "a", arrival=18.5), 18.5, drain_rate=1.0, unanswered=5)
    assert got is not None  # 8.5 s after the last shed: still standing, and shed again
    quiet = 18.5 + 9.0  # no request shed since: the line no longer stands
    assert (
        sched.enqueue(req("u", "rag", "a", arrival=quiet), quiet, drain_rate=1.0, unanswered=5)
        is None
    )
    sched.cancel("u", quiet)
    for i in range(9):  # a new burst, seen as it comes: queued until its oldest waited 9 s
        t = 30.0 + i
        assert sched.enqueue(req(f"b{i}", "rag", "b", arrival=t), t, drain_rate=1.0) is None
    assert sched.enqueue(req("w", "rag", "b", arrival=39.0), 39.0, drain_rate=1.0) is not None


TOLD_RAG = with_(STANDING_RAG, shed_queued=True)


def test_a_standing_line_tells_the_backlog_that_would_wait_as_long_again() -> None:
    """A flood queued 20 requests before its line stood (arrivals 0..19 s; the rule waits
    9 s). Once the oldest has waited 9 s, at 1 request a second with 2 sent to the worker
    and unanswered, the 8 oldest (2 to 9 ahead of them) would reach a worker within 9 s and
    keep their place; the 12 newer ones are told now, newest first, each with the wait
    until it could meet its 3 s target (the 21 ahead of the newest: 18 s)."""
    sched = Scheduler([CHAT, TOLD_RAG])
    fill(sched, 20)
    fill(sched, 3, tenant="c", cls="chat")  # interactive: never told so

    def rate(cls: str) -> float:
        return 1.0

    assert sched.trim(8.9, rate, {"rag": 2}) == []  # the oldest waited 8.9 s: not yet
    got = sched.trim(9.0, rate, {"rag": 2})
    assert [r.id for r, _ in got] == [f"a{i}" for i in range(19, 7, -1)]
    assert got[0][1] == Rejection("target_unreachable", "rag", 8, 80, 18.0, ahead=21)
    assert got[-1][1].retry_after_s == pytest.approx(7.0) and got[-1][1].ahead == 10
    assert sched.queued_count == 8 + 3 and all(sched.is_queued(f"a{i}") for i in range(8))
    assert sched.trim(9.5, rate, {"rag": 2}) == []  # what is left is within its wait
    # the line stands on: a new arrival that would be late is refused at the door
    got_new = sched.enqueue(req("n", "rag", "a", arrival=9.5), 9.5, drain_rate=1.0)
    assert got_new is not None and got_new.reason == "target_unreachable"


@pytest.mark.parametrize(
    ("policy", "rate"),
    [
        (STANDING_RAG, 1.0),  # off, as shipped
        (with_(LATE_RAG, shed_queued=True), 1.0),  # no standing rule: refused at the door
        (TOLD_RAG, 0.0),  # no drain rate measured yet: nothing to judge a wait by
    ],
)
def test_a_backlog_is_kept_without_a_standing_rule_or_a_drain_rate(
    policy: Any, rate: float
) -> None:
    sched = Scheduler([CHAT, policy])
    fill(sched, 20)
    assert sched.trim(30.0, lambda cls: rate, {}) == []
    assert sched.queued_count == 20


def test_how_many_of_a_standing_line_keep_their_place() -> None:
    assert line_keeps(TOLD_RAG, 1.0, 2) == 8  # ahead 2..9: within 9 s at 1/s
    assert line_keeps(TOLD_RAG, 2.5, 0) == 23  # floor(22.5) + the head itself
    assert line_keeps(TOLD_RAG, 0.05, 5) == 1  # the head always stays
    assert line_keeps(TOLD_RAG, 0.0, 0) is None
    assert line_keeps(STANDING_RAG, 1.0, 0) is None  # shed_queued off
    assert line_keeps(with_(TOLD_RAG, interactive=True), 1.0, 0) is None
    assert line_keeps(with_(TOLD_RAG, ttft_s=None), 1.0, 0) is None


def test_the_standing_rule_on_plain_values() -> None:
    assert StandingLine(None).stands(None, 0.0)  # no rule: it always stands
    line = StandingLine(9.0)
    assert not line.stands(8.9, 10.0)
    line.saw(8.9, shed=False, now=10.0)  # neither shed nor long enough: not stood
    assert not line.stands(None, 18.0)
    assert line.stands(9.0, 20.0)
    line.saw(9.0, shed=False, now=20.0)  # stood by its oldest's wait
    assert line.stands(None, 28.9) and not line.stands(None, 29.0)
    line.saw(None, shed=True, now=28.0)  # a request shed keeps it standing
    assert line.stands(None, 36.9) and not line.stands(1.0, 37.0)


def test_a_reload_applies_a_new_standing_rule_to_the_queue_as_it_is() -> None:
    sched = Scheduler([CHAT, LATE_RAG])
    fill(sched, 10)  # arrivals 0..9 s
    sched.reconfigure([CHAT, STANDING_RAG])
    assert sched.enqueue(req("a10", "rag", "a", arrival=8.5), 8.5, drain_rate=1.0) is None
    got = sched.enqueue(req("a11", "rag", "a", arrival=9.0), 9.0, drain_rate=1.0)
    assert got is not None and got.reason == "target_unreachable"
    sched.reconfigure([CHAT, LATE_RAG])  # and back: plain shed_late, no line to wait for
    got = sched.enqueue(req("a12", "rag", "a", arrival=9.0), 9.0, drain_rate=1.0)
    assert got is not None and got.reason == "target_unreachable"


def test_a_class_added_by_a_reload_sheds_under_its_own_rule() -> None:
    sched = Scheduler([CHAT])
    sched.reconfigure([CHAT, STANDING_RAG])
    fill(sched, 10)
    assert sched.enqueue(req("a10", "rag", "a", arrival=8.5), 8.5, drain_rate=1.0) is None
    got = sched.enqueue(req("a11", "rag", "a", arrival=9.0), 9.0, drain_rate=1.0)
    assert got is not None and got.reason == "target_unreachable"
