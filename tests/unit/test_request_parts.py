"""The small parts of the request path on plain values: failover steps, bounded estimators,
prompt-token counting over every prompt field, class choice, metrics scraping that one bad
page cannot freeze, JSON limits."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hearthgate.gateway.errors import BadRequest
from hearthgate.gateway.metrics import GatewayMetrics
from hearthgate.gateway.parse import decode_json, json_depth, parse_body
from hearthgate.gateway.settings import Health, Settings, Worker
from hearthgate.gateway.tokens import HeuristicCounter, prompt_chars
from hearthgate.gateway.workers import WorkerPool
from hearthgate.policies.estimators import DrainRate
from hearthgate.policies.failover import Failure, GiveUp, Retry, next_step
from tests.inprocess import FakeResponse, FakeUpstream
from tests.unit.test_workers import PAGE

# ------------------------------------------------------------------ failover

AB = [("a", True), ("b", True)]


def test_failover_goes_to_a_healthy_worker_that_has_not_failed() -> None:
    assert next_step(AB, frozenset({"a"}), Failure.REFUSED, 1) == Retry(frozenset({"b"}))
    assert next_step(AB, frozenset({"a"}), Failure.SILENT, 1) == Retry(frozenset({"b"}))
    down_b = [("a", True), ("b", False)]
    assert next_step(down_b, frozenset({"a"}), Failure.LOST, 1) == GiveUp(pass_answer=False)


def test_a_dropped_connection_is_worth_one_more_try_on_the_same_workers() -> None:
    alone = [("a", True)]
    assert next_step(alone, frozenset({"a"}), Failure.DROPPED, 1) == Retry(frozenset({"a"}))
    assert next_step(alone, frozenset({"a"}), Failure.DROPPED, 3) == GiveUp(pass_answer=False)
    assert next_step(alone, frozenset({"a"}), Failure.REFUSED, 1) == GiveUp(pass_answer=False)


def test_a_worker_error_answer_is_passed_on_when_nobody_else_can_take_it() -> None:
    alone = [("a", True)]
    assert next_step(alone, frozenset({"a"}), Failure.ERROR_ANSWER, 1) == GiveUp(True)
    assert next_step(AB, frozenset({"a"}), Failure.ERROR_ANSWER, 1) == Retry(frozenset({"b"}))
    assert next_step(AB, frozenset({"a", "b"}), Failure.ERROR_ANSWER, 2) == GiveUp(True)


# ------------------------------------------------------------------ estimators


def test_drain_rate_memory_stays_bounded_for_a_class_that_never_sheds() -> None:
    d = DrainRate(window_s=10, max_events=1000)
    for i in range(100_000):
        d.record("chat", i * 0.001)  # 1000 ends per second, never asked for a rate
    assert d.held("chat") <= 1000
    assert d.rate("chat", 100.0) == pytest.approx(100.0, rel=0.01)  # 1000 kept / 10 s
    d2 = DrainRate(window_s=1, max_events=10**6)
    for i in range(5000):
        d2.record("rag", float(i))  # one per second: only the window is kept
    assert d2.held("rag") <= 2


# ------------------------------------------------------------------ prompt tokens


def _parsed(endpoint: str, **body: Any) -> Any:
    return parse_body(json.dumps({"model": "m", **body}).encode(), endpoint)


def test_every_prompt_field_counts() -> None:
    msgs = [{"role": "user", "content": "abcd"}]
    plain = prompt_chars(_parsed("chat", messages=msgs))[0]
    tools = [{"type": "function", "function": {"name": "f", "description": "x" * 400}}]
    assert prompt_chars(_parsed("chat", messages=msgs, tools=tools))[0] > plain + 400
    docs = [{"title": "t", "text": "y" * 300}]
    assert prompt_chars(_parsed("chat", messages=msgs, documents=docs))[0] > plain + 300
    call = [
        {"role": "assistant", "tool_calls": [{"function": {"arguments": "z" * 200}}]},
        {"role": "tool", "content": "w" * 100, "name": "lookup"},
    ]
    assert prompt_chars(_parsed("chat", messages=msgs + call))[0] >= plain + 300
    assert prompt_chars(_parsed("completions", prompt="ab", suffix="c" * 50))[0] == 52


def test_embeddings_inputs_count_at_least_one_token_each() -> None:
    counter = HeuristicCounter(Settings(workers=[_worker()]).tokens)
    assert counter.estimate(_parsed("embeddings", input=[""] * 100)) == 100
    assert counter.estimate(_parsed("embeddings", input="abcdefgh")) == 3  # 2 + 1


def _worker() -> dict[str, Any]:
    return {"name": "w", "url": "http://w", "models": ["m"]}


# ------------------------------------------------------------------ class choice


def test_an_app_may_choose_only_its_listed_classes_or_lower_bands() -> None:
    s = Settings(
        workers=[_worker()],
        apps=[
            {"name": "notes", "default_class": "rag", "may_choose_class": True},
            {"name": "bot", "may_choose_class": ["chat", "batch"]},
            {"name": "tv"},
        ],
    )
    notes, bot, tv = s.apps
    assert s.choosable_classes(notes) == ["rag", "embed", "batch"]  # never voice or chat
    assert s.choosable_classes(bot) == ["chat", "batch"]
    assert s.choosable_classes(tv) == []
    with pytest.raises(ValueError, match="may_choose_class: unknown class 'vip'"):
        Settings(workers=[_worker()], apps=[{"name": "x", "may_choose_class": ["vip"]}])


# ------------------------------------------------------------------ scraping


async def test_one_malformed_metrics_page_does_not_freeze_the_other_workers() -> None:
    async def nothing(worker: str, path: str, body: dict[str, Any]) -> FakeResponse:
        return FakeResponse()

    client = FakeUpstream(
        nothing,
        metrics_page={"good": PAGE.encode(), "bad": b"vllm:num_requests_waiting{ 1 2 3\n\xff"},
    )
    specs = [
        Worker(name="bad", url="http://bad", models=["m"]),
        Worker(name="good", url="http://good", models=["m"]),
    ]
    pool = WorkerPool(specs, Health(), GatewayMetrics(["m"]))
    await pool.check_all(client)
    assert pool.by_name["good"].scraped_waiting == 3.0
    assert pool.by_name["bad"].scraped_waiting is None
    assert all(w.up for w in pool.workers)


# ------------------------------------------------------------------ JSON limits


def test_json_limits() -> None:
    assert json_depth({"a": [1, {"b": []}]}) == 4
    assert json_depth(5) == 0
    with pytest.raises(BadRequest, match="deeper than 8"):
        decode_json(b"[" * 9 + b"]" * 9, max_depth=8)
    with pytest.raises(BadRequest, match="deeper"):
        decode_json(b"[" * 100_000)
    with pytest.raises(BadRequest, match="not valid JSON"):
        decode_json(b'{"n": ' + b"1" * 10_000 + b"}")
    with pytest.raises(BadRequest, match="not valid JSON"):
        decode_json(b'{"n": Infinity}')
    assert decode_json(b'{"n": [1, 2]}') == {"n": [1, 2]}


def test_drain_rate_counts_only_the_time_a_class_was_busy() -> None:
    """A class that comes in bursts drains as fast as it is served while it has work: the
    idle time before a burst (or before the first request after a start) does not make it
    look slower. Without busy periods reported, the whole window counts."""
    d = DrainRate(window_s=30)
    d.busy("rag", 20.0, True)
    for i in range(10):
        d.record("rag", 20.5 + i * 0.5)  # 2 per second for 5 s
    d.busy("rag", 25.0, False)
    assert d.rate("rag", 25.0) == pytest.approx(2.0)
    assert d.rate("rag", 40.0) == pytest.approx(2.0)  # idle since: still 2 while busy
    plain = DrainRate(window_s=30)
    for i in range(10):
        plain.record("rag", 20.5 + i * 0.5)
    assert plain.rate("rag", 25.0) == pytest.approx(10 / 30)


def test_drain_rate_is_not_measured_before_enough_ends() -> None:
    d = DrainRate(window_s=30, min_ends=8)
    d.busy("rag", 0.0, True)
    for i in range(7):
        d.record("rag", 1.0 + i)
    assert d.rate("rag", 8.0) > 0
    assert d.measured_rate("rag", 8.0) == 0.0  # 7 ends: too few to refuse anyone on
    d.record("rag", 8.0)
    assert d.measured_rate("rag", 8.0) == pytest.approx(1.0)


def test_a_class_busy_without_a_break_is_measured_from_few_ends() -> None:
    """RAG on a slow box finishes fewer than min_ends a window: once it has had work for
    min_busy_s without a break, what it finished is its rate; busy for less (start-up, a
    burst's first seconds) it is not measured yet."""
    d = DrainRate(window_s=30, min_ends=8, min_busy_s=10)
    d.busy("rag", 0.0, True)
    for t in (3.0, 6.0, 9.0):
        d.record("rag", t)
    assert d.measured_rate("rag", 9.5) == 0.0  # busy 9.5 s
    assert d.measured_rate("rag", 10.0) == pytest.approx(3 / 10)
    gap = DrainRate(window_s=30, min_ends=8, min_busy_s=10)
    gap.busy("rag", 0.0, True)
    gap.busy("rag", 8.0, False)
    gap.busy("rag", 9.0, True)
    for t in (3.0, 6.0, 12.0):
        gap.record("rag", t)
    assert gap.measured_rate("rag", 15.0) == 0.0  # busy again only since 9 s


def test_busy_periods_leave_the_window_and_stay_bounded() -> None:
    d = DrainRate(window_s=10, max_events=100)
    for i in range(10_000):  # short busy periods, one a second
        d.busy("rag", float(i), True)
        d.record("rag", i + 0.5)
        d.busy("rag", i + 0.5, False)
    assert len(d._periods["rag"]) <= 11
    assert d.rate("rag", 10_000.0) == pytest.approx(10 / 5.0)  # 10 ends in 5 busy seconds


def test_busy_seconds_kept_as_a_running_sum_match_a_recount() -> None:
    # Thousands of short busy periods (one per embeddings request): the window's busy time
    # is a running sum, checked against summing the periods again at every step.
    import random

    rnd = random.Random(5)
    d = DrainRate(window_s=3.0, max_events=50)
    periods: list[tuple[float, float]] = []
    now, since = 0.0, None
    for _ in range(3000):
        now += rnd.expovariate(40.0)
        active = rnd.random() < 0.5
        d.busy("embed", now, active)
        if active and since is None:
            since = now
        elif not active and since is not None:
            periods.append((since, now))
            since = None
        lo = now - 3.0
        kept = [p for p in periods[-50:] if p[1] > lo]
        expect = sum(e - max(s, lo) for s, e in kept)
        if since is not None:
            expect += now - max(since, lo)
        assert d._busy_seconds("embed", now) == pytest.approx(expect, abs=1e-9)
