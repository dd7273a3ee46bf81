"""Prefill pacing: the background prefill duty of a worker, on plain values; how the
worker's pacer splits the gaps it is fed; the budget verdict the duty drives."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hearthgate.policies import Scheduler
from hearthgate.policies.budgets import Verdict, WorkerLoad, check
from hearthgate.policies.pacing import PacingRule, WorkerPacer
from hearthgate.policies.prefill_pacing import PrefillPacer, background_behind
from tests.unit.test_policies_support import CLASSES, req, worker


def slow(p: PrefillPacer | WorkerPacer, gap_s: float, n: int = 10, **kw: bool) -> None:
    for _ in range(n):
        p.observe(gap_s, 1, **kw)


def test_duty_starts_full_and_the_worker_is_always_open() -> None:
    p = PrefillPacer(target_gap_s=0.025, interval_s=0.5, now=0.0)
    assert p.duty == 1.0
    p.charge(0.0, 100_000, rate=1000.0)  # no debt at full duty
    assert p.open(0.0, rate=1000.0)


def test_slow_interactive_gaps_cut_the_duty_to_its_floor_once_per_interval() -> None:
    p = PrefillPacer(target_gap_s=0.025, interval_s=0.5, now=0.0)
    slow(p, 0.2)
    assert p.update(0.3, rate=1000.0) == 1.0  # interval not over
    assert p.update(0.5, rate=1000.0) == pytest.approx(0.7)
    for t in range(2, 12):
        slow(p, 0.2)
        p.update(t * 0.5, rate=1000.0)
    assert p.duty == pytest.approx(0.1)  # never below the floor


def test_fast_gaps_or_no_interactive_stream_give_the_duty_back_step_by_step() -> None:
    p = PrefillPacer(target_gap_s=0.025, interval_s=0.5, now=0.0)
    slow(p, 0.2)
    p.update(0.5, rate=1000.0)
    slow(p, 0.2)
    p.update(1.0, rate=1000.0)
    assert p.duty == pytest.approx(0.49)
    slow(p, 0.023)  # under the target but not well under (0.85 x 25 ms): stays
    assert p.update(1.5, rate=1000.0) == pytest.approx(0.49)
    slow(p, 0.010)
    assert p.update(2.0, rate=1000.0) == pytest.approx(0.59)
    assert p.update(2.5, rate=1000.0) == pytest.approx(0.69)  # nothing interactive streamed
    for t in range(6, 12):
        p.update(t * 0.5, rate=1000.0)
    assert p.duty == 1.0


def test_background_prompts_run_up_a_debt_paid_at_duty_times_the_prefill_rate() -> None:
    p = PrefillPacer(target_gap_s=0.025, interval_s=0.5, now=0.0)
    slow(p, 0.2)
    p.update(0.5, rate=1000.0)  # duty 0.7
    assert p.open(0.5, rate=1000.0)
    p.charge(0.5, 1400, rate=1000.0)
    p.charge(0.5, 700, rate=1000.0)  # both admitted at once: the debt adds up
    assert not p.open(1.5, rate=1000.0)  # 2100 - 700 paid
    assert not p.open(3.4, rate=1000.0)
    assert p.open(3.5, rate=1000.0)  # 2100 tokens at 700 tok/s: 3 s after the charge


def test_the_pacer_says_when_its_debt_will_be_paid() -> None:
    p = PrefillPacer(target_gap_s=0.025, interval_s=0.5, now=0.0)
    p.charge(0.0, 1000, rate=1000.0)
    assert p.paid_in(0.0, rate=1000.0) == 0.0  # full duty: never closed
    slow(p, 0.2)
    p.update(0.5, rate=1000.0)  # duty 0.7
    p.charge(0.5, 1401, rate=1000.0)
    assert p.paid_in(0.5, rate=1000.0) == pytest.approx(2.0)  # 1400 tokens at 700 tok/s
    assert p.paid_in(1.5, rate=1000.0) == pytest.approx(1.0)
    assert p.paid_in(2.5, rate=1000.0) == 0.0


def test_with_prefill_pacing_prefill_stalls_move_the_duty_not_the_decode_cap() -> None:
    rule = PacingRule(target_gap_s=0.015, interval_s=0.5, max_cap=16, prefill_gap_s=0.025)
    p = WorkerPacer(rule, 0.0)
    slow(p, 0.2, prefill=True, interactive=True)  # a chat stream stalled by a long prefill
    slow(p, 0.2, prefill=True, interactive=False)  # the RAG streams see the same stall
    p.update(0.5, background_in_flight=12, heaviest_app=2, rate=1000.0)
    assert p.cap == 16  # the decode batch did not cause it
    assert p.duty == pytest.approx(0.7)
    assert p.last_gap_s is None  # no decode-only gap yet
    slow(p, 0.03, prefill=False, interactive=False)  # a slow decode step, no prefill
    p.update(1.0, background_in_flight=12, heaviest_app=2, rate=1000.0)
    assert p.cap == 8  # floor(12 x 0.7)
    assert p.last_gap_s == pytest.approx(0.03)
    assert p.duty == pytest.approx(0.8)  # no interactive stream in that interval
    assert p.state().prefill_duty == pytest.approx(0.8)


def test_without_prefill_pacing_every_gap_moves_the_decode_cap_as_before() -> None:
    rule = PacingRule(target_gap_s=0.015, interval_s=0.5, max_cap=16)
    p = WorkerPacer(rule, 0.0)
    slow(p, 0.2, prefill=True, interactive=True)
    p.update(0.5, background_in_flight=12, heaviest_app=2, rate=1000.0)
    assert p.cap == 8
    assert p.duty is None and p.state().prefill_duty is None
    assert p.prefill_open(0.5, 1000.0)


def test_rule_rejects_a_non_positive_prefill_gap() -> None:
    with pytest.raises(ValueError):
        PacingRule(target_gap_s=0.015, prefill_gap_s=0.0)


def test_a_closed_prefill_duty_holds_background_only() -> None:
    load = WorkerLoad("w0")
    w = replace(worker(), prefill_open=False)
    assert check(w, load.usage(), "rag", False, 1800) is Verdict.PACED
    assert check(w, load.usage(), "chat", True, 40) is Verdict.FITS
    sched = Scheduler(CLASSES)
    sched.enqueue(req("r0", "rag", arrival=0), 0.0)
    sched.enqueue(req("c0", "chat", arrival=1), 0.0)
    assert [a.request.id for a in sched.admit(1.0, [w])] == ["c0"]
    assert [a.request.id for a in sched.admit(1.0, [worker()])] == ["r0"]


def test_a_late_interactive_first_token_cuts_the_duty_even_with_fast_gaps() -> None:
    p = PrefillPacer(target_gap_s=0.025, interval_s=0.5, now=0.0)
    p.observe_start(0.24, ttft_s=0.5)  # under half the target: on time
    slow(p, 0.010)
    assert p.update(0.5, rate=1000.0) == 1.0
    p.observe_start(0.26, ttft_s=0.5)  # over half: background prompts queued ahead of it
    slow(p, 0.010)
    assert p.update(1.0, rate=1000.0) == pytest.approx(0.7)
    slow(p, 0.010)
    assert p.update(1.5, rate=1000.0) == pytest.approx(0.8)  # one late start, one cut
    assert (p.cuts_late, p.cuts_gap) == (1, 0)
    slow(p, 0.2)
    p.update(2.0, rate=1000.0)
    assert (p.cuts_late, p.cuts_gap) == (1, 1)  # the gap's cut is told apart


def test_a_late_interactive_first_token_cuts_the_decode_cap_too() -> None:
    """While prompts are in prefill all the time no gap is decode-only; a late first token
    still cuts the decode cap (and the duty), once per interval."""
    rule = PacingRule(target_gap_s=0.015, interval_s=0.5, max_cap=16, prefill_gap_s=0.025)
    p = WorkerPacer(rule, 0.0)
    slow(p, 0.01, prefill=True, interactive=True)  # fast, but every gap overlapped a prefill
    p.observe_start(0.4, ttft_s=0.5)
    p.update(0.5, background_in_flight=12, heaviest_app=1, rate=1000.0)
    assert (p.cap, p.duty) == (8, pytest.approx(0.7))  # floor(12 x 0.7); no decode gap seen
    assert p.last_gap_s is None
    p.update(1.0, background_in_flight=8, heaviest_app=1, rate=1000.0)
    assert p.cap == 8  # nothing late in this interval
    cuts = p.state().cuts
    assert (cuts.background_late, cuts.background_gap) == (1, 0)
    assert (cuts.duty_late, cuts.duty_gap) == (1, 0)


def test_when_blind_a_late_first_token_leaves_a_decode_cap_its_gaps_judge() -> None:
    """late_cut_when_blind: with decode-only gaps seen in the interval (and under target) a
    late first token cuts the duty but not the decode cap; with none seen it cuts both."""
    rule = PacingRule(
        target_gap_s=0.015,
        interval_s=0.5,
        max_cap=16,
        prefill_gap_s=0.025,
        late_cut_when_blind=True,
    )
    p = WorkerPacer(rule, 0.0)
    slow(p, 0.01, interactive=True)  # decode-only gaps, fast
    p.observe_start(0.4, ttft_s=0.5)
    p.update(0.5, background_in_flight=12, heaviest_app=1, rate=1000.0)
    assert (p.cap, p.duty) == (16, pytest.approx(0.7))  # the duty answers the late start
    assert (p.state().cuts.background_late, p.state().cuts.duty_late) == (0, 1)
    slow(p, 0.01, prefill=True, interactive=True)  # every gap overlapped a prefill: blind
    p.observe_start(0.4, ttft_s=0.5)
    p.update(1.0, background_in_flight=12, heaviest_app=1, rate=1000.0)
    assert p.cap == 8  # floor(12 x 0.7), as without the setting
    assert p.state().cuts.background_late == 1


def test_apps_are_cut_only_once_background_prefill_gave_way_too() -> None:
    """With prefill pacing, slow gaps cut an app only once background is at its floor in
    sequences and in prefill duty: a burst's first prefills slow every step while few
    background sequences run, and the chat app must not pay for them."""
    rule = PacingRule(target_gap_s=0.015, interval_s=0.5, max_cap=16, prefill_gap_s=0.025)
    p = WorkerPacer(rule, 0.0, app_min_cap=4)
    t = 0.0
    while p.duty is not None and p.duty > 0.1:
        t += 0.5
        slow(p, 0.2, prefill=True, interactive=True)
        p.update(t, background_in_flight=1, heaviest_app=12, rate=1000.0)
        if p.duty > 0.1:
            assert p.app_cap == 16  # the duty is still giving way
    assert t == 3.5  # 1 -> 0.1 in seven cuts of 0.7
    slow(p, 0.2, prefill=True, interactive=True)
    p.update(t + 0.5, background_in_flight=1, heaviest_app=12, rate=1000.0)
    assert p.app_cap == 10  # floor(12 x 0.85): now apps give way


def test_background_prefill_stalls_never_cut_an_app_but_its_own_prefills_do() -> None:
    """With prefill pacing, gaps a background prompt's prefill overlapped are the duty's to
    answer: even with the duty at its floor they leave the per-app cap alone (a RAG burst
    must not queue the chat app in the gateway). Gaps that only interactive prompts'
    prefills overlapped (a flooding app's own) still cut it."""
    rule = PacingRule(target_gap_s=0.015, interval_s=0.5, max_cap=16, prefill_gap_s=0.025)
    p = WorkerPacer(rule, 0.0, app_min_cap=4)
    t = 0.0
    for _ in range(10):  # the duty falls to its floor; the app cap never moves
        t += 0.5
        slow(p, 0.2, prefill=True, interactive=True, background_prefill=True)
        p.update(t, background_in_flight=1, heaviest_app=12, rate=1000.0)
        assert p.app_cap == 16
    assert p.duty == pytest.approx(0.1)
    slow(p, 0.2, prefill=True, interactive=True)  # the flooding app's own prompts
    p.update(t + 0.5, background_in_flight=1, heaviest_app=12, rate=1000.0)
    assert p.app_cap == 10


def test_without_prefill_pacing_every_gap_moves_the_app_cap() -> None:
    rule = PacingRule(target_gap_s=0.015, interval_s=0.5, max_cap=16)
    p = WorkerPacer(rule, 0.0, app_min_cap=4)
    slow(p, 0.2, prefill=True, interactive=True, background_prefill=True)
    p.update(0.5, background_in_flight=1, heaviest_app=12, rate=1000.0)
    assert p.app_cap == 10


def test_with_no_background_on_the_worker_a_flooding_app_is_cut_at_once() -> None:
    """With prefill pacing and no background work on the worker, nothing else can give
    way: gaps between the app cap's target and the duty's looser one (here 20 ms: the duty
    even grows) cut the flooding app without waiting for the duty to reach its floor."""
    rule = PacingRule(target_gap_s=0.015, interval_s=0.5, max_cap=16, prefill_gap_s=0.025)
    p = WorkerPacer(rule, 0.0, app_min_cap=4)
    slow(p, 0.02, prefill=True, interactive=True)
    p.update(0.5, background_in_flight=0, heaviest_app=12, rate=1000.0)
    assert p.duty == pytest.approx(1.0)
    assert p.app_cap == 10  # floor(12 x 0.85)
    # One background sequence running: background must give way (duty at its floor) first.
    q = WorkerPacer(rule, 0.0, app_min_cap=4)
    slow(q, 0.02, prefill=True, interactive=True)
    q.update(0.5, background_in_flight=1, heaviest_app=12, rate=1000.0)
    assert q.app_cap == 16


def test_while_background_is_behind_the_duty_holds_the_looser_gap() -> None:
    p = PrefillPacer(target_gap_s=0.025, interval_s=0.5, now=0.0, behind_gap_s=0.04)
    slow(p, 0.2)
    p.update(0.5, rate=1000.0)  # duty 0.7
    slow(p, 0.03)  # over the usual 25 ms, well under 0.85 x 40 ms
    assert p.update(1.0, rate=1000.0, behind=True) == pytest.approx(0.8)
    slow(p, 0.03)
    assert p.update(1.5, rate=1000.0) == pytest.approx(0.56)  # nothing waits: 25 ms holds
    slow(p, 0.045)  # over even the looser gap
    assert p.update(2.0, rate=1000.0, behind=True) == pytest.approx(0.392)
    # A first token at 0.6 of its target is late only while nothing waits (0.5); while
    # background is behind the bar is 0.75 of it.
    p.observe_start(0.3, ttft_s=0.5)
    slow(p, 0.01)
    assert p.late() and not p.late(behind=True)
    assert p.update(2.5, rate=1000.0, behind=True) == pytest.approx(0.492)
    p.observe_start(0.4, ttft_s=0.5)
    slow(p, 0.01)
    assert p.update(3.0, rate=1000.0, behind=True) == pytest.approx(0.3444)


def test_without_a_behind_gap_waiting_background_changes_nothing() -> None:
    p = PrefillPacer(target_gap_s=0.025, interval_s=0.5, now=0.0)
    slow(p, 0.2)
    p.update(0.5, rate=1000.0)
    slow(p, 0.03)
    assert p.update(1.0, rate=1000.0, behind=True) == pytest.approx(0.49)
    p.observe_start(0.3, ttft_s=0.5)
    assert p.late(behind=True)


def test_background_is_behind_once_a_queue_head_waited_half_its_target() -> None:
    targets = {"rag": 3.0, "embed": 2.0}  # background classes and their ttft_s
    assert not background_behind({"rag": 10.0, "embed": None, "chat": 0.0}, targets, 11.5)
    assert background_behind({"rag": 10.0}, targets, 11.6)
    assert background_behind({"rag": None, "embed": 10.0}, targets, 11.01)
    assert not background_behind({"chat": 0.0}, targets, 100.0)  # only the classes given


def test_the_behind_gap_needs_prefill_pacing_and_is_never_the_tighter() -> None:
    with pytest.raises(ValueError, match="behind_gap_s"):
        PacingRule(0.015, behind_gap_s=0.04)
    with pytest.raises(ValueError, match="behind_gap_s"):
        PacingRule(0.015, prefill_gap_s=0.025, behind_gap_s=0.02)
    rule = PacingRule(0.015, prefill_gap_s=0.025, behind_gap_s=0.04, interval_s=0.5)
    w = WorkerPacer(rule, now=0.0)
    slow(w, 0.03, interactive=True, prefill=True)
    w.update(0.5, background_in_flight=1, heaviest_app=1, rate=1000.0, behind=True)
    assert w.duty == 1.0  # 30 ms: within the looser gap
    slow(w, 0.03, interactive=True, prefill=True)
    w.update(1.0, background_in_flight=1, heaviest_app=1, rate=1000.0)
    assert w.duty == pytest.approx(0.7)
