"""The adaptive batching window (policies/windows.py) on plain values with a fake clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hearthgate.policies.windows import (
    ArrivalGaps,
    BatchView,
    Load,
    Reason,
    WindowPolicy,
    deadline,
    decide,
)

T0 = 1000.0
EMBED = WindowPolicy(min_wait_s=0.0, max_wait_s=0.020, max_batch_size=64, max_batch_tokens=16384)
IDLE = Load(worker_busy=False, interactive_active=False)
BUSY = Load(worker_busy=True, interactive_active=False)


def one(now: float, size: int = 1, tokens: int = 10) -> BatchView:
    return BatchView(opened_at=now, oldest_arrival=now, last_join=now, size=size, tokens=tokens)


def gaps_every(step: float, n: int, start: float = T0) -> tuple[ArrivalGaps, float]:
    g = ArrivalGaps()
    t = start
    for i in range(n):
        t = start + i * step
        g.observe(t)
    return g, t


# ------------------------------------------------------------------ the rule


def test_zero_window_and_interactive_default_dispatch_at_once() -> None:
    d = decide(WindowPolicy(), one(T0), BUSY, 0.0001, T0)
    assert d.dispatch_at == T0 and d.reason is Reason.ZERO_WINDOW


def test_no_added_wait_when_nothing_was_measured_yet() -> None:
    for load in (IDLE, BUSY):
        d = decide(EMBED, one(T0), load, None, T0)
        assert d.dispatch_at == T0 and d.reason is Reason.SPARSE


def test_no_added_wait_when_arrivals_are_sparse() -> None:
    g, last = gaps_every(0.5, 20)  # one request every 500 ms; the window is 20 ms
    for load in (IDLE, BUSY):
        d = decide(EMBED, one(last), load, g.expected_gap(last), last)
        assert d.dispatch_at == last and d.reason is Reason.SPARSE


def test_idle_worker_gets_the_request_at_once_even_when_arrivals_are_dense() -> None:
    g, last = gaps_every(0.002, 50)
    d = decide(EMBED, one(last), IDLE, g.expected_gap(last), last)
    assert d.reason is Reason.IDLE and d.dispatch_at == last
    # With a minimum wait set, that minimum still holds.
    policy = WindowPolicy(min_wait_s=0.003, max_wait_s=0.020, max_batch_size=64)
    assert decide(policy, one(last), IDLE, g.expected_gap(last), last).dispatch_at == last + 0.003


def test_a_client_sending_one_at_a_time_is_never_held() -> None:
    # A closed loop: the next request comes only when the previous answer is back (1 ms on
    # the worker). The worker is idle at each arrival, so no request waits, and the gaps
    # stay what the client makes them.
    g = ArrivalGaps()
    now, waits = T0, []
    for _ in range(200):
        g.observe(now)
        d = decide(EMBED, one(now), IDLE, g.expected_gap(now), now)
        waits.append(d.dispatch_at - now)
        now = d.dispatch_at + 0.001
    assert max(waits) == 0.0


def test_busy_worker_and_dense_arrivals_grow_toward_the_maximum_but_stay_bounded() -> None:
    g, last = gaps_every(0.001, 50)
    d = decide(EMBED, one(last), BUSY, g.expected_gap(last), last)
    assert d.reason is Reason.BUSY_FILL
    # 63 free slots at 1 ms each would take 63 ms; the window caps it at 20 ms.
    assert d.dispatch_at == pytest.approx(last + 0.020)
    # Nearly full: only the time to fill the rest.
    d = decide(EMBED, one(last, size=60), BUSY, g.expected_gap(last), last)
    assert d.dispatch_at == pytest.approx(last + 0.004)


def test_window_shrinks_to_the_minimum_when_interactive_work_appears() -> None:
    policy = WindowPolicy(min_wait_s=0.003, max_wait_s=0.050, max_batch_size=64)
    g, last = gaps_every(0.001, 50)
    busy = decide(policy, one(last), BUSY, g.expected_gap(last), last)
    assert busy.dispatch_at == pytest.approx(last + 0.050)
    shrunk = decide(policy, one(last), Load(True, True), g.expected_gap(last), last)
    assert shrunk.reason is Reason.INTERACTIVE
    assert shrunk.dispatch_at == pytest.approx(last + 0.003)
    # Already open longer than the minimum: it goes now.
    later = last + 0.010
    d = decide(policy, one(last), Load(True, True), g.expected_gap(later), later)
    assert d.dispatch_at == later


def test_full_batch_goes_at_once() -> None:
    last = T0
    assert decide(EMBED, one(last, size=64), BUSY, 0.001, last).reason is Reason.FULL
    assert decide(EMBED, one(last, tokens=16384), BUSY, 0.001, last).dispatch_at == last


def test_ttft_target_caps_the_wait() -> None:
    policy = WindowPolicy(max_wait_s=1.0, max_batch_size=1000, ttft_s=0.2, ttft_margin_s=0.05)
    batch = BatchView(opened_at=T0 + 0.1, oldest_arrival=T0, last_join=T0 + 0.1, size=1, tokens=1)
    d = decide(policy, batch, BUSY, 0.001, T0 + 0.1)
    assert d.dispatch_at == pytest.approx(T0 + 0.15)
    late = decide(policy, batch, BUSY, 0.001, T0 + 0.3)  # past the deadline: now
    assert late.dispatch_at == T0 + 0.3


def test_fits_and_full() -> None:
    assert EMBED.fits(0, 0, 500, 10**6)  # an empty batch takes anything
    assert EMBED.fits(60, 100, 4, 100)
    assert not EMBED.fits(60, 100, 5, 100)
    assert not EMBED.fits(1, 16000, 1, 385)
    assert not EMBED.full(63, 100) and EMBED.full(64, 0)


def test_policy_validation() -> None:
    with pytest.raises(ValueError, match="min_wait_s"):
        WindowPolicy(min_wait_s=0.1, max_wait_s=0.05)
    with pytest.raises(ValueError, match="max_batch_size"):
        WindowPolicy(max_batch_size=0)
    with pytest.raises(ValueError, match="ttft_s"):
        WindowPolicy(ttft_s=0)


# ------------------------------------------------------------------ arrival gaps


def test_arrival_gaps_mean_and_staleness() -> None:
    g = ArrivalGaps(alpha=0.5)
    assert g.expected_gap(T0) is None
    g.observe(T0)
    assert g.expected_gap(T0) is None
    g.observe(T0 + 0.010)
    assert g.expected_gap(T0 + 0.010) == pytest.approx(0.010)
    g.observe(T0 + 0.012)
    assert g.expected_gap(T0 + 0.012) == pytest.approx(0.006)
    # Silence longer than the mean: the silence is the better guess.
    assert g.expected_gap(T0 + 0.5) == pytest.approx(0.488)


def test_a_long_lull_is_capped_so_a_new_burst_is_seen_quickly() -> None:
    g = ArrivalGaps(alpha=0.2, cap_s=0.2)
    g.observe(T0)
    g.observe(T0 + 3600)  # an hour of nothing counts as 200 ms
    t = T0 + 3600
    for _ in range(15):
        t += 0.001
        g.observe(t)
    gap = g.expected_gap(t)
    assert gap is not None and gap < 0.01


# ------------------------------------------------------------------ properties

times = st.floats(0, 10, allow_nan=False)
small = st.floats(0, 0.5, allow_nan=False)


@st.composite
def cases(draw: st.DrawFn) -> tuple[WindowPolicy, BatchView, Load, float | None, float]:
    lo = draw(small)
    hi = lo + draw(small)
    ttft = draw(st.none() | st.floats(0.001, 2, allow_nan=False))
    policy = WindowPolicy(
        min_wait_s=lo,
        max_wait_s=hi,
        max_batch_size=draw(st.none() | st.integers(1, 128)),
        max_batch_tokens=draw(st.none() | st.integers(1, 10**5)),
        ttft_s=ttft,
        ttft_margin_s=draw(small),
    )
    oldest = draw(times)
    opened = oldest + draw(small)
    last = opened + draw(small)
    batch = BatchView(opened, oldest, last, draw(st.integers(1, 200)), draw(st.integers(0, 10**5)))
    load = Load(draw(st.booleans()), draw(st.booleans()))
    gap = draw(st.none() | st.floats(0, 2, allow_nan=False))
    now = last + draw(st.floats(0, 1, allow_nan=False))
    return policy, batch, load, gap, now


@settings(max_examples=500, deadline=None)
@given(cases())
def test_never_before_now_never_past_the_window_or_the_ttft_target(
    case: tuple[WindowPolicy, BatchView, Load, float | None, float],
) -> None:
    policy, batch, load, gap, now = case
    d = decide(policy, batch, load, gap, now)
    assert d.dispatch_at >= now
    assert d.dispatch_at <= max(now, batch.opened_at + policy.max_wait_s)
    assert d.dispatch_at <= max(now, deadline(policy, batch))
    if policy.ttft_s is not None:
        limit = batch.oldest_arrival + policy.ttft_s - policy.ttft_margin_s
        assert d.dispatch_at <= max(now, limit) + 1e-12
    if load.interactive_active or gap is None:
        floor = min(batch.opened_at + policy.min_wait_s, deadline(policy, batch))
        assert d.dispatch_at == max(now, floor) or d.reason in (Reason.FULL, Reason.ZERO_WINDOW)
    assert decide(policy, batch, load, gap, now) == d  # deterministic


# ------------------------------------------------------------------ a fake-clock run


def simulate(step: float, n: int, busy: bool, ttft_s: float | None = None) -> list[list[float]]:
    """Arrivals every ``step`` s; each joins the open batch, which is sent when due.
    Returns each batch's members' waits (send time - arrival)."""
    policy = WindowPolicy(max_wait_s=0.020, max_batch_size=16, ttft_s=ttft_s, ttft_margin_s=0.0)
    gaps = ArrivalGaps()
    batches: list[list[float]] = []
    members: list[float] = []
    due: float | None = None
    for i in range(n):
        now = T0 + i * step
        if due is not None and due <= now:  # the timer fired before this arrival
            batches.append([due - a for a in members])
            members, due = [], None
        gaps.observe(now)
        if not policy.fits(len(members), 0, 1, 0):
            batches.append([now - a for a in members])
            members = []
        members.append(now)
        view = BatchView(members[0], members[0], now, len(members), 0)
        d = decide(policy, view, Load(busy, False), gaps.expected_gap(now), now)
        due = d.dispatch_at
        if d.due(now):
            batches.append([now - a for a in members])
            members, due = [], None
    if members and due is not None:
        batches.append([due - a for a in members])
    return batches


def test_run_sparse_arrivals_are_sent_alone_without_waiting() -> None:
    batches = simulate(step=0.1, n=50, busy=True)
    assert all(len(b) == 1 for b in batches)
    assert max(w for b in batches for w in b) == 0.0


def test_run_dense_arrivals_on_a_busy_worker_form_batches_within_the_window() -> None:
    batches = simulate(step=0.001, n=400, busy=True)
    sizes = [len(b) for b in batches]
    assert sum(sizes) == 400
    assert max(sizes) <= 16 and sum(sizes) / len(sizes) > 8
    assert max(w for b in batches for w in b) <= 0.020 + 1e-9


def test_run_waits_never_pass_the_ttft_target() -> None:
    batches = simulate(step=0.001, n=400, busy=True, ttft_s=0.005)
    assert max(w for b in batches for w in b) <= 0.005 + 1e-9
