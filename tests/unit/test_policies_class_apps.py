"""Which apps share a class lately, and the per-app cap that holds only an app sharing one."""

from __future__ import annotations

from dataclasses import replace

from hearthgate.policies import ClassPolicy, Scheduler
from hearthgate.policies.class_apps import SHARING_WINDOW_S, ClassApps
from tests.unit.test_policies_support import classes, req, worker


def test_an_app_shares_a_class_while_another_app_sent_one_within_the_window() -> None:
    seen = ClassApps(window_s=10.0)
    assert not seen.shared("chat", "chatui", 0.0)  # nobody yet
    seen.arrived("chat", "chatui", 0.0)
    assert not seen.shared("chat", "chatui", 1.0)  # only itself
    seen.arrived("voice", "assistant", 1.0)
    assert not seen.shared("chat", "chatui", 1.0)  # another class does not count
    seen.arrived("chat", "scraper", 2.0)
    assert seen.shared("chat", "chatui", 2.0) and seen.shared("chat", "scraper", 2.0)
    assert seen.shared("chat", "chatui", 12.0)  # the scraper's last request 10 s ago
    assert not seen.shared("chat", "chatui", 12.1)  # forgotten past the window
    assert seen.shared("chat", "scraper", 12.1) is False  # ...and chatui's too (0.0)


def _scheduler() -> Scheduler:
    return Scheduler(classes(ClassPolicy("chat", 1, interactive=True, fair_share="fcfs")))


def test_an_app_alone_in_its_class_is_not_held_to_the_per_app_cap() -> None:
    """rag-burst: the chat UI, the only chat app, was held at a cap an earlier slow
    interval set and its turns queued in the gateway; nobody gained from it."""
    sched = _scheduler()
    w = [replace(worker(), app_cap=2)]
    for i in range(4):
        sched.enqueue(req(f"c{i}", "chat", tenant="chatui", arrival=i * 0.1), i * 0.1)
    assert [a.request.id for a in sched.admit(0.5, w)] == ["c0", "c1", "c2", "c3"]


def test_the_cap_holds_the_heavy_app_while_another_shares_the_class_and_lifts_after() -> None:
    sched = _scheduler()
    w = [replace(worker(), app_cap=2)]
    sched.enqueue(req("c0", "chat", tenant="chatui", arrival=0.0), 0.0)
    assert [a.request.id for a in sched.admit(0.0, w)] == ["c0"]
    sched.on_finish("c0", None, None, 0.2)
    for i in range(4):
        sched.enqueue(req(f"s{i}", "chat", tenant="scraper", arrival=1 + i), 1.0 + i * 0.1)
    assert [a.request.id for a in sched.admit(1.5, w)] == ["s0", "s1"]  # held at 2
    late = SHARING_WINDOW_S + 0.5  # the chat UI's one request is past the window now
    assert [a.request.id for a in sched.admit(late, w)] == ["s2", "s3"]


def test_a_lone_app_still_has_its_flood_limit_of_prompts_in_prefill() -> None:
    """The flood limit keeps one app's long prompts from queueing in vLLM ahead of other
    classes' prompts; it is not the cap, and holds whoever shares the class."""
    sched = _scheduler()
    w = [replace(worker(), app_cap=16, flood_at=2, flood_prefill=1)]
    for i in range(3):
        sched.enqueue(req(f"s{i}", "chat", tenant="scraper", arrival=i), 0.0)
    assert [a.request.id for a in sched.admit(0.0, w)] == ["s0", "s1"]  # 2nd makes it a flood
    sched.on_first_token("s0", 0.1)
    sched.on_first_token("s1", 0.1)
    assert [a.request.id for a in sched.admit(0.2, w)] == ["s2"]
