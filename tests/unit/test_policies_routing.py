"""The router: filter by health, model and role; score by in-flight, scraped waiting and KV
usage; pick the best, ties by name; and how the scheduler uses it with the budgets."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hearthgate.policies import Scheduler, WorkerBudget, WorkerSnapshot
from hearthgate.policies.placement import place
from hearthgate.policies.routing import (
    RoutingPolicy,
    RoutingWeights,
    pick,
    rank,
    request_kind,
    route,
    scores,
)
from hearthgate.policies.types import QueuedRequest
from tests.unit.test_policies_support import CLASSES, req

POLICY = RoutingPolicy(long_prefill_min_tokens=1000)


def w(
    name: str,
    role: str = "general",
    *,
    healthy: bool = True,
    waiting: float | None = 0.0,
    kv: float | None = 0.0,
    **limits: Any,
) -> WorkerSnapshot:
    return WorkerSnapshot(name, healthy, WorkerBudget(**limits), waiting, kv, role=role)


def r(
    id: str = "r",
    prompt: int = 10,
    endpoint: str | None = "chat",
    workers: frozenset[str] | None = None,
    cls: str = "chat",
    arrival: float = 0.0,
) -> QueuedRequest:
    return replace(req(id, cls, arrival=arrival, prompt=prompt), endpoint=endpoint, workers=workers)


# ------------------------------------------------------------------------------- filter


def test_short_requests_go_to_general_workers_only() -> None:
    ws = [w("gen"), w("lp", "long_prefill"), w("emb", "embeddings")]
    assert route(ws, r(prompt=10), POLICY) == {"gen"}
    assert route(ws, r(prompt=999), POLICY) == {"gen"}


def test_long_prompts_go_to_a_long_prefill_worker_from_the_threshold() -> None:
    ws = [w("gen"), w("lp", "long_prefill"), w("lp2", "long_prefill")]
    assert route(ws, r(prompt=1000), POLICY) == {"lp", "lp2"}
    assert request_kind(r(prompt=1000), POLICY) == "long"
    assert request_kind(r(prompt=999), POLICY) == "short"


def test_long_prompts_stay_on_general_when_no_long_prefill_worker_is_healthy() -> None:
    ws = [w("gen"), w("lp", "long_prefill", healthy=False)]
    assert route(ws, r(prompt=5000), POLICY) == {"gen"}
    assert route([w("gen")], r(prompt=5000), POLICY) == {"gen"}  # none configured


def test_long_prefill_workers_serve_everything_when_no_general_one_is_healthy() -> None:
    ws = [w("gen", healthy=False), w("lp", "long_prefill")]
    assert route(ws, r(prompt=10), POLICY) == {"lp"}
    assert route([w("lp", "long_prefill")], r(prompt=10), POLICY) == {"lp"}


def test_no_threshold_means_nothing_is_long() -> None:
    ws = [w("gen"), w("lp", "long_prefill")]
    assert route(ws, r(prompt=10**6), RoutingPolicy()) == {"gen"}


def test_embeddings_go_to_an_embeddings_worker_when_one_is_healthy() -> None:
    ws = [w("gen"), w("emb", "embeddings"), w("emb2", "embeddings", healthy=False)]
    assert route(ws, r(endpoint="embeddings", prompt=5000), POLICY) == {"emb"}
    # None healthy: a general worker that serves the model takes them.
    ws = [w("gen"), w("emb", "embeddings", healthy=False)]
    assert route(ws, r(endpoint="embeddings"), POLICY) == {"gen"}


def test_only_workers_serving_the_model_count() -> None:
    ws = [w("gen"), w("gen2"), w("lp", "long_prefill")]
    assert route(ws, r(workers=frozenset({"gen2", "lp"})), POLICY) == {"gen2"}
    # The long-prefill worker does not serve it: a general one does the long prompt.
    assert route(ws, r(prompt=2000, workers=frozenset({"gen"})), POLICY) == {"gen"}
    assert route(ws, r(workers=frozenset({"elsewhere"})), POLICY) == frozenset()


def test_all_workers_down_gives_nothing() -> None:
    ws = [w("gen", healthy=False), w("lp", "long_prefill", healthy=False)]
    assert route(ws, r(), POLICY) == frozenset()
    assert route(ws, r(prompt=5000), POLICY) == frozenset()
    assert pick(ws, r(), {}, POLICY) is None
    assert pick([], r(), {}, POLICY) is None


# -------------------------------------------------------------------------------- score


def test_fewest_in_flight_wins_when_gauges_agree() -> None:
    ws = [w("a"), w("b"), w("c")]
    assert rank(ws, {"a": 4, "b": 1, "c": 2}) == ["b", "c", "a"]
    assert scores(ws, {"a": 4, "b": 0, "c": 2}) == {"a": 1.0, "b": 0.0, "c": 0.5}


def test_scraped_waiting_and_kv_usage_count() -> None:
    ws = [w("a", waiting=5, kv=0.1), w("b", waiting=1, kv=0.1)]
    assert rank(ws, {}) == ["b", "a"]
    assert scores(ws, {}) == pytest.approx({"a": 1.1, "b": 0.3})
    ws = [w("a", waiting=0, kv=0.9), w("b", waiting=0, kv=0.2)]
    assert rank(ws, {}) == ["b", "a"]


def test_weights_scale_the_terms() -> None:
    ws = [w("a", waiting=10, kv=0.0), w("b", waiting=0, kv=0.0)]
    in_flight = {"a": 0, "b": 3}
    only_flight = RoutingPolicy(weights=RoutingWeights(in_flight=1, waiting=0, kv=0))
    only_waiting = RoutingPolicy(weights=RoutingWeights(in_flight=0, waiting=1, kv=0))
    assert rank(ws, in_flight, only_flight) == ["a", "b"]
    assert rank(ws, in_flight, only_waiting) == ["b", "a"]
    heavy = RoutingPolicy(weights=RoutingWeights(in_flight=3, waiting=1, kv=0))
    assert rank(ws, in_flight, heavy) == ["a", "b"]


def test_stale_metrics_are_unknown_not_idle() -> None:
    # "a" has no fresh gauges; "b" reports a fairly busy worker: still preferred over unknown.
    ws = [w("a", waiting=None, kv=None), w("b", waiting=3, kv=0.6)]
    assert rank(ws, {}) == ["b", "a"]
    s = scores(ws, {})
    assert s["a"] == pytest.approx(2.0) and s["b"] == pytest.approx(1.6)
    # A neutral setting makes unknown count as half-loaded instead.
    neutral = RoutingPolicy(unknown_load=0.5)
    assert scores(ws, {}, neutral)["a"] == pytest.approx(1.0)
    # Garbage gauges (NaN, negative) are unknown as well.
    assert scores([w("x", waiting=float("nan"), kv=-1.0)], {}) == {"x": 2.0}


def test_without_any_gauges_in_flight_decides() -> None:
    ws = [w("a", waiting=None, kv=None), w("b", waiting=None, kv=None)]
    assert rank(ws, {"a": 2, "b": 1}) == ["b", "a"]


def test_ties_are_broken_by_name_whatever_the_order() -> None:
    ws = [w("b"), w("c"), w("a")]
    assert rank(ws, {}) == ["a", "b", "c"]
    assert rank(list(reversed(ws)), {}) == ["a", "b", "c"]
    assert pick(ws, r(), {}, POLICY) == "a"


@given(
    st.lists(
        st.tuples(
            st.integers(0, 50),
            st.one_of(st.none(), st.floats(0, 100)),
            st.one_of(st.none(), st.floats(0, 1)),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_scores_are_bounded_and_order_independent(
    rows: list[tuple[int, float | None, float | None]],
) -> None:
    ws = [w(f"w{i}", waiting=wait, kv=kv) for i, (_, wait, kv) in enumerate(rows)]
    flights = {f"w{i}": n for i, (n, _, _) in enumerate(rows)}
    s = scores(ws, flights)
    assert all(0.0 <= v <= 3.0 for v in s.values())
    assert rank(ws, flights) == rank(list(reversed(ws)), flights)


def test_policy_values_are_checked() -> None:
    with pytest.raises(ValueError, match="weight"):
        RoutingWeights(in_flight=-1)
    with pytest.raises(ValueError, match="long_prefill_min_tokens"):
        RoutingPolicy(long_prefill_min_tokens=0)
    with pytest.raises(ValueError, match="unknown_load"):
        RoutingPolicy(unknown_load=2)


# ------------------------------------------------------------------- with the budgets


def test_placement_takes_the_best_scoring_worker_that_fits() -> None:
    ws = [w("a", waiting=0, max_in_flight=1), w("b", waiting=4)]
    sched = Scheduler(CLASSES)
    for i in range(2):
        sched.enqueue(r(f"c{i}", arrival=i), 0.0)
    # "a" scores best; once it is full, the budgets send the next one to "b".
    got = [(a.request.id, a.worker) for a in sched.admit(0.0, ws)]
    assert got == [("c0", "a"), ("c1", "b")]
    usage = sched.worker_usage()
    assert place(ws, usage, "chat", True, 10).worker == "b"
    assert place(ws, usage, "chat", True, 10, frozenset({"a"})).worker is None


def test_scheduler_routes_by_role_and_a_busy_long_prefill_worker_holds_only_itself() -> None:
    sched = Scheduler(CLASSES, routing=POLICY)
    ws = [w("gen"), w("lp", "long_prefill", max_in_flight=1)]
    sched.enqueue(r("long0", prompt=2000, cls="rag", arrival=0), 0.0)
    sched.enqueue(r("long1", prompt=2000, cls="rag", arrival=1), 0.0)
    sched.enqueue(r("short", prompt=20, cls="rag", arrival=2), 0.0)
    got = [(a.request.id, a.worker) for a in sched.admit(0.0, ws)]
    # long1 waits for the busy long-prefill worker instead of spilling onto "gen", and
    # does not keep the short request off "gen".
    assert got == [("long0", "lp"), ("short", "gen")]
    assert sched.is_queued("long1")
    # The long-prefill worker goes down: the waiting long prompt moves to "gen".
    ws_down = [w("gen"), w("lp", "long_prefill", healthy=False, max_in_flight=1)]
    assert [(a.request.id, a.worker) for a in sched.admit(0.1, ws_down)] == [("long1", "gen")]


def test_scheduler_sends_embeddings_to_the_embeddings_worker() -> None:
    sched = Scheduler(CLASSES, routing=POLICY)
    ws = [w("gen"), w("emb", "embeddings")]
    sched.enqueue(r("e0", endpoint="embeddings", cls="embed"), 0.0)
    sched.enqueue(r("c0", arrival=1), 0.0)
    got = [(a.request.id, a.worker) for a in sched.admit(0.0, ws)]
    assert sorted(got) == [("c0", "gen"), ("e0", "emb")]


def test_failover_request_excludes_the_failed_worker() -> None:
    # dispatch.dispatch re-queues a failed request with the failed worker left out of
    # ``workers``; the router then picks among the rest, even across roles.
    sched = Scheduler(CLASSES, routing=POLICY)
    ws = [w("gen"), w("gen2"), w("lp", "long_prefill")]
    sched.enqueue(r("retry", workers=frozenset({"gen2", "lp"})), 0.0)
    assert [a.worker for a in sched.admit(0.0, ws)] == ["gen2"]
    sched.enqueue(r("retry2", workers=frozenset({"lp"})), 0.0)
    assert [a.worker for a in sched.admit(0.0, ws)] == ["lp"]
