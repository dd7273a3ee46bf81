"""Priority bands, work conservation and the starvation guard (min_share, max_wait)."""

from __future__ import annotations

from hearthgate.policies import ClassPolicy, Scheduler
from hearthgate.policies.bands import Backlog, precedence
from tests.unit.test_policies_support import (
    BATCH,
    CHAT,
    CLASSES,
    RAG,
    VOICE,
    Engine,
    classes,
    req,
    with_,
    worker,
)


def drain_one_at_a_time(sched: Scheduler) -> list[str]:
    order = []
    w = [worker(max_in_flight=1)]
    while admitted := sched.admit(1.0, w):
        (a,) = admitted
        order.append(a.request.cls)
        assert sched.on_finish(a.request.id, None, None, 1.0)
    return order


def test_higher_band_dispatches_first() -> None:
    sched = Scheduler(CLASSES)
    for i, c in enumerate(reversed(CLASSES)):
        assert sched.enqueue(req(f"r{i}", c.name, arrival=float(i)), 0.0) is None
    assert drain_one_at_a_time(sched) == ["voice", "chat", "rag", "embed", "batch"]


def test_equal_priorities_break_ties_by_class_name() -> None:
    sched = Scheduler([ClassPolicy("b", 1), ClassPolicy("a", 1), ClassPolicy("c", 0)])
    for name in "abc":
        sched.enqueue(req(name, name), 0.0)
    assert drain_one_at_a_time(sched) == ["c", "a", "b"]


def test_top_band_at_its_own_cap_lets_lower_bands_go() -> None:
    sched = Scheduler(CLASSES)
    for i in range(3):
        sched.enqueue(req(f"v{i}", "voice", arrival=i), 0.0)
    sched.enqueue(req("c0", "chat"), 0.0)
    sched.enqueue(req("b0", "batch"), 0.0)
    w = [worker(max_in_flight=8, max_in_flight_per_class={"voice": 1})]
    got = [a.request.id for a in sched.admit(0.0, w)]
    assert got == ["v0", "c0", "b0"]  # v1, v2 wait for voice's own cap only
    assert sched.queue_stats()["voice"].depth == 2


def test_lower_bands_never_take_the_interactive_reserve() -> None:
    sched = Scheduler(CLASSES)
    for i in range(4):
        sched.enqueue(req(f"g{i}", "rag", arrival=i), 0.0)
    w = [worker(max_in_flight=3, interactive_reserved_slots=1)]
    assert [a.request.id for a in sched.admit(0.0, w)] == ["g0", "g1"]
    sched.enqueue(req("v0", "voice", arrival=1.0), 1.0)
    assert [a.request.id for a in sched.admit(1.0, w)] == ["v0"]
    assert sched.admit(1.0, w) == []


def test_precedence_overdue_then_under_share_then_band() -> None:
    def b(c: ClassPolicy, oldest: float, share: float | None = None) -> Backlog:
        return Backlog(c, oldest, share)

    late_rag = with_(RAG, max_wait_s=5.0)
    late_batch = with_(BATCH, max_wait_s=2.0)
    short_embed = ClassPolicy("embed", 3, min_share=0.5)
    backlogs = [
        b(VOICE, 9.0),
        b(CHAT, 9.0),
        b(late_rag, 0.0),  # past its max wait since t=5
        b(short_embed, 9.0, 0.1),
        b(late_batch, 2.0),  # past its max wait since t=4: longest overdue
    ]
    assert precedence(backlogs, 10.0) == ["batch", "rag", "embed", "voice", "chat"]
    # Before anyone is overdue and with embed at its share, plain band order.
    backlogs[3] = b(short_embed, 9.0, 0.5)
    assert precedence(backlogs, 3.0) == ["voice", "chat", "rag", "embed", "batch"]


def share_of_batch(min_share: float | None) -> tuple[float, int]:
    sched = Scheduler(classes(with_(BATCH, min_share=min_share)))
    for i in range(400):
        sched.enqueue(req(f"c{i:03d}", "chat", "app", 0.0, 40, 10), 0.0)
        sched.enqueue(req(f"b{i:03d}", "batch", "job", 0.0, 40, 10), 0.0)
    engine = Engine(sched, [worker(max_in_flight=2)])
    for t in range(300):
        engine.tick(float(t))
    stats = sched.queue_stats()
    assert stats["chat"].depth > 0 and stats["batch"].depth > 0  # both stayed backlogged
    total = stats["chat"].dispatched_tokens + stats["batch"].dispatched_tokens
    return stats["batch"].dispatched_tokens / total, total


def test_min_share_prevents_starvation() -> None:
    assert share_of_batch(None)[0] == 0.0  # the control: chat alone would starve batch
    share, total = share_of_batch(0.2)
    assert abs(share - 0.2) <= 50 / total  # held at the floor, within one request


def rag_waits(max_wait_s: float | None) -> list[float]:
    sched = Scheduler(classes(with_(RAG, max_wait_s=max_wait_s)))
    engine = Engine(sched, [worker(max_in_flight=2)])
    arrivals: dict[str, float] = {}
    for t in range(400):
        now = float(t)
        for k in range(2):  # twice what the worker can serve
            sched.enqueue(req(f"c{t:03d}-{k}", "chat", "app", now, 20, 10), now)
        if t % 25 == 0 and t < 300:
            arrivals[f"g{t:03d}"] = now
            sched.enqueue(req(f"g{t:03d}", "rag", "notes", now, 200, 10), now)
        engine.tick(now)
    return [at - arrivals[a.request.id] for at, a in engine.admitted if a.request.cls == "rag"]


def test_max_wait_prevents_starvation() -> None:
    assert rag_waits(None) == []  # the control: chat alone would starve rag
    waits = rag_waits(5.0)
    assert len(waits) == 12
    assert max(waits) <= 5.0 + 11  # max wait plus one job's length (a slot frees)


def test_overdue_classes_take_turns_longest_overdue_first() -> None:
    sched = Scheduler(classes(with_(RAG, max_wait_s=3.0), with_(BATCH, max_wait_s=3.0)))
    engine = Engine(sched, [worker(max_in_flight=1)])
    for t in range(300):
        now = float(t)
        sched.enqueue(req(f"c{t:03d}", "chat", "app", now, 5, 2), now)
        if t % 10 == 0 and t < 200:
            sched.enqueue(req(f"g{t:03d}", "rag", "notes", now, 5, 2), now)
            sched.enqueue(req(f"b{t:03d}", "batch", "night", now, 5, 2), now)
        engine.tick(now)
    served = [a.request.cls for _, a in engine.admitted]
    assert served.count("rag") == 20 and served.count("batch") == 20
