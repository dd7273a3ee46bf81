"""The admission controller around the real pure scheduler, with a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from hearthgate.gateway.admission import AdmissionController
from hearthgate.gateway.errors import ClientGone, NoWorkerAvailable, RateLimited
from hearthgate.gateway.ticket import Ticket
from hearthgate.policies.estimators import DrainRate
from hearthgate.policies.pacing import PacingRule
from hearthgate.policies.scheduler import Scheduler
from hearthgate.policies.types import ClassPolicy, QueuedRequest, WorkerBudget, WorkerSnapshot
from tests.inprocess import until


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make(max_in_flight: int = 1, **cls_kw: object) -> tuple[AdmissionController, Clock]:
    clock = Clock()
    sched = Scheduler([ClassPolicy("chat", 1, interactive=True, **cls_kw)])  # type: ignore[arg-type]
    snaps = [WorkerSnapshot("w0", limits=WorkerBudget(max_in_flight=max_in_flight))]
    return AdmissionController(sched, lambda: snaps, clock=clock), clock, sched


def paced(
    rule: PacingRule, app_pacing_floor: int | None = None
) -> tuple[AdmissionController, Clock]:
    """A controller paced by ``rule`` over one worker, w0, with an interactive chat class and
    a background rag class."""
    clock = Clock()
    sched = Scheduler(
        [ClassPolicy("chat", 1, interactive=True), ClassPolicy("rag", 2, interactive=False)]
    )
    snaps = [WorkerSnapshot("w0")]
    ctl = AdmissionController(
        sched, lambda: snaps, clock=clock, pacing=rule, app_pacing_floor=app_pacing_floor
    )
    return ctl, clock


def rq(i: int, clock: Clock) -> QueuedRequest:
    return QueuedRequest(f"r{i}", "chat", "app", clock(), 1, 10, 5)


async def queued(ctl: AdmissionController, waiter: asyncio.Task[Ticket]) -> None:
    """Wait until ``waiter`` (the only one) waits in the controller's queue; fail if it was
    admitted or refused at once instead."""
    await until(lambda: ctl.waiting == 1 or waiter.done())
    assert not waiter.done(), "the request did not wait in the queue"


async def test_admits_at_once_when_it_fits() -> None:
    ctl, clock, sched = make()
    ticket = await ctl.admit(rq(1, clock))
    assert ticket.worker == "w0"
    assert sched.in_flight_count == 1
    ticket.finish(10, 5)
    ticket.finish(10, 5)  # a second finish changes nothing
    assert sched.in_flight_count == 0


async def test_waits_until_a_slot_frees() -> None:
    ctl, clock, sched = make()
    first = await ctl.admit(rq(1, clock))
    waiter = asyncio.create_task(ctl.admit(rq(2, clock)))
    await queued(ctl, waiter)
    assert not waiter.done() and sched.queued_count == 1
    first.finish(10, 5)
    second = await asyncio.wait_for(waiter, 1)
    assert second.request.id == "r2" and sched.queued_count == 0


async def test_disconnect_while_queued_leaves_no_trace() -> None:
    ctl, clock, sched = make()
    first = await ctl.admit(rq(1, clock))
    gone = asyncio.Event()

    async def disconnected() -> None:
        await gone.wait()

    waiter = asyncio.create_task(ctl.admit(rq(2, clock), disconnected))
    await queued(ctl, waiter)
    gone.set()
    with pytest.raises(ClientGone):
        await asyncio.wait_for(waiter, 1)
    assert sched.queued_count == 0 and not sched.is_queued("r2")
    first.finish(10, 5)
    assert sched.in_flight_count == 0  # the freed slot went to nobody


async def test_queue_full_is_429_with_retry_after() -> None:
    ctl, clock, _ = make(max_queue=1)
    await ctl.admit(rq(1, clock))
    waiter = asyncio.create_task(ctl.admit(rq(2, clock)))
    await queued(ctl, waiter)
    with pytest.raises(RateLimited) as info:
        await ctl.admit(rq(3, clock))
    assert info.value.code == "queue_full" and (info.value.retry_after_s or 0) >= 1
    waiter.cancel()


async def test_queue_timeout_by_the_ticker() -> None:
    ctl, clock, sched = make(queue_timeout_s=1.0)
    await ctl.admit(rq(1, clock))
    waiter = asyncio.create_task(ctl.admit(rq(2, clock)))
    await queued(ctl, waiter)
    clock.t += 0.5
    ctl.tick()
    assert not waiter.done()
    clock.t += 1.0
    ctl.tick()
    with pytest.raises(RateLimited) as info:
        await asyncio.wait_for(waiter, 1)
    assert info.value.code == "queue_timeout"
    assert sched.queued_count == 0


async def test_no_healthy_worker_fails_fast() -> None:
    ctl, clock, sched = make()
    with pytest.raises(NoWorkerAvailable):
        await ctl.admit(rq(1, clock), eligible_healthy=False)
    assert sched.queued_count == 0


def test_drain_rate_retry_after() -> None:
    d = DrainRate(window_s=10)
    assert d.retry_after("chat", 5, 0.0) == 5  # nothing measured yet: the fallback
    for i in range(20):
        d.record("chat", float(i) * 0.5)  # 20 ends in 10 s: 2 per second
    assert d.retry_after("chat", 10, 10.0) == 5
    assert d.retry_after("chat", 1, 10.0) == 1


async def test_non_streaming_prefill_is_released_after_the_estimate() -> None:
    clock = Clock()
    sched = Scheduler([ClassPolicy("batch", 4)])
    snaps = [WorkerSnapshot("w0", limits=WorkerBudget(prefill_token_budget=1000))]
    ctl = AdmissionController(sched, lambda: snaps, clock=clock)
    ctl.prefill_rates.initial = 1000.0  # tokens per second
    first = await ctl.admit(QueuedRequest("a", "batch", "app", clock(), 4, 800, 100))
    first.expect_no_stream()
    waiter = asyncio.create_task(ctl.admit(QueuedRequest("b", "batch", "app", clock(), 4, 800, 1)))
    await queued(ctl, waiter)
    clock.t += 0.5
    ctl.tick()
    assert not waiter.done()  # 800 tokens at 1000/s: prefill still running
    clock.t += 0.4
    ctl.tick()
    second = await asyncio.wait_for(waiter, 1)
    assert second.worker == "w0" and sched.in_flight_count == 2


def test_prefill_rate_is_measured_from_long_prompts_only() -> None:
    from hearthgate.policies.estimators import PrefillRates

    r = PrefillRates(initial=1000.0, min_tokens=256, alpha=0.5)
    r.observe("w", 100, 1.0)  # too short to say anything
    assert r.seconds("w", 1000) == 1.0
    r.observe("w", 2000, 0.5)  # 4000 tokens/s
    assert r.seconds("w", 4000) == 1.0
    r.observe("w", 2000, 1.0)  # halfway to 2000/s
    assert r.seconds("w", 3000) == 1.0


async def test_streaming_prefill_is_released_early_or_at_the_first_token() -> None:
    clock = Clock()
    sched = Scheduler([ClassPolicy("rag", 2)])
    snaps = [WorkerSnapshot("w0", limits=WorkerBudget(prefill_token_budget=1000))]
    ctl = AdmissionController(sched, lambda: snaps, clock=clock, early_release=0.5)
    ctl.prefill_rates.initial = 1000.0
    first = await ctl.admit(QueuedRequest("a", "rag", "app", clock(), 2, 800, 10))
    first.expect_stream()
    waiter = asyncio.create_task(ctl.admit(QueuedRequest("b", "rag", "app", clock(), 2, 800, 10)))
    await queued(ctl, waiter)
    clock.t += 0.3
    ctl.tick()
    assert not waiter.done()
    clock.t += 0.2  # half of the 0.8 s estimate: released before the first token
    ctl.tick()
    second = await asyncio.wait_for(waiter, 1)
    second.expect_stream()
    second.first_token()  # the real first token comes first: the timer then does nothing
    clock.t += 1.0
    ctl.tick()
    assert sched.worker_usage()["w0"].prefill_tokens == 0


async def test_streamed_gaps_pace_background_admissions() -> None:
    """Token gaps reported through tickets move the worker's background cap at the ticker,
    and the cap then holds background requests back while interactive ones still pass."""
    ctl, clock = paced(PacingRule(target_gap_s=0.02, interval_s=0.5, decrease=0.5, max_cap=8))
    bg = [
        await ctl.admit(QueuedRequest(f"b{i}", "rag", "app", clock(), 2, 10, 50))
        for i in (0, 1, 2, 3)
    ]
    for n in range(1, 6):  # 40 ms between tokens: twice the target
        bg[0].progress(n)
        clock.t += 0.04
    clock.t += 0.5
    ctl.tick()
    state = ctl.pacing_state()["w0"]
    assert state.background_cap == 2  # floor(4 running x 0.5)
    assert state.token_gap_s == pytest.approx(0.04)
    assert state.app_cap is None  # per-app pacing is off unless given a floor
    assert [s.background_cap for s in ctl.snapshots()] == [2]
    waiter = asyncio.create_task(ctl.admit(QueuedRequest("b4", "rag", "app", clock(), 2, 10, 50)))
    await queued(ctl, waiter)
    assert not waiter.done()  # 4 background sequences run, the cap is 2
    chat = await ctl.admit(QueuedRequest("c0", "chat", "app", clock(), 1, 10, 5))
    assert chat.worker == "w0"
    for t in bg[:3]:
        t.finish(10, 5)
    (await asyncio.wait_for(waiter, 1.0)).finish(10, 5)
    chat.finish(10, 5)
    bg[3].finish(10, 5)


async def test_a_class_removed_by_a_reload_is_a_clean_503_not_a_crash() -> None:
    """A request classified just before a reload removed its class: 503 with Retry-After
    (a retry is classified under the new settings), nothing left in the controller."""
    ctl, clock, sched = make()
    req = QueuedRequest("r1", "rag", "app", clock(), 2, 10, 5)
    with pytest.raises(NoWorkerAvailable) as err:
        await ctl.admit(req)
    assert err.value.code == "class_removed" and err.value.retry_after_s is not None
    assert ctl.waiting == 0 and sched.queued_count == 0


async def test_late_shedding_is_a_429_with_the_wait_the_drain_rate_justifies() -> None:
    clock = Clock()
    sched = Scheduler([ClassPolicy("rag", 2, ttft_s=3.0, shed_late=True)])
    snaps = [WorkerSnapshot("w0", limits=WorkerBudget(max_in_flight=1))]
    ctl = AdmissionController(sched, lambda: snaps, clock=clock)
    ctl.drain.busy("rag", clock() - 30, True)  # busy for the last 30 s...
    for i in range(30):  # ...finishing 30: 1 request a second
        ctl.drain.record("rag", clock() - i * 0.5)
    running = await ctl.admit(QueuedRequest("r0", "rag", "app", clock(), 2, 10, 5))
    running.first_token()  # decoding: no longer ahead of anyone's first token
    waiters = [
        asyncio.create_task(ctl.admit(QueuedRequest(f"r{i}", "rag", "app", clock(), 2, 10, 5)))
        for i in range(1, 4)
    ]
    await until(lambda: ctl.waiting == 3)
    with pytest.raises(RateLimited) as err:
        await ctl.admit(QueuedRequest("r9", "rag", "app", clock(), 2, 10, 5))
    assert err.value.code == "target_unreachable"
    # 3 ahead at 1/s + 10 tokens at the initial 4000 tok/s prefill: just past 3 s; the
    # suggested wait is never under a second
    assert err.value.retry_after_s == 1
    assert "past its first-token target (3 requests ahead of it)" in str(err.value)
    assert ctl.waiting == 3
    running.finish(10, 5)
    for w in waiters:
        w.cancel()


async def test_a_standing_lines_backlog_is_told_429_by_the_ticker() -> None:
    """Requests queued before the line stood and that would wait its 15 s again get the
    same 429 and justified Retry-After as a late arrival, from the ticker; the oldest stay
    queued and are admitted in turn."""
    clock = Clock()
    rag = ClassPolicy(
        "rag", 2, ttft_s=3.0, shed_late=True, shed_after_wait_s=15.0, shed_queued=True
    )
    sched = Scheduler([rag])
    snaps = [WorkerSnapshot("w0", limits=WorkerBudget(max_in_flight=1))]
    ctl = AdmissionController(sched, lambda: snaps, clock=clock)
    ctl.drain.busy("rag", clock() - 30, True)
    for i in range(30):  # 1 request a second
        ctl.drain.record("rag", clock() - i)
    running = await ctl.admit(QueuedRequest("r0", "rag", "app", clock(), 2, 10, 5))
    waiters = [
        asyncio.create_task(ctl.admit(QueuedRequest(f"r{i:02}", "rag", "app", clock(), 2, 10, 5)))
        for i in range(1, 21)  # one arrival time: the ids order them
    ]
    await until(lambda: ctl.waiting == 20)
    ctl.tick()
    assert ctl.waiting == 20  # nobody has waited 15 s yet
    clock.t += 15.0  # (no request finished meanwhile: still ~1 a second over the window)
    rate = ctl.drain.measured_rate("rag", clock())
    ctl.tick()
    keep = int(rate * 15.0)  # r0 unanswered ahead of them all
    assert 0 < keep < 20
    await until(lambda: ctl.waiting == keep)
    told = [w for w in waiters if w.done()]
    assert told == waiters[keep:]  # the newest
    for w in told:
        err = w.exception()
        assert isinstance(err, RateLimited) and err.code == "target_unreachable"
        assert err.retry_after_s is not None and err.retry_after_s >= 1
    assert all(not w.done() for w in waiters[:keep])  # the oldest keep their place
    running.finish(10, 5)
    await asyncio.wait_for(waiters[0], 1)
    for w in waiters:
        w.cancel()


async def test_late_shedding_counts_the_line_waiting_in_the_worker() -> None:
    """Embeddings have no budget on their worker: every request is sent at once and the
    line waits inside vLLM, not in the gateway's queue. Requests sent and not yet answered
    count as ahead of a new one, so a flood is refused once that line is longer than the
    class's target at the rate answers come back; answers shorten it again."""
    clock = Clock()
    sched = Scheduler([ClassPolicy("embed", 3, ttft_s=2.0, shed_late=True)])
    snaps = [WorkerSnapshot("e0")]
    ctl = AdmissionController(sched, lambda: snaps, clock=clock)
    ctl.drain.busy("embed", clock() - 10, True)
    for i in range(50):  # 50 answers in the last 10 busy seconds: 5 a second
        ctl.drain.record("embed", clock() - i * 0.2)
    sent = [
        await ctl.admit(QueuedRequest(f"e{i}", "embed", "notes", clock(), 3, 20, 0))
        for i in range(10)
    ]
    for t in sent:
        t.expect_no_stream()  # as embeddings do: the prefill budget goes at its estimate
    clock.t += 0.05
    ctl.tick()  # ...which has passed: still, no answer has come
    assert ctl.waiting == 0  # nothing queued in the gateway: all ten are at the worker
    assert ctl.unanswered("embed") == 10
    # 10 ahead at 5/s is exactly the 2 s target, plus the new one's own (tiny) prefill
    with pytest.raises(RateLimited) as err:
        await ctl.admit(QueuedRequest("e10", "embed", "notes", clock(), 3, 20, 0))
    assert err.value.code == "target_unreachable"
    assert "(10 requests ahead of it)" in str(err.value)
    assert err.value.retry_after_s == 1
    sent[0].finish(20, 0)  # one answered: 9 ahead, 1.8 s
    sent[0].finish(20, 0)  # (a second finish changes nothing)
    sent[1].first_token()  # a streamed first token leaves the line too: 8 ahead
    assert ctl.unanswered("embed") == 8
    more = await ctl.admit(QueuedRequest("e11", "embed", "notes", clock(), 3, 20, 0))
    for t in [*sent[1:], more]:
        t.finish(20, 0)
    assert ctl.unanswered("embed") == 0


async def test_a_flooding_app_is_paced_while_a_light_app_of_its_class_passes() -> None:
    """With per-app pacing, slow token gaps and no background to give way cut the cap on
    one app's interactive sequences: the flooding app's next request waits in the gateway,
    another app's request of the same class goes straight to the worker, and the flood's
    request goes once one of its own finishes. (The chat UI sent a turn first: an app alone
    in its class is not held to the cap, policies.class_apps.)"""
    clock = Clock()
    sched = Scheduler([ClassPolicy("chat", 1, interactive=True)])
    snaps = [WorkerSnapshot("w0")]
    rule = PacingRule(target_gap_s=0.02, interval_s=0.5, decrease=0.5, max_cap=8)
    ctl = AdmissionController(sched, lambda: snaps, clock=clock, pacing=rule, app_pacing_floor=2)
    (await ctl.admit(QueuedRequest("c-", "chat", "chatui", clock(), 1, 10, 5))).finish(10, 5)
    flood = [
        await ctl.admit(QueuedRequest(f"s{i}", "chat", "scraper", clock(), 1, 100, 50))
        for i in range(6)
    ]
    for n in range(1, 6):  # 40 ms between tokens: twice the target
        flood[0].progress(n)
        clock.t += 0.04
    clock.t += 0.5
    ctl.tick()
    state = ctl.pacing_state()["w0"]
    assert state.app_cap == 5  # floor(6 in flight x 0.85)
    assert state.background_cap == 1  # no background ran: its cap is at the floor
    waiter = asyncio.create_task(
        ctl.admit(QueuedRequest("s6", "chat", "scraper", clock(), 1, 100, 50))
    )
    await queued(ctl, waiter)
    assert not waiter.done()  # the scraper holds 6, its cap is 5
    light = await ctl.admit(QueuedRequest("c0", "chat", "chatui", clock(), 1, 10, 5))
    assert light.worker == "w0"  # another app passes at once
    flood[0].finish(100, 50)
    await asyncio.sleep(0)
    assert not waiter.done()  # 5 left: still at the cap
    flood[1].finish(100, 50)
    (await asyncio.wait_for(waiter, 1.0)).finish(100, 50)
    for t in [*flood[2:], light]:
        t.finish(10, 5)


async def test_a_flooding_apps_next_prompt_waits_for_its_prefill_from_a_cold_start() -> None:
    """The flood limit holds before any token came back (no pacer yet): an app with
    ``flood_at`` sequences on the worker sends its next prompt once its last one leaves
    prefill (here at its first token); a light app's prompt goes at once."""
    clock = Clock()
    sched = Scheduler([ClassPolicy("chat", 1, interactive=True)])
    snaps = [WorkerSnapshot("w0")]
    rule = PacingRule(target_gap_s=0.02, interval_s=0.5, max_cap=8, flood_prefill=1)
    ctl = AdmissionController(sched, lambda: snaps, clock=clock, pacing=rule, app_pacing_floor=2)
    assert not ctl.paced.active
    first = [
        await ctl.admit(QueuedRequest(f"s{i}", "chat", "scraper", clock(), 1, 100, 50))
        for i in range(2)
    ]
    waiter = asyncio.create_task(
        ctl.admit(QueuedRequest("s2", "chat", "scraper", clock(), 1, 100, 50))
    )
    await queued(ctl, waiter)
    assert not waiter.done()  # 2 sequences (a flood here), both prompts in prefill
    light = await ctl.admit(QueuedRequest("c0", "chat", "chatui", clock(), 1, 10, 5))
    assert light.worker == "w0"
    first[0].first_token()
    await asyncio.sleep(0)
    assert not waiter.done()  # s1 is still in prefill
    first[1].first_token()
    (await asyncio.wait_for(waiter, 1.0)).finish(100, 50)
    for t in [*first, light]:
        t.finish(10, 5)


async def test_a_flooding_app_waits_for_a_light_apps_first_token_not_its_early_release() -> None:
    """With ``flood_yields`` a flooding app's next request waits in the gateway while the
    light app's streamed request has no first token, past the early prefill release, and
    goes at that token; a light request that does not stream holds it until its estimated
    prefill ends."""
    clock = Clock()
    sched = Scheduler([ClassPolicy("chat", 1, interactive=True)])
    snaps = [WorkerSnapshot("w0")]
    rule = PacingRule(target_gap_s=0.02, interval_s=0.5, max_cap=8, flood_yields=True)
    ctl = AdmissionController(
        sched, lambda: snaps, clock=clock, pacing=rule, app_pacing_floor=2, early_release=0.5
    )
    flood = [
        await ctl.admit(QueuedRequest(f"s{i}", "chat", "scraper", clock(), 1, 100, 50))
        for i in range(2)
    ]
    clock.t += 0.1  # 100-token prompts in 0.1 s: c1's estimated prefill is 40 ms
    for t in flood:
        t.first_token()
    light = await ctl.admit(QueuedRequest("c0", "chat", "chatui", clock(), 1, 40, 5))
    light.expect_stream()
    waiter = asyncio.create_task(
        ctl.admit(QueuedRequest("s2", "chat", "scraper", clock(), 1, 100, 50))
    )
    await queued(ctl, waiter)
    clock.t += 5.0  # far past any early release of c0's 40-token prompt
    ctl.tick()
    await asyncio.sleep(0.01)
    assert not waiter.done()  # c0 has no first token yet
    light.first_token()
    third = await asyncio.wait_for(waiter, 1.0)
    third.first_token()
    light.finish(40, 5)  # (two chatui sequences would make it a flood here too)
    quiet = await ctl.admit(QueuedRequest("c1", "chat", "chatui", clock(), 1, 40, 5))
    quiet.expect_no_stream()
    waiter = asyncio.create_task(
        ctl.admit(QueuedRequest("s3", "chat", "scraper", clock(), 1, 100, 50))
    )
    await queued(ctl, waiter)
    clock.t += 5.0
    ctl.tick()  # c1's estimated prefill is over
    (await asyncio.wait_for(waiter, 1.0)).finish(100, 50)
    for t in [*flood, third, quiet]:
        t.finish(10, 5)
    assert sched.in_flight_count == 0


async def test_background_gives_way_before_an_app_is_paced() -> None:
    """Slow gaps cut the background cap first; the per-app cap stays while background
    sequences above the floor still run."""
    ctl, clock = paced(
        PacingRule(target_gap_s=0.02, interval_s=0.5, decrease=0.5, max_cap=8), app_pacing_floor=2
    )
    bg = [
        await ctl.admit(QueuedRequest(f"b{i}", "rag", "notes", clock(), 2, 10, 50))
        for i in range(4)
    ]
    chat = [
        await ctl.admit(QueuedRequest(f"c{i}", "chat", "chatui", clock(), 1, 10, 50))
        for i in range(4)
    ]
    for n in range(1, 6):
        chat[0].progress(n)
        clock.t += 0.04
    clock.t += 0.5
    ctl.tick()
    state = ctl.pacing_state()["w0"]
    assert state.background_cap == 2
    assert state.app_cap == 8  # background (4 running) is above its floor: it goes first
    for t in [*bg, *chat]:
        t.finish(10, 5)


async def test_late_shedding_measures_the_drain_rate_over_busy_time() -> None:
    """At start-up the class has finished only a few requests in the 30 s window; a rate
    over the whole window would make a short line look minutes long. Measured over the
    time the class was busy, and only after enough of them finished, nobody is refused
    for a line the worker drains within target."""
    clock = Clock()
    sched = Scheduler([ClassPolicy("rag", 2, ttft_s=3.0, shed_late=True)])
    snaps = [WorkerSnapshot("w0", limits=WorkerBudget(max_in_flight=1))]
    ctl = AdmissionController(sched, lambda: snaps, clock=clock)
    first = await ctl.admit(QueuedRequest("r0", "rag", "notes", clock(), 2, 10, 5))
    waiting = []
    for i in range(1, 9):  # 8 more, served one at a time, each 0.25 s
        waiting.append(
            asyncio.create_task(
                ctl.admit(QueuedRequest(f"r{i}", "rag", "notes", clock(), 2, 10, 5))
            )
        )
    await asyncio.sleep(0)
    running = first
    for task in waiting:
        clock.t += 0.25
        running.finish(10, 5)
        running = await asyncio.wait_for(task, 1)
    # 8 ends in 2 busy seconds: 4 per second. Over a 30 s window it would be 0.27/s, and
    # a request behind 2 others would be refused (7.5 s > 3 s).
    assert ctl.drain.measured_rate("rag", clock()) == pytest.approx(4.0)
    more = [
        asyncio.create_task(ctl.admit(QueuedRequest(f"s{i}", "rag", "notes", clock(), 2, 10, 5)))
        for i in range(3)
    ]
    await asyncio.sleep(0)
    assert not any(t.done() for t in more)  # all three queued, none refused
    for task in more:
        clock.t += 0.25
        running.finish(10, 5)
        running = await asyncio.wait_for(task, 1)
    running.finish(10, 5)


async def test_prefill_stalls_cut_the_prefill_duty_and_decode_gaps_the_cap() -> None:
    """A chat stream's slow gaps while a RAG prompt is in prefill cut the worker's prefill
    duty, not its decode cap; a closed duty holds the next RAG prompt while chat passes;
    slow gaps after every prefill ended cut the decode cap."""
    ctl, clock = paced(
        PacingRule(target_gap_s=0.015, interval_s=0.5, max_cap=8, prefill_gap_s=0.025)
    )
    rag = [
        await ctl.admit(QueuedRequest(f"b{i}", "rag", "notes", clock(), 2, 2000, 50))
        for i in range(3)
    ]
    for t in rag:
        t.expect_stream()
    chat = await ctl.admit(QueuedRequest("c0", "chat", "chatui", clock(), 1, 10, 50))
    chat.expect_stream()
    for n in range(1, 6):  # 200 ms gaps: RAG prompts are in prefill
        chat.progress(n)
        clock.t += 0.2
    ctl.tick()
    state = ctl.pacing_state()["w0"]
    assert state.background_cap == 8  # not the decode batch's doing
    assert state.prefill_duty == pytest.approx(0.7)
    assert state.token_gap_s is None
    assert [s.prefill_open for s in ctl.snapshots()] == [True]  # nothing charged yet
    first = await ctl.admit(QueuedRequest("b3", "rag", "notes", clock(), 2, 2000, 50))
    assert [s.prefill_open for s in ctl.snapshots()] == [False]  # 2000 tokens owed
    waiter = asyncio.create_task(
        ctl.admit(QueuedRequest("b4", "rag", "notes", clock(), 2, 2000, 50))
    )
    await queued(ctl, waiter)
    passing = await ctl.admit(QueuedRequest("c1", "chat", "chatui", clock(), 1, 10, 50))
    assert passing.worker == "w0"  # interactive is never held by the duty
    for t in [*rag, first, passing]:
        t.progress(1)  # every prompt's first token: prefill over
    clock.t += 0.01
    for n in range(6, 11):  # 30 ms decode gaps, no prefill in them
        chat.progress(n)
        clock.t += 0.03
    clock.t += 0.5
    ctl.tick()
    state = ctl.pacing_state()["w0"]
    assert state.background_cap == 2  # floor(4 background x 0.7)
    assert state.token_gap_s == pytest.approx(0.03)
    for t in [*rag, first]:
        t.finish(2000, 50)
    await asyncio.sleep(0)
    assert not waiter.done()  # a slot is free, but 2000 tokens at 0.7-0.49 x 4000 tok/s
    clock.t += 0.5  # ...are paid within 1.2 s of the charge
    ctl.tick()
    (await asyncio.wait_for(waiter, 1.0)).finish(2000, 50)
    chat.finish(10, 50)
    passing.finish(10, 50)


async def test_a_late_interactive_first_token_cuts_the_prefill_duty() -> None:
    """An interactive request whose first token took more than half its class's ttft on
    the worker cuts that worker's prefill duty at the next interval; a background one
    does not."""
    clock = Clock()
    sched = Scheduler(
        [
            ClassPolicy("chat", 1, interactive=True, ttft_s=0.5),
            ClassPolicy("rag", 2, interactive=False, ttft_s=0.5),
        ]
    )
    snaps = [WorkerSnapshot("w0")]
    rule = PacingRule(target_gap_s=0.015, interval_s=0.5, max_cap=8, prefill_gap_s=0.025)
    ctl = AdmissionController(sched, lambda: snaps, clock=clock, pacing=rule)
    rag = await ctl.admit(QueuedRequest("b0", "rag", "notes", clock(), 2, 2000, 50))
    clock.t += 0.4
    rag.first_token()  # 400 ms: late for its class, but background
    clock.t += 0.2
    ctl.tick()
    assert ctl.pacing_state() == {}  # nothing a pacer counts was seen yet
    chat = await ctl.admit(QueuedRequest("c0", "chat", "chatui", clock(), 1, 10, 50))
    clock.t += 0.3
    chat.first_token()  # 300 ms of a 500 ms target: late
    clock.t += 0.5  # one pacing interval after the pacer began with that observation
    ctl.tick()
    assert ctl.pacing_state()["w0"].prefill_duty == pytest.approx(0.7)
    rag.finish(2000, 50)
    chat.finish(10, 50)


@pytest.mark.parametrize(("behind_gap_s", "duty"), [(None, 0.7), (0.04, 1.0)])
async def test_background_waiting_past_half_its_target_loosens_the_prefill_duty(
    behind_gap_s: float | None, duty: float
) -> None:
    """Chat streams at 30 ms gaps (prefill pacing's target: 25 ms) while a RAG request has
    waited past half its 1 s target: the duty is cut, unless it may hold 40 ms while
    background is behind."""
    clock = Clock()
    sched = Scheduler(
        [
            ClassPolicy("chat", 1, interactive=True, ttft_s=0.5),
            ClassPolicy("rag", 2, interactive=False, ttft_s=1.0),
        ]
    )
    snaps = [WorkerSnapshot("w0", limits=WorkerBudget(max_in_flight=1))]
    rule = PacingRule(0.015, interval_s=0.5, prefill_gap_s=0.025, behind_gap_s=behind_gap_s)
    ctl = AdmissionController(sched, lambda: snaps, clock=clock, pacing=rule)
    chat = await ctl.admit(QueuedRequest("c0", "chat", "app", clock(), 1, 10, 50))
    chat.expect_stream()
    chat.first_token()
    rag = asyncio.create_task(ctl.admit(QueuedRequest("b0", "rag", "app", clock(), 2, 10, 50)))
    await queued(ctl, rag)
    for n in range(1, 20):
        clock.t += 0.03
        chat.progress(n)
    ctl.tick()
    assert ctl.pacing_state()["w0"].prefill_duty == pytest.approx(duty)
    chat.finish(10, 19)
    (await asyncio.wait_for(rag, 1.0)).finish(10, 5)


async def test_a_prompt_held_by_the_prefill_debt_goes_when_it_is_paid_not_at_a_tick() -> None:
    """The controller pumps again when a worker's prefill debt will be paid: the waiting
    RAG prompt is admitted with no tick (the ticker is not running here)."""
    ctl, clock = paced(
        PacingRule(target_gap_s=0.015, interval_s=0.5, max_cap=8, prefill_gap_s=0.025)
    )
    ctl.prefill_rates.initial = 40_000.0  # 2000 tokens at 0.7 of it: paid in 71 ms
    rag = await ctl.admit(QueuedRequest("b0", "rag", "notes", clock(), 2, 2000, 50))
    rag.expect_stream()
    chat = await ctl.admit(QueuedRequest("c0", "chat", "chatui", clock(), 1, 10, 50))
    chat.expect_stream()
    for n in range(1, 6):  # 200 ms gaps: the RAG prompt is in prefill
        chat.progress(n)
        clock.t += 0.2
    ctl.tick()
    assert ctl.pacing_state()["w0"].prefill_duty == pytest.approx(0.7)
    owed = await ctl.admit(QueuedRequest("b1", "rag", "notes", clock(), 2, 2000, 50))
    waiter = asyncio.create_task(
        ctl.admit(QueuedRequest("b2", "rag", "notes", clock(), 2, 2000, 50))
    )
    await queued(ctl, waiter)
    clock.t += 2000 / (0.7 * 40_000) * 1.01  # the debt is paid by now; no tick runs
    second = await asyncio.wait_for(waiter, 2.0)
    assert second.worker == "w0"
    for t in (rag, owed, second, chat):
        t.finish(2000, 50)
    await ctl.stop()
