"""Background completions waiting in their queue are released together in one dispatch
round when capacity frees, as many as the prefill budget takes, so vLLM prefills them in
the same iterations. (The scheduler's ``admit`` admits while anything fits, and the
admission controller's ``pump`` wakes every admitted waiter in that one call.)"""

from __future__ import annotations

import asyncio

from hearthgate.gateway.admission import AdmissionController
from hearthgate.policies.scheduler import Scheduler
from hearthgate.policies.types import ClassPolicy, QueuedRequest, WorkerBudget, WorkerSnapshot
from tests.inprocess import until


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


LIMITS = WorkerBudget(max_in_flight=16, prefill_token_budget=1000, max_scraped_waiting=0)


async def test_queued_batch_requests_are_released_in_one_round_within_the_prefill_budget() -> None:
    clock = Clock()
    sched = Scheduler([ClassPolicy("batch", 4)])
    snaps = [WorkerSnapshot("w0", limits=LIMITS, scraped_waiting=3)]  # saturated: all wait
    ctl = AdmissionController(sched, lambda: snaps, clock=clock)
    reqs = [QueuedRequest(f"b{i}", "batch", "app", clock(), 4, 300, 64) for i in range(6)]
    waiters = [asyncio.create_task(ctl.admit(r)) for r in reqs]
    await until(lambda: ctl.waiting == 6 or any(w.done() for w in waiters))
    assert sched.queued_count == 6 and sched.in_flight_count == 0

    snaps[0] = WorkerSnapshot("w0", limits=LIMITS, scraped_waiting=0)  # capacity frees
    ctl.pump()  # one round
    # Three prompts of 300 tokens fit the 1000-token prefill budget: all three go at once.
    assert sched.in_flight_count == 3
    assert sched.worker_usage()["w0"].prefill_tokens == 900
    await until(lambda: sum(w.done() for w in waiters) >= 3)  # the woken waiters return
    done = [w for w in waiters if w.done()]
    assert sorted(w.result().request.id for w in done) == ["b0", "b1", "b2"]

    # As their first tokens free the budget, the rest follow within it.
    for w in done:
        w.result().first_token()
    assert sched.in_flight_count == 6 and sched.queued_count == 0
    tickets = await asyncio.gather(*waiters)
    for t in tickets:
        t.finish(300, 64)
    assert sched.in_flight_count == 0
