"""The queue of one request class: per-tenant ordered queues under one fair-share policy."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Container, Iterator, Mapping
from typing import Protocol, runtime_checkable

from hearthgate.policies.fairness.base import FairShare, FairShareParams
from hearthgate.policies.ordering.base import OrderingPolicy, SortKey
from hearthgate.policies.shedding import is_expired
from hearthgate.policies.types import ClassPolicy, QueuedRequest


@runtime_checkable
class RestorableFairShare(Protocol):
    """A fair-share policy whose state survives a restart (``Vtc``, ``FcfsShare``); any
    other policy starts afresh after ``ClassQueue.restore_fairness``."""

    def snapshot(self) -> dict[str, float]:
        """Plain data for ``restore``: tenant -> a finite value >= 0."""
        ...

    def restore(self, state: Mapping[str, float]) -> None:
        """Replace the state with a ``snapshot`` (values finite and >= 0); nobody may be
        backlogged."""
        ...


def _arrival_key(req: QueuedRequest) -> tuple[float, str]:
    return (req.arrival, req.id)


class ClassQueue:
    """Queued requests of one class.

    Each backlogged tenant has a list sorted by the ordering policy; ``fair`` picks the
    tenant. A second list sorted by (arrival, id) answers "oldest" and "expired" cheaply.
    Only backlogged tenants have an entry, so the tenant map holds no trace of past ones.
    """

    def __init__(self, policy: ClassPolicy, ordering: OrderingPolicy, fair: FairShare) -> None:
        self.policy = policy
        self._ordering = ordering
        self._fair = fair
        self._tenants: dict[str, list[QueuedRequest]] = {}
        self._by_arrival: list[QueuedRequest] = []
        self._ids: dict[str, QueuedRequest] = {}
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, req_id: object) -> bool:
        return req_id in self._ids

    @property
    def tokens(self) -> int:
        """Sum of the queued requests' prompt-token estimates."""
        return self._tokens

    def _key(self, req: QueuedRequest) -> SortKey:
        return self._ordering.sort_key(req, self.policy)

    def push(self, req: QueuedRequest) -> None:
        """Queue ``req`` (its id must be new here)."""
        if req.id in self._ids:
            raise ValueError(f"request {req.id} is already queued")
        lane = self._tenants.get(req.tenant)
        if lane is None:
            self._fair.activate(req.tenant)
            lane = self._tenants[req.tenant] = []
        insort(lane, req, key=self._key)
        insort(self._by_arrival, req, key=_arrival_key)
        self._ids[req.id] = req
        self._tokens += req.prompt_tokens

    def candidates(self, skip: Container[str] = ()) -> Iterator[QueuedRequest]:
        """Every queued request in serving preference: tenants in the fair-share policy's
        order (as it would choose them now), each tenant's requests in ordering-policy order;
        tenants in ``skip`` left out. The queue must not change while the iterator is in
        use."""
        heads = {t: lane[0] for t, lane in self._tenants.items() if t not in skip}
        while heads:
            tenant = self._fair.choose(heads)
            del heads[tenant]
            yield from self._tenants[tenant]

    def take(self, req_id: str) -> QueuedRequest:
        """Remove a request because it is being admitted."""
        return self._remove(req_id, served=True)

    def remove(self, req_id: str) -> QueuedRequest | None:
        """Remove a request that leaves unserved (cancel, expiry); None if not queued."""
        if req_id not in self._ids:
            return None
        return self._remove(req_id, served=False)

    def _remove(self, req_id: str, *, served: bool) -> QueuedRequest:
        req = self._ids.pop(req_id)
        lane = self._tenants[req.tenant]
        del lane[bisect_left(lane, self._key(req), key=self._key)]
        del self._by_arrival[bisect_left(self._by_arrival, _arrival_key(req), key=_arrival_key)]
        self._tokens -= req.prompt_tokens
        if not lane:
            del self._tenants[req.tenant]
            if served:
                self._fair.deactivate(req.tenant)
            else:
                self._fair.withdraw(req.tenant)
        return req

    def reconfigure(
        self, policy: ClassPolicy, ordering: OrderingPolicy, fair: FairShare | None = None
    ) -> None:
        """Take a new policy and ordering (a settings reload), keeping every queued request:
        each tenant's lane is sorted again with the new key. ``fair``: a new fair-share
        policy (its kind changed) that the backlogged tenants are handed to; None keeps the
        current one and its counters."""
        if policy.name != self.policy.name:
            raise ValueError(f"class {self.policy.name} cannot become {policy.name}")
        self.policy = policy
        self._ordering = ordering
        for lane in self._tenants.values():
            lane.sort(key=self._key)
        if fair is not None:
            self._fair = fair
            for tenant in self._tenants:
                fair.activate(tenant)

    def set_fair_params(self, params: FairShareParams) -> None:
        """Weigh later charges with ``params`` (new tenant weights or w_in/w_out)."""
        self._fair.set_params(params)

    def ahead_of_new(self, tenant: str) -> int:
        """Roughly how many queued requests would go before a new one of ``tenant``: with
        arrival order between tenants (fcfs), all of them; with fair sharing, the tenant's
        own queued requests and about as many of each other backlogged tenant's (so a light
        app is not held to account for a heavy one's backlog)."""
        if self.policy.fair_share == "fcfs":
            return len(self._ids)
        own = len(self._tenants.get(tenant, ()))
        others = len(self._tenants) - (1 if tenant in self._tenants else 0)
        return min(len(self._ids), own * (others + 1))

    def arrived_before(self, req_id: str) -> int:
        """How many queued requests of this class arrived before ``req_id`` (queued)."""
        return bisect_left(self._by_arrival, _arrival_key(self._ids[req_id]), key=_arrival_key)

    def oldest(self) -> QueuedRequest | None:
        """The queued request with the earliest arrival (then id), or None."""
        return self._by_arrival[0] if self._by_arrival else None

    def newest(self, keep: int) -> list[QueuedRequest]:
        """The queued requests after the ``keep`` oldest, in arrival order."""
        return list(self._by_arrival[keep:])

    def expired(self, now: float) -> list[QueuedRequest]:
        """Queued requests whose wait reached the class's queue timeout, oldest first."""
        out: list[QueuedRequest] = []
        for req in self._by_arrival:
            if not is_expired(self.policy, req, now):
                break  # sorted by arrival: every later request waited less
            out.append(req)
        return out

    def charge(self, tenant: str, prompt_tokens: float, output_tokens: float) -> None:
        """Account service to ``tenant`` in this class's fair-share policy."""
        self._fair.charge(tenant, prompt_tokens, output_tokens)

    def counters(self) -> Mapping[str, float]:
        """The fair-share counters of this class (a copy)."""
        return self._fair.counters()

    def fairness_snapshot(self) -> dict[str, float]:
        """The fair-share policy's ``snapshot`` (tenant -> value), {} when it keeps none."""
        fair = self._fair
        return fair.snapshot() if isinstance(fair, RestorableFairShare) else {}

    def restore_fairness(self, state: Mapping[str, float]) -> None:
        """Hand ``state`` to the fair-share policy's ``restore`` (ignored by one without).
        Raises ValueError while requests are queued."""
        if self._ids:
            raise ValueError(f"class {self.policy.name}: restore needs an empty queue")
        fair = self._fair
        if isinstance(fair, RestorableFairShare):
            fair.restore(state)
