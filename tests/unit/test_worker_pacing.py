"""WorkerPacing: the per-worker pacing state the admission controller feeds, on plain values."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hearthgate.gateway.worker_pacing import FloodLimits, WorkerPacing
from hearthgate.policies.estimators import PrefillRates
from hearthgate.policies.pacing import PacingRule
from hearthgate.policies.types import WorkerSnapshot

DECODE_ONLY = PacingRule(target_gap_s=0.015, interval_s=0.5, max_cap=8)
WITH_PREFILL = PacingRule(target_gap_s=0.015, interval_s=0.5, max_cap=8, prefill_gap_s=0.025)


def slow_gaps(p: WorkerPacing, t: float, n: int = 5) -> float:
    """``n`` interactive 40 ms gaps on w0 from ``t``; returns the time after them."""
    for _ in range(n):
        t += 0.04
        p.observe_gap("w0", t, 0.04, 1, interactive=True)
    return t


def test_decode_pacing_alone_counts_no_prefills() -> None:
    """With prefill pacing off admissions are not counted as prefills, and
    a slow gap while a prompt was just admitted still cuts the decode cap."""
    p = WorkerPacing(DECODE_ONLY, None, PrefillRates())
    assert not p.tracks_prefill
    assert p.prefill_started("w0") is False
    t = slow_gaps(p, 100.0)
    p.update(t + 0.5, {})
    state = p.state()["w0"]
    assert state.prefill_duty is None and state.prefill_rate is None
    assert state.token_gap_s == pytest.approx(0.04)
    assert state.background_cap < 8


def test_prefill_pacing_counts_prompts_in_prefill() -> None:
    """With prefill pacing on, a gap while a counted prompt is in prefill (or that overlapped
    its end) is a stall: it cuts the duty, not the decode cap; once it ended well before the
    gap, the gap is a decode step again."""
    p = WorkerPacing(WITH_PREFILL, None, PrefillRates())
    assert p.prefill_started("w0") is True
    t = slow_gaps(p, 100.0)
    p.prefill_ended("w0", t - 0.02)  # ended inside the last gap: that gap was a stall too
    p.update(t + 0.5, {})
    state = p.state()["w0"]
    assert state.background_cap == 8
    assert state.token_gap_s is None
    assert state.prefill_duty == pytest.approx(0.7)
    assert state.prefill_rate == PrefillRates().initial  # the speed the duty is a share of
    t = slow_gaps(p, t + 0.6)  # nothing in prefill now
    p.update(t + 0.5, {})
    assert p.state()["w0"].token_gap_s == pytest.approx(0.04)


def test_charges_close_the_duty_only_for_paced_workers() -> None:
    """Once stalls cut w0's duty, a background prompt charged to it closes w0 to
    background until paid; w1, never paced, stays open and unchanged."""
    p = WorkerPacing(WITH_PREFILL, None, PrefillRates())
    snaps = [WorkerSnapshot("w0"), WorkerSnapshot("w1")]
    assert not p.active
    assert p.apply(snaps, 100.0) == snaps  # no pacer yet: snapshots unchanged
    p.prefill_started("w0")
    t = slow_gaps(p, 100.0)  # stalls: the duty falls to 0.7 at the interval
    p.update(t + 0.5, {})
    t += 0.5
    p.charge("w1", t, 2000)  # w1 has no pacer: nothing owed
    p.charge("w0", t, 2000)
    w0, w1 = p.apply(snaps, t)
    assert (w0.prefill_open, w1.prefill_open) == (False, True)
    assert w0.background_cap == 8 and w1 == snaps[1]
    seconds = 2000 / (0.7 * PrefillRates().rate("w0"))  # paid at the duty's share
    assert not p.apply(snaps, t + 0.9 * seconds)[0].prefill_open
    assert p.apply(snaps, t + 1.01 * seconds)[0].prefill_open


def test_says_when_the_first_closed_worker_opens() -> None:
    p = WorkerPacing(WITH_PREFILL, None, PrefillRates())
    assert p.prefill_opens_in(100.0) is None  # no pacer
    p.prefill_started("w0")
    t = slow_gaps(p, 100.0)
    p.update(t + 0.5, {})  # duty 0.7
    t += 0.5
    assert p.prefill_opens_in(t) is None  # nothing owed
    p.charge("w0", t, 2001)
    seconds = 2000 / (0.7 * PrefillRates().rate("w0"))
    assert p.prefill_opens_in(t) == pytest.approx(seconds)
    assert p.prefill_opens_in(t + 1.001 * seconds) is None


def test_a_new_rule_restarts_the_pacers_and_stale_ends_are_harmless() -> None:
    """A reload that turns prefill pacing on restarts the pacers; a prompt counted before a
    reload that ends afterwards cannot drive a count below zero."""
    p = WorkerPacing(WITH_PREFILL, None, PrefillRates())
    p.prefill_started("w0")
    slow_gaps(p, 100.0)
    assert p.active
    p.reconfigure(WITH_PREFILL, None)  # same settings: kept
    assert p.active
    p.reconfigure(DECODE_ONLY, 2)
    assert not p.active and p.app_floor == 2
    p.prefill_ended("w0", 101.0)
    p.prefill_ended("w0", 101.0)  # more ends than starts
    p.reconfigure(WITH_PREFILL, 2)
    assert p.prefill_started("w0")
    p.prefill_ended("w0", 102.0)
    t = slow_gaps(p, 103.0)  # long after that end: decode steps
    p.update(t + 0.5, {})
    assert p.state()["w0"].token_gap_s == pytest.approx(0.04)


class Recorder:
    """Stands in for WorkerPacer: records what each observed gap was flagged as."""

    def __init__(self, *args: object) -> None:
        self.seen: list[tuple[bool, bool]] = []

    def observe(
        self, seconds: float, tokens: int, prefill: bool, interactive: bool, bg: bool = False
    ) -> None:
        self.seen.append((prefill, bg))


def test_background_prefills_are_told_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gap is flagged as overlapping a prefill, and a background one, from the prompts
    counted in prefill and from when the last of each ended."""
    monkeypatch.setattr("hearthgate.gateway.worker_pacing.WorkerPacer", Recorder)
    p = WorkerPacing(WITH_PREFILL, 4, PrefillRates())
    p.prefill_started("w0", background=True)
    p.observe_gap("w0", 100.0, 0.04, 1, interactive=True)  # RAG prompt in prefill
    p.prefill_ended("w0", 100.01, background=True)
    p.prefill_started("w0", background=False)
    p.observe_gap("w0", 100.03, 0.04, 1, interactive=True)  # overlaps the RAG prompt's end
    p.observe_gap("w0", 100.1, 0.04, 1, interactive=True)  # only the chat prompt
    p.prefill_ended("w0", 100.11, background=False)
    p.observe_gap("w0", 100.2, 0.04, 1, interactive=True)  # nothing in prefill
    recorder = p._pacers["w0"]
    assert isinstance(recorder, Recorder)
    assert recorder.seen == [(True, True), (True, True), (True, False), (False, False)]


def test_snapshots_carry_the_flood_limit_only_with_per_app_pacing() -> None:
    """Every worker's snapshot carries the flood limit, before its first token too (a cold
    start's burst), and only with per-app pacing; flood_at is the app cap's own floor."""
    rule = PacingRule(target_gap_s=0.015, interval_s=0.5, max_cap=8, flood_prefill=1)
    snaps = [WorkerSnapshot("w0"), WorkerSnapshot("w1")]
    for floor, expected in ((4, (4, 1)), (12, (8, 1)), (None, (None, None))):
        p = WorkerPacing(rule, floor, PrefillRates())
        slow_gaps(p, 100.0)  # w0 is paced from here, w1 never
        for w in p.apply(snaps, 101.0):
            assert (w.flood_at, w.flood_prefill) == expected
    p = WorkerPacing(DECODE_ONLY, 4, PrefillRates())
    assert p.flood is None
    slow_gaps(p, 100.0)
    assert p.apply(snaps, 101.0)[0].flood_prefill is None  # no limit set


def test_snapshots_carry_the_background_prefill_limit_on_general_workers_only() -> None:
    """The limit protects interactive prompts where they run beside background ones: every
    general worker's snapshot carries it, paced yet or not; a long-prefill or embeddings
    worker's does not (background prompts are what it is there for)."""
    rule = PacingRule(target_gap_s=0.015, interval_s=0.5, max_cap=8, background_prefill=1)
    snaps = [
        WorkerSnapshot("w0"),
        WorkerSnapshot("w1"),
        WorkerSnapshot("long", role="long_prefill"),
        WorkerSnapshot("e0", role="embeddings"),
    ]
    p = WorkerPacing(rule, 4, PrefillRates())
    slow_gaps(p, 100.0)  # w0 is paced from here, w1 never
    limits = {w.name: w.background_prefill for w in p.apply(snaps, 101.0)}
    assert limits == {"w0": 1, "w1": 1, "long": None, "e0": None}
    p.reconfigure(replace(rule, background_prefill=None), 4)
    assert p.state() != {}  # the limit alone is not the pacers' rule
    assert [w.background_prefill for w in p.apply(snaps, 101.0)] == [None] * 4


def test_a_new_flood_limit_alone_keeps_the_pacers() -> None:
    rule = PacingRule(target_gap_s=0.015, interval_s=0.5, max_cap=8, flood_prefill=1)
    p = WorkerPacing(rule, 4, PrefillRates())
    t = slow_gaps(p, 100.0)
    p.update(t + 0.5, {})
    cut = p.state()["w0"].background_cap
    assert cut < 8
    p.reconfigure(replace(rule, flood_prefill=2), 4)
    assert p.state()["w0"].background_cap == cut and p.flood == FloodLimits(4, 2, False, False)
    p.reconfigure(replace(rule, flood_prefill=None, flood_yields=True), 4)
    assert p.state()["w0"].background_cap == cut and p.flood == FloodLimits(4, None, True, False)
    p.reconfigure(replace(rule, flood_yields=True, flood_until_first_token=True), 4)
    assert p.state()["w0"].background_cap == cut and p.flood == FloodLimits(4, 1, True, True)
    snap = p.apply([WorkerSnapshot("w0")], t + 0.6)[0]
    assert (snap.flood_at, snap.flood_prefill) == (4, 1)
    assert snap.flood_yields and snap.flood_until_first_token
    p.reconfigure(replace(rule, max_cap=16), 4)  # a pacing change restarts them
    assert p.state() == {}


def test_cut_counts_survive_a_reload_that_restarts_the_pacers() -> None:
    """A new rule restarts every pacer; the cuts counted so far are kept, so the exported
    counter never goes back."""
    p = WorkerPacing(DECODE_ONLY, None, PrefillRates())
    t = slow_gaps(p, 100.0)
    p.update(t + 0.5, {})
    before = p.state()["w0"].cuts
    assert before.background_gap == 1
    p.reconfigure(replace(DECODE_ONLY, target_gap_s=0.02), None)
    assert p.state() == {}  # restarted: no pacer until the worker's next token
    t = slow_gaps(p, t + 1.0)
    p.update(t + 0.5, {})
    state = p.state()["w0"]
    assert state.background_cap < 8  # the new pacer cut once, from its max cap
    assert state.cuts.background_gap == 2  # its cut plus the one before the reload
    p.reconfigure(replace(DECODE_ONLY, target_gap_s=0.02, flood_prefill=1), None)
    assert p.state()["w0"].cuts.background_gap == 2  # a limit alone restarts nothing
