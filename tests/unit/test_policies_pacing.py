"""Decode pacing: the AIMD cap on a worker's background sequences, on plain values, and the
budget verdict it drives."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hearthgate.policies import ClassPolicy, Scheduler
from hearthgate.policies.budgets import Verdict, WorkerLoad, check, flooding_apps
from hearthgate.policies.pacing import LIGHT_WINDOW_S, DecodePacer, PacingRule, WorkerPacer
from tests.unit.test_policies_support import CLASSES, classes, req, worker

RULE = PacingRule(target_gap_s=0.020, interval_s=0.5, decrease=0.5, max_cap=16)


def feed(p: DecodePacer, gap_s: float, tokens: int = 10) -> None:
    for _ in range(tokens):
        p.observe(gap_s, 1)


def test_starts_at_the_ceiling_and_stays_without_tokens() -> None:
    p = DecodePacer(RULE, now=0.0)
    assert p.cap == 16
    assert p.update(1.0, background_in_flight=16) == 16
    assert p.last_gap_s is None


def test_moves_once_per_interval_on_the_mean_gap() -> None:
    p = DecodePacer(RULE, now=0.0)
    feed(p, 0.030)
    assert p.update(0.4, 10) == 16  # interval not over: nothing moves, samples kept
    feed(p, 0.008)
    assert p.update(0.5, 10) == 16  # mean of 30 ms and 8 ms = 19 ms: not above target
    assert p.last_gap_s == pytest.approx(0.019)


def test_a_slow_interval_cuts_to_a_fraction_of_what_runs() -> None:
    p = DecodePacer(RULE, now=0.0)
    feed(p, 0.040)
    assert p.update(0.5, background_in_flight=12) == 6  # floor(min(16, 12) * 0.5)


def test_no_second_cut_until_the_work_in_flight_came_down() -> None:
    p = DecodePacer(RULE, now=0.0)
    feed(p, 0.040)
    assert p.update(0.5, 12) == 6
    feed(p, 0.040)
    assert p.update(1.0, 9) == 6  # the 12 admitted before the cut are still finishing
    feed(p, 0.040)
    assert p.update(1.5, 6) == 3  # down to the cap and still slow: cut again


def test_grows_by_one_only_while_fast_and_the_cap_holds_work_back() -> None:
    p = DecodePacer(RULE, now=0.0)
    feed(p, 0.040)
    p.update(0.5, 8)  # cap 4
    feed(p, 0.010)
    assert p.update(1.0, 4) == 5
    feed(p, 0.010)
    assert p.update(1.5, 2) == 5  # the cap is not what limits: no growth
    feed(p, 0.018)
    assert p.update(2.0, 5) == 5  # under target but above headroom (0.85 x 20 ms): hold


def test_proportional_growth_climbs_by_the_room_the_gap_leaves() -> None:
    rule = replace(RULE, decrease=0.1, max_cap=64, proportional_growth=True)
    p = DecodePacer(rule, now=0.0)
    feed(p, 0.040)
    assert p.update(0.5, 10) == 1  # a deep cut: floor(10 x 0.1)
    # 4 ms against 0.85 x 20 = 17 ms: room 3.25, so the cap doubles each interval
    caps = []
    for i in range(1, 5):
        feed(p, 0.004)
        caps.append(p.update(0.5 + 0.5 * i, p.cap))
    assert caps == [2, 4, 8, 16]  # additive growth would be at 5
    feed(p, 0.015)  # room 17 / 15 - 1 = 0.13: floor(16 x 0.13) = 2
    assert p.update(3.0, 16) == 18
    feed(p, 0.0165)  # room 0.03: less than one sequence, still one
    assert p.update(3.5, 18) == 19
    feed(p, 0.0)  # no measurable gap: doubling, to the ceiling at most
    p.update(4.0, 19)
    assert p.cap == 38
    feed(p, 0.004)
    assert p.update(4.5, 20) == 38  # the cap is not what limits: no growth
    feed(p, 0.018)
    assert p.update(5.0, 38) == 38  # above headroom: hold, as additive growth does


def test_the_app_cap_keeps_additive_growth() -> None:
    rule = replace(RULE, proportional_growth=True)
    w = WorkerPacer(rule, now=0.0, app_min_cap=2)
    assert w._apps is not None and not w._apps.rule.proportional_growth
    assert w._background.rule.proportional_growth


def test_floor_and_ceiling() -> None:
    p = DecodePacer(RULE, now=0.0)
    t = 0.0
    for _ in range(20):
        t += 0.5
        feed(p, 1.0)
        p.update(t, p.cap)
    assert p.cap == RULE.min_cap
    for _ in range(40):
        t += 0.5
        feed(p, 0.001)
        p.update(t, p.cap)
    assert p.cap == RULE.max_cap


def test_bad_observations_are_ignored() -> None:
    p = DecodePacer(RULE, now=0.0)
    p.observe(float("nan"), 1)
    p.observe(-1.0, 1)
    p.observe(0.5, 0)
    assert p.update(1.0, 16) == 16
    assert p.last_gap_s is None


@pytest.mark.parametrize(
    "kw",
    [
        {"target_gap_s": 0.0},
        {"target_gap_s": float("inf")},
        {"target_gap_s": 0.02, "interval_s": 0.0},
        {"target_gap_s": 0.02, "decrease": 1.0},
        {"target_gap_s": 0.02, "headroom": 0.0},
        {"target_gap_s": 0.02, "min_cap": 0},
        {"target_gap_s": 0.02, "min_cap": 5, "max_cap": 4},
        {"target_gap_s": 0.02, "app_gap_s": 0.0},
        {"target_gap_s": 0.02, "app_gap_s": float("nan")},
    ],
)
def test_rule_validation(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        PacingRule(**kw)  # type: ignore[arg-type]


@given(
    base_ms=st.floats(1.0, 10.0),
    per_seq_ms=st.floats(0.5, 5.0),
    target_ms=st.floats(12.0, 40.0),
    finish=st.integers(1, 4),
)
def test_closed_loop_holds_the_target_without_collapsing(
    base_ms: float, per_seq_ms: float, target_ms: float, finish: int
) -> None:
    """A worker whose step time grows with its background batch (base + per sequence), an
    endless background backlog, and sequences that take ``finish`` intervals to leave: the
    cap settles where the gap is near the target, not at the floor."""
    rule = PacingRule(target_gap_s=target_ms / 1000, interval_s=0.5, max_cap=64)
    p = DecodePacer(rule, now=0.0)
    fits = max(0, int((target_ms - base_ms) / per_seq_ms))  # most sequences within target
    running: list[int] = []  # intervals left for each running background sequence
    gaps: list[float] = []
    caps: list[int] = []
    for step in range(1, 201):
        running = [r - 1 for r in running if r > 1]
        while len(running) < p.cap:  # admit up to the cap from the backlog
            running.append(finish)
        gap = (base_ms + per_seq_ms * len(running)) / 1000
        feed(p, gap)
        p.update(step * 0.5, len(running))
        if step > 100:
            gaps.append(gap)
            caps.append(p.cap)
    mean_gap_ms = 1000 * sum(gaps) / len(gaps)
    assert mean_gap_ms <= target_ms * 1.15 + per_seq_ms
    if fits >= 2:
        assert sum(caps) / len(caps) >= fits * 0.4  # AIMD's sawtooth, not the floor


def test_budget_verdict_counts_background_sequences_only() -> None:
    load = WorkerLoad("w0")
    load.add("chat", True, 10)
    load.add("rag", False, 10)
    load.add("rag", False, 10)
    w = replace(worker(), background_cap=2)
    assert check(w, load.usage(), "rag", False, 10) is Verdict.PACED
    assert check(w, load.usage(), "chat", True, 10) is Verdict.FITS  # interactive: never paced
    load.remove("chat", True)
    assert load.usage().interactive_in_flight == 0
    assert check(replace(w, background_cap=3), load.usage(), "rag", False, 10) is Verdict.FITS


def test_scheduler_holds_background_at_the_cap_and_lets_interactive_through() -> None:
    sched = Scheduler(CLASSES)
    for i in range(4):
        sched.enqueue(req(f"r{i}", "rag", arrival=i), 0.0)
    w = [replace(worker(), background_cap=2)]
    assert [a.request.id for a in sched.admit(0.0, w)] == ["r0", "r1"]
    sched.enqueue(req("c0", "chat", arrival=5), 0.0)
    assert [a.request.id for a in sched.admit(0.0, w)] == ["c0"]
    sched.on_finish("r0", None, None, 1.0)
    assert [a.request.id for a in sched.admit(1.0, w)] == ["r2"]


def test_snapshot_rejects_a_zero_cap() -> None:
    with pytest.raises(ValueError):
        replace(worker(), background_cap=0)


def test_app_cap_counts_each_apps_interactive_sequences() -> None:
    load = WorkerLoad("w0")
    for _ in range(3):
        load.add("chat", True, 10, app="scraper")
    load.add("chat", True, 10, app="chatui")
    load.add("rag", False, 10, app="notes")
    u = load.usage()
    assert dict(u.interactive_by_app) == {"scraper": 3, "chatui": 1}
    assert u.heaviest_app == 3
    w = replace(worker(), app_cap=3)
    assert check(w, u, "chat", True, 10, app="scraper") is Verdict.APP_PACED
    assert check(w, u, "chat", True, 10, app="chatui") is Verdict.FITS
    assert check(w, u, "chat", True, 10, app="guest") is Verdict.FITS
    assert check(w, u, "rag", False, 10, app="notes") is Verdict.FITS  # background: its own cap
    # An app with nothing there is let in even with more sequences than the cap.
    assert check(replace(w, app_cap=1), u, "chat", True, 10, 4, app="guest") is Verdict.FITS
    load.remove("chat", True, app="scraper")
    assert check(w, load.usage(), "chat", True, 10, app="scraper") is Verdict.FITS


def test_a_flooding_app_may_have_only_its_limit_of_prompts_in_prefill() -> None:
    """An app with ``flood_at`` interactive sequences or more on a worker waits while
    ``flood_prefill`` of its prompts are in prefill there; a light app never does, nor the
    flooding app once its prompt's first token came."""
    load = WorkerLoad("w0")
    for _ in range(4):
        load.add("chat", True, 400, app="scraper")
    for _ in range(3):
        load.end_prefill(True, 400, app="scraper")
    load.add("chat", True, 40, app="chatui")
    u = load.usage()
    assert dict(u.interactive_prefill_by_app) == {"scraper": 1, "chatui": 1}
    w = replace(worker(), app_cap=16, flood_at=4, flood_prefill=1)
    assert check(w, u, "chat", True, 400, app="scraper") is Verdict.APP_PACED
    assert check(w, u, "chat", True, 40, app="chatui") is Verdict.FITS  # 1 sequence: light
    for looser in (replace(w, flood_prefill=2), replace(w, flood_at=5), replace(w, flood_at=None)):
        assert check(looser, u, "chat", True, 400, app="scraper") is Verdict.FITS
    assert flooding_apps(u, 4) == ["scraper"]  # what /status and the page show
    assert flooding_apps(u, 1) == ["chatui", "scraper"] and flooding_apps(u, None) == []
    load.end_prefill(True, 400, app="scraper")
    assert dict(load.usage().interactive_prefill_by_app) == {"chatui": 1}
    assert check(w, load.usage(), "chat", True, 400, app="scraper") is Verdict.FITS
    with pytest.raises(ValueError):
        replace(worker(), flood_prefill=0)


def test_a_flooding_app_yields_to_a_light_apps_first_token() -> None:
    """With ``flood_yields`` an app flooding the worker waits while another, lighter app's
    request of the same class there has no first token yet, whatever its early prefill
    release says; its own requests waiting, another flood's, or a light app's of another
    class do not hold it."""
    load = WorkerLoad("w0")
    for _ in range(4):
        load.add("chat", True, 400, app="scraper")
        load.end_prefill(True, 400, app="scraper")
    assert load.usage().awaiting == {("chat", "scraper"): 4}  # its own: no hold
    w = replace(worker(), app_cap=16, flood_at=4, flood_yields=True)
    assert check(w, load.usage(), "chat", True, 400, app="scraper") is Verdict.FITS
    for _ in range(4):
        load.answered("chat", "scraper")
    load.add("voice", True, 40, app="assistant")
    assert load.usage().awaiting == {("voice", "assistant"): 1}
    assert check(w, load.usage(), "chat", True, 400, app="scraper") is Verdict.FITS
    load.add("chat", True, 40, app="chatui")
    load.end_prefill(True, 40, app="chatui")  # the early release: vLLM may not have it yet
    u = load.usage()
    assert u.awaiting == {("voice", "assistant"): 1, ("chat", "chatui"): 1}
    assert check(w, u, "chat", True, 400, app="scraper") is Verdict.APP_PACED
    assert check(w, u, "chat", True, 40, app="chatui") is Verdict.FITS  # light: not held
    assert check(w, u, "chat", True, 40, app="guest") is Verdict.FITS  # nothing there yet
    for off in (replace(w, flood_yields=False), replace(w, flood_at=None)):
        assert check(off, u, "chat", True, 400, app="scraper") is Verdict.FITS
    # A second app with flood_at sequences is a flood too: floods do not wait on each other.
    assert check(replace(w, flood_at=1), u, "chat", True, 400, app="scraper") is Verdict.FITS
    load.answered("chat", "chatui")  # its first token
    assert load.usage().awaiting == {("voice", "assistant"): 1}
    assert check(w, load.usage(), "chat", True, 400, app="scraper") is Verdict.FITS


def test_a_flooding_apps_prompt_counts_until_its_first_token_while_its_class_is_shared() -> None:
    """With ``flood_until_first_token`` a flooding app's prompt past its early prefill
    release still counts against ``flood_prefill`` until its first token, but only while
    another app shares its class (``capped``); alone, the early release frees it."""
    load = WorkerLoad("w0")
    for _ in range(4):
        load.add("chat", True, 400, app="scraper")
        load.end_prefill(True, 400, app="scraper")  # all four released early
    for _ in range(3):
        load.answered("chat", "scraper")  # three first tokens came: one still due
    u = load.usage()
    assert (u.awaiting_of("scraper"), u.awaiting_of("chatui")) == (1, 0)
    assert dict(u.interactive_prefill_by_app) == {}
    w = replace(worker(), flood_at=4, flood_prefill=1, flood_until_first_token=True)
    assert check(w, u, "chat", True, 400, app="scraper") is Verdict.APP_PACED
    assert check(w, u, "chat", True, 400, app="scraper", capped=False) is Verdict.FITS
    loose = (replace(w, flood_until_first_token=False), replace(w, flood_prefill=2))
    for w2 in loose:
        assert check(w2, u, "chat", True, 400, app="scraper") is Verdict.FITS
    load.answered("chat", "scraper")
    assert check(w, load.usage(), "chat", True, 400, app="scraper") is Verdict.FITS


def test_the_scheduler_holds_a_flood_until_the_light_apps_first_token_or_end() -> None:
    """The scheduler counts an interactive request as waiting for its first token from its
    admission until ``on_answered``, streamed output or its end; ``on_first_token`` (the
    prefill budget's release, early or not) does not end it."""
    sched = Scheduler(classes(ClassPolicy("chat", 1, interactive=True, fair_share="fcfs")))
    for i in range(8):
        sched.enqueue(req(f"s{i}", "chat", tenant="scraper", arrival=i), 0.0)
    w = [replace(worker(), flood_at=2, flood_yields=True)]
    assert [a.request.id for a in sched.admit(1.0, w)] == [f"s{i}" for i in range(8)]
    for i in range(8):
        sched.on_answered(f"s{i}")
    for n, end in enumerate(("answered", "progress", "finish")):
        c, s = f"c{n}", f"s{8 + n}"
        sched.enqueue(req(c, "chat", tenant="chatui", arrival=10 + n), 2.0 + n)
        assert [a.request.id for a in sched.admit(2.0 + n, w)] == [c]
        sched.enqueue(req(s, "chat", tenant="scraper", arrival=10 + n), 2.0 + n)
        sched.on_first_token(c, 2.1 + n)  # its prefill budget released early
        assert [a.request.id for a in sched.admit(2.1 + n, w)] == []  # c: no token yet
        if end == "answered":
            assert sched.on_answered(c) and not sched.on_answered(c)
        elif end == "progress":
            sched.on_progress(c, 1, 2.2 + n)
        else:
            sched.on_finish(c, None, None, 2.2 + n)
        assert [a.request.id for a in sched.admit(2.2 + n, w)] == [s]
        sched.on_answered(s)
        sched.on_finish(c, None, None, 2.3 + n)  # (two chatui turns make a flood at 2)
    assert not sched.on_answered("unknown")


def test_background_waits_while_its_limit_of_prompts_is_in_prefill() -> None:
    """With ``background_prefill`` set, a background request waits (``prefill``) while that
    many background prompts are in prefill on the worker, whatever the token budget leaves;
    interactive prompts in prefill do not count and interactive requests never wait on it."""
    load = WorkerLoad("w0")
    load.add("rag", False, 1800, app="notes")
    load.add("chat", True, 40, app="chatui")
    u = load.usage()
    assert (u.prefill_requests, u.interactive_prefill_requests) == (2, 1)
    assert u.background_prefill_requests == 1
    w = replace(worker(), background_prefill=1)
    assert check(w, u, "rag", False, 100, app="notes") is Verdict.PREFILL
    assert check(w, u, "chat", True, 40, app="chatui") is Verdict.FITS
    for looser in (replace(w, background_prefill=2), replace(w, background_prefill=None)):
        assert check(looser, u, "rag", False, 100, app="notes") is Verdict.FITS
    load.end_prefill(False, 1800, app="notes")  # its first token: the next may go
    u = load.usage()
    assert (u.background_prefill_requests, u.interactive_prefill_requests) == (0, 1)
    assert check(w, u, "rag", False, 100, app="notes") is Verdict.FITS
    load.end_prefill(True, 40, app="chatui")
    assert load.usage().interactive_prefill_requests == 0
    with pytest.raises(ValueError):
        replace(worker(), background_prefill=0)


def test_the_scheduler_sends_background_prompts_one_at_a_time_under_the_limit() -> None:
    """With ``background_prefill`` 1 the scheduler admits the next RAG prompt only once the
    previous one's prefill ended (first token or finish), while chat still goes at once."""
    sched = Scheduler(classes())
    for i in range(3):
        sched.enqueue(req(f"r{i}", "rag", tenant="notes", arrival=i, prompt=1800), 0.0)
    w = [replace(worker(), background_prefill=1)]
    assert [a.request.id for a in sched.admit(1.0, w)] == ["r0"]
    sched.enqueue(req("c0", "chat", tenant="chatui", arrival=5), 1.1)
    assert [a.request.id for a in sched.admit(1.1, w)] == ["c0"]  # not held by the limit
    sched.on_first_token("c0", 1.15)
    assert [a.request.id for a in sched.admit(1.15, w)] == []  # r0 still in prefill
    sched.on_first_token("r0", 1.2)
    assert [a.request.id for a in sched.admit(1.2, w)] == ["r1"]
    sched.on_finish("r1", None, None, 1.3)  # ended before its first token: released too
    assert [a.request.id for a in sched.admit(1.3, w)] == ["r2"]
    # Without the limit the budget alone decides: both RAG prompts of 1,800 tokens fit.
    free = Scheduler(classes())
    for i in range(3):
        free.enqueue(req(f"r{i}", "rag", tenant="notes", arrival=i, prompt=1800), 0.0)
    assert len(free.admit(1.0, [worker(prefill_token_budget=4096)])) == 2


def test_the_scheduler_releases_a_flooding_apps_next_prompt_at_its_first_token() -> None:
    sched = Scheduler(classes(ClassPolicy("chat", 1, interactive=True, fair_share="fcfs")))
    for i in range(6):
        sched.enqueue(req(f"s{i}", "chat", tenant="scraper", arrival=i), 0.0)
    w = [replace(worker(), flood_at=2, flood_prefill=1)]
    # Below flood_at the app is light: s0 and s1 go together; then one prompt at a time.
    assert [a.request.id for a in sched.admit(1.0, w)] == ["s0", "s1"]
    sched.on_first_token("s0", 1.1)
    assert [a.request.id for a in sched.admit(1.1, w)] == []  # s1 still in prefill
    sched.on_first_token("s1", 1.2)
    assert [a.request.id for a in sched.admit(1.2, w)] == ["s2"]
    sched.enqueue(req("c0", "chat", tenant="chatui", arrival=7), 1.3)
    assert [a.request.id for a in sched.admit(1.3, w)] == ["c0"]
    sched.on_finish("s2", None, None, 1.4)  # ended before its first token: released too
    assert [a.request.id for a in sched.admit(1.4, w)] == ["s3"]


def test_a_paced_app_first_in_line_does_not_hold_other_apps_of_its_class() -> None:
    """The paced app's queued request comes first (fcfs between apps here), yet the
    other app's later request is admitted; the paced one goes once its app is below the
    cap again."""
    sched = Scheduler(classes(ClassPolicy("chat", 1, interactive=True, fair_share="fcfs")))
    sched.enqueue(req("s0", "chat", tenant="scraper", arrival=0), 0.0)
    sched.enqueue(req("s1", "chat", tenant="scraper", arrival=1), 0.0)
    w = [replace(worker(), app_cap=2)]
    assert [a.request.id for a in sched.admit(1.0, w)] == ["s0", "s1"]
    sched.enqueue(req("s2", "chat", tenant="scraper", arrival=2), 2.0)
    sched.enqueue(req("c0", "chat", tenant="chatui", arrival=3), 3.0)
    assert [a.request.id for a in sched.admit(3.0, w)] == ["c0"]
    sched.on_finish("s0", None, None, 4.0)
    assert [a.request.id for a in sched.admit(4.0, w)] == ["s2"]


def test_the_per_app_gap_follows_the_workers_light_load_speed() -> None:
    """With ``app_gap_steps`` the per-app cap holds that many times the shortest mean gap
    of recent intervals that ended with at most the cap's floor of sequences in flight;
    busy intervals do not move it, the configured gap holds until a light one is seen, and
    a light gap older than LIGHT_WINDOW_S gives way to a newer one; background's gap is its
    ceiling."""
    rule = PacingRule(target_gap_s=0.015, interval_s=0.5, max_cap=16, app_gap_steps=2.5)
    p = WorkerPacer(rule, 0.0, app_min_cap=4)
    assert p.state().app_gap_s == pytest.approx(0.015)  # nothing light seen yet
    p.observe(0.010, 5)
    p.update(0.5, 0, 12, in_flight=12)  # busy: 2 ms a token says nothing of the speed
    assert p.state().app_gap_s == pytest.approx(0.015)
    p.observe(0.008, 2)  # 4 ms a token with two sequences in flight
    p.update(1.0, 0, 2, in_flight=2)
    assert p.state().app_gap_s == pytest.approx(0.010)
    p.observe(0.006, 2)  # faster: the shortest light gap counts
    p.update(1.5, 0, 1, in_flight=1)
    assert p.state().app_gap_s == pytest.approx(0.0075)
    p.observe(0.010, 2)
    p.update(2.0, 0, 3, in_flight=3)
    assert p.state().app_gap_s == pytest.approx(0.0075)
    # Ten minutes on, the box runs slower: the old light gaps have left the window.
    p.observe(0.009, 2)
    p.update(2.0 + LIGHT_WINDOW_S, 0, 1, in_flight=1)
    assert p.state().app_gap_s == pytest.approx(0.01125)
    # The cap judges its intervals against the gap it holds now: 12 ms is over 11.25.
    p.observe(0.012, 1)
    p.update(2.5 + LIGHT_WINDOW_S, 0, 16, in_flight=16)
    assert p.app_cap == 13  # floor(16 x 0.85)
    # A slow box: 2.5 x 8 ms would be 20 ms, looser than background's 15 ms; 15 ms holds.
    p.observe(0.016, 2)
    p.update(3.0 + 2 * LIGHT_WINDOW_S, 0, 2, in_flight=2)
    assert p.state().app_gap_s == pytest.approx(0.015)
    fixed = WorkerPacer(replace(rule, app_gap_steps=None), 0.0, app_min_cap=4)
    fixed.observe(0.008, 2)
    fixed.update(0.5, 0, 2, in_flight=2)
    assert fixed.state().app_gap_s == pytest.approx(0.015)
    assert WorkerPacer(rule, 0.0).state().app_gap_s is None  # no per-app cap
    with pytest.raises(ValueError):
        replace(rule, app_gap_steps=0.5)


def test_worker_pacer_cuts_apps_only_once_background_is_at_its_floor() -> None:
    rule = PacingRule(target_gap_s=0.02, interval_s=0.5, decrease=0.5, max_cap=16)
    p = WorkerPacer(rule, 0.0, app_min_cap=4)
    assert (p.cap, p.app_cap) == (16, 16)
    p.observe(0.04, 1)
    p.update(0.5, background_in_flight=8, heaviest_app=12)
    assert (p.cap, p.app_cap) == (4, 16)  # background first
    p.observe(0.04, 1)
    p.update(1.0, background_in_flight=1, heaviest_app=12)
    assert p.app_cap == 10  # floor(12 x 0.85), a gentler cut: background at its floor now
    for t, held in ((1.5, 6), (2.0, 5), (2.5, 4), (3.0, 4)):  # the app's work comes down
        p.observe(0.04, 1)
        p.update(t, background_in_flight=0, heaviest_app=held)
    assert p.app_cap == 4  # never below the app floor
    # Each of these intervals was over the gap target and not settling: one cut of the
    # background cap each (at its floor too: the pressure stays visible), and from the
    # second on one of the app cap.
    state = p.state()
    assert state.cut_counts() == [
        ("background", "gap", 6),
        ("background", "late", 0),
        ("app", "gap", 5),
    ]
    assert WorkerPacer(rule, 0.0).app_cap is None  # per-app pacing off
    assert WorkerPacer(rule, 0.0).state().cut_counts() == [
        ("background", "gap", 0),
        ("background", "late", 0),
    ]


def test_the_app_cap_may_hold_its_own_gap() -> None:
    """With ``app_gap_s`` the per-app cap is cut at its own gap, the background cap at
    ``target_gap_s``: a 12 ms gap is under a 15 ms background target and over an 8 ms app
    gap."""
    rule = PacingRule(target_gap_s=0.015, interval_s=0.5, max_cap=16, app_gap_s=0.008)
    own, same = (
        WorkerPacer(rule, 0.0, app_min_cap=4),
        WorkerPacer(replace(rule, app_gap_s=None), 0.0, app_min_cap=4),
    )
    for p in (own, same):
        p.observe(0.012, 1)
        p.update(0.5, background_in_flight=0, heaviest_app=12)
    assert (own.cap, own.app_cap) == (16, 10)  # floor(12 x 0.85)
    assert (same.cap, same.app_cap) == (16, 16)  # 12 ms is within 15 ms: no cut
