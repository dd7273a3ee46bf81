"""One conformance suite over every registered policy (orderings and fair shares), alone
and inside the scheduler."""

from __future__ import annotations

import itertools
import random

import pytest

from hearthgate.policies import ClassPolicy, QueuedRequest, Scheduler, TenantPolicy
from hearthgate.policies.fairness import FAIR_SHARES, FairShareParams
from hearthgate.policies.ordering import ORDERINGS, OrderingPolicy
from tests.unit.test_policies_support import Engine, req, worker

CHAT = ClassPolicy("chat", 1, interactive=True, ttft_s=0.5)


def sample_requests(n: int = 30) -> list[QueuedRequest]:
    rng = random.Random(n)
    return [
        req(
            f"r{i:02d}",
            tenant=rng.choice("abc"),
            arrival=float(rng.randrange(5)),
            prompt=rng.randrange(1, 500),
            max_tokens=rng.randrange(0, 100),
            deadline=rng.choice([None, None, float(rng.randrange(5))]),
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("name", sorted(ORDERINGS))
def test_ordering_is_a_pure_total_order(name: str) -> None:
    policy: OrderingPolicy = ORDERINGS[name]
    assert policy.name == name
    requests = sample_requests()
    keys = [policy.sort_key(r, CHAT) for r in requests]
    assert keys == [policy.sort_key(r, CHAT) for r in requests]  # pure
    assert len(set(keys)) == len(keys)  # total: no two requests tie
    assert all(k[-1] == r.id for k, r in zip(keys, requests, strict=True))
    twin = req("zz", arrival=requests[0].arrival, deadline=requests[0].deadline)
    assert policy.sort_key(twin, CHAT) != policy.sort_key(requests[0], CHAT)
    shuffled = requests[:]
    random.Random(1).shuffle(shuffled)
    by_key = sorted(requests, key=lambda r: policy.sort_key(r, CHAT))
    assert sorted(shuffled, key=lambda r: policy.sort_key(r, CHAT)) == by_key


@pytest.mark.parametrize("name", sorted(FAIR_SHARES))
def test_fair_share_choice_ignores_mapping_order(name: str) -> None:
    fair = FAIR_SHARES[name](FairShareParams(weights={"b": 2.0}))
    heads = {t: req(f"{t}1", tenant=t, arrival=float(i % 2)) for i, t in enumerate("abcd")}
    for t in heads:
        fair.activate(t)
    fair.charge("a", 30, 0)
    fair.charge("c", 5, 5)
    answers = {fair.choose(dict(perm)) for perm in itertools.permutations(list(heads.items()))}
    assert len(answers) == 1 and answers.pop() in heads


@pytest.mark.parametrize("name", sorted(FAIR_SHARES))
def test_fair_share_withdraw_right_after_activate_leaves_no_trace(name: str) -> None:
    fair = FAIR_SHARES[name](FairShareParams())
    fair.activate("a")
    fair.charge("a", 100, 10)
    before = dict(fair.counters())
    for tenant in ("new", "b"):
        fair.activate(tenant)
        fair.withdraw(tenant)
        assert fair.counters() == before
    fair.charge("b", 1, 0)
    fair.activate("b")
    fair.withdraw("b")
    assert fair.counters() == {**before, "b": 1.0}


@pytest.mark.parametrize("name", sorted(FAIR_SHARES))
def test_fair_share_counters_account_weighted_service(name: str) -> None:
    fair = FAIR_SHARES[name](FairShareParams(w_in=1, w_out=2, weights={"b": 2.0}))
    for t in "ab":
        fair.activate(t)
    fair.charge("a", 10, 5)
    fair.charge("b", 10, 5)
    fair.charge("b", -2, 0)  # a correction
    counters = fair.counters()
    assert counters["a"] == 20.0  # 1 * 10 + 2 * 5
    assert counters["b"] == 9.0  # (20 - 2) / weight 2
    copy = fair.counters()
    assert isinstance(copy, dict)
    copy["a"] = -1.0
    assert fair.counters()["a"] != -1.0  # a copy, not the live state


@pytest.mark.parametrize(("share", "ordering"), list(itertools.product(FAIR_SHARES, ORDERINGS)))
def test_every_policy_pair_serves_everything_once_within_budgets(share: str, ordering: str) -> None:
    policy = ClassPolicy("chat", 1, ttft_s=0.5, fair_share=share, ordering=ordering)
    sched = Scheduler([policy, ClassPolicy("batch", 4)], [TenantPolicy("b", 2.0)])
    requests = sample_requests(60)
    for r in requests:
        sched.enqueue(r, r.arrival)
        sched.enqueue(req(f"bg-{r.id}", "batch", r.tenant, r.arrival, 50, 5), r.arrival)
    limit = worker(max_in_flight=3, prefill_token_budget=600, interactive_reserved_slots=1)
    engine = Engine(sched, [limit])
    for t in range(2000):
        engine.tick(float(t))
        usage = sched.worker_usage()["w0"]
        assert usage.in_flight <= 3
        assert usage.prefill_tokens <= 600 or usage.prefill_requests == 1
        if not sched.queued_count and not engine.jobs:
            break
    admitted = [a.request.id for _, a in engine.admitted]
    assert sorted(admitted) == sorted([r.id for r in requests] + [f"bg-{r.id}" for r in requests])
    assert sched.in_flight_count == 0
    assert sched.worker_usage()["w0"].prefill_tokens == 0
    # Inside one tenant, the ordering policy decides.
    key = ORDERINGS[ordering].sort_key
    by_id = {r.id: r for r in requests}
    for tenant in "abc":
        served = [by_id[i] for i in admitted if i in by_id and by_id[i].tenant == tenant]
        assert served == sorted(served, key=lambda r: key(r, policy))


@pytest.mark.parametrize("field", ["ordering", "fair_share"])
def test_unregistered_policy_names_are_rejected(field: str) -> None:
    bad = ClassPolicy("chat", 1, **{field: "nope"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown"):
        Scheduler([bad])
