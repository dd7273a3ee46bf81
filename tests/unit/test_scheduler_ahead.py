"""``Scheduler.ahead``: roughly how many queued requests go before one (for the queue
position an app can show)."""

from __future__ import annotations

from hearthgate.policies import Scheduler
from tests.unit.test_policies_support import BATCH, CHAT, RAG, req


def test_higher_classes_and_earlier_arrivals_of_its_class_count() -> None:
    sched = Scheduler([CHAT, RAG, BATCH])
    for rid, cls, t in [("r1", "rag", 0), ("b1", "batch", 1), ("r2", "rag", 2), ("c1", "chat", 3)]:
        assert sched.enqueue(req(rid, cls, arrival=t), t) is None
    assert sched.ahead("c1") == 0  # chat goes first whatever came before
    assert sched.ahead("r1") == 1  # behind c1
    assert sched.ahead("r2") == 2  # behind c1 and r1
    assert sched.ahead("b1") == 3
    assert sched.ahead("nope") is None
    sched.cancel("c1", 4)
    assert sched.ahead("r2") == 1
