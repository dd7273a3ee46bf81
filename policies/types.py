"""Value types shared by the scheduling policies.

Every value here is a frozen dataclass built from plain numbers and strings, validated on
construction (``ValueError`` names the bad field). Times are seconds on whatever monotonic
clock the caller uses; the policies never read a clock themselves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

RejectReason = Literal["queue_full", "queue_tokens_full", "target_unreachable"]
"""Why ``enqueue`` refused a request: the class queue is at its count or token cap, or the
wait ahead of it already exceeds its class's first-token target (``ClassPolicy.shed_late``)."""


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(what)


def _finite(value: float) -> bool:
    return math.isfinite(value)


def _frozen_mapping(value: Mapping[str, int]) -> Mapping[str, int]:
    # A private copy behind a read-only view: the caller's dict may change later.
    return MappingProxyType(dict(value))


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """One request as the scheduler sees it, from enqueue until it finishes.

    ``prompt_tokens`` is the classifier's estimate (corrected by ``on_finish``);
    ``max_tokens`` is the client's output cap. ``priority`` is the value forwarded to vLLM
    (lower runs first); the scheduler's own banding comes from the class, not from this field.
    ``deadline`` is an absolute time used by EDF ordering; ``None`` means arrival plus the
    class's TTFT target. ``workers`` names the workers that may serve it (those serving its
    model); ``None`` means any.
    """

    id: str
    cls: str
    tenant: str
    arrival: float
    priority: int
    prompt_tokens: int
    max_tokens: int
    deadline: float | None = None
    workers: frozenset[str] | None = None
    # The endpoint's name ("chat", "embeddings", "rerank"...; None: unknown, a generation
    # request). ``pooling``: no output (embeddings, rerank, score): the router sends it to
    # an ``embeddings`` worker when one is healthy.
    endpoint: str | None = None
    pooling: bool = False
    # Sequences the request runs as on the worker (``n`` completions decode as ``n``): each
    # takes a slot of the worker's in-flight budgets.
    sequences: int = 1

    def __post_init__(self) -> None:
        _require(bool(self.id), "request id must not be empty")
        _require(bool(self.cls), f"request {self.id}: cls must not be empty")
        _require(bool(self.tenant), f"request {self.id}: tenant must not be empty")
        _require(_finite(self.arrival), f"request {self.id}: arrival must be finite")
        _require(self.prompt_tokens >= 0, f"request {self.id}: prompt_tokens must be >= 0")
        _require(self.max_tokens >= 0, f"request {self.id}: max_tokens must be >= 0")
        _require(self.sequences >= 1, f"request {self.id}: sequences must be >= 1")
        if self.deadline is not None:
            _require(_finite(self.deadline), f"request {self.id}: deadline must be finite")

    @property
    def dispatched_tokens(self) -> int:
        """The request's token footprint at dispatch: prompt estimate plus output cap."""
        return self.prompt_tokens + self.max_tokens


@dataclass(frozen=True, slots=True)
class ClassPolicy:
    """How one request class is scheduled.

    ``priority``: lower number = higher band (voice 0 > chat 1 > rag 2 > embed 3 > batch 4).
    ``interactive`` classes may use the reserved headroom and are not held back by scraped
    saturation. ``min_share`` is a floor on the class's share of dispatched tokens while it is
    backlogged; ``max_wait_s`` the wait of its oldest request after which the class goes first.
    ``max_queue`` / ``max_queued_tokens`` cap the queue (count / prompt-token estimate);
    ``queue_timeout_s`` expires queued requests. ``shed_late``: a background class with a
    ``ttft_s`` target refuses a request whose predicted wait already exceeds it (see
    ``policies.shedding.check_late``); with ``shed_after_wait_s``, only once its line has
    stood that long (``policies.shedding.StandingLine``), and then ``shed_queued`` also
    refuses the queued requests that would wait that long again (``policies.shedding.
    line_keeps``: a backlog built before the line stood). ``ordering`` names the policy
    inside a tenant and ``fair_share`` the policy between tenants (keys of the registries
    in ``policies.ordering`` and ``policies.fairness``). ``None`` means "no limit" throughout.
    """

    name: str
    priority: int
    interactive: bool = False
    ttft_s: float | None = None
    itl_s: float | None = None
    min_share: float | None = None
    max_wait_s: float | None = None
    max_queue: int | None = None
    max_queued_tokens: int | None = None
    queue_timeout_s: float | None = None
    ordering: str = "fcfs"
    fair_share: str = "vtc"
    shed_late: bool = False
    shed_after_wait_s: float | None = None
    shed_queued: bool = False

    def __post_init__(self) -> None:
        n = self.name
        _require(bool(n), "class name must not be empty")
        for key, value in (
            ("ttft_s", self.ttft_s),
            ("itl_s", self.itl_s),
            ("max_wait_s", self.max_wait_s),
            ("queue_timeout_s", self.queue_timeout_s),
            ("shed_after_wait_s", self.shed_after_wait_s),
        ):
            if value is not None:
                _require(_finite(value) and value > 0, f"class {n}: {key} must be > 0")
        if self.min_share is not None:
            ok = _finite(self.min_share) and 0 < self.min_share <= 1
            _require(ok, f"class {n}: min_share must be in (0, 1]")
        if self.max_queue is not None:
            _require(self.max_queue >= 1, f"class {n}: max_queue must be >= 1")
        if self.max_queued_tokens is not None:
            _require(self.max_queued_tokens >= 1, f"class {n}: max_queued_tokens must be >= 1")


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    """A tenant (an app or API key), its fair-sharing weight (> 0; 2 = twice the share) and
    the most requests it may have in flight at once, over all classes and workers (None:
    no limit). A tenant at its limit is passed over; the others are not held up by it."""

    name: str
    weight: float = 1.0
    max_in_flight: int | None = None

    def __post_init__(self) -> None:
        _require(bool(self.name), "tenant name must not be empty")
        ok = _finite(self.weight) and self.weight > 0
        _require(ok, f"tenant {self.name}: weight must be > 0")
        cap = self.max_in_flight
        _require(cap is None or cap >= 1, f"tenant {self.name}: max_in_flight must be >= 1")


@dataclass(frozen=True, slots=True)
class WorkerBudget:
    """Admission limits of one worker; ``None`` means unlimited.

    ``max_in_flight`` caps sequences on the worker, ``max_in_flight_per_class`` per class.
    ``prefill_token_budget`` caps prompt tokens admitted whose first token has not arrived (a
    single larger request is admitted alone). ``interactive_reserved_slots`` /
    ``interactive_reserved_prefill_tokens`` are the part of those two budgets that only
    interactive classes may use (the slots only count when ``max_in_flight`` is set, the
    tokens only when ``prefill_token_budget`` is). The worker is saturated for background
    classes when its scraped ``vllm:num_requests_waiting`` is above ``max_scraped_waiting``
    or its ``vllm:kv_cache_usage_perc`` (0..1) above ``max_kv_usage``.
    """

    max_in_flight: int | None = None
    max_in_flight_per_class: Mapping[str, int] = field(default_factory=dict)
    prefill_token_budget: int | None = None
    interactive_reserved_slots: int = 0
    interactive_reserved_prefill_tokens: int = 0
    max_scraped_waiting: float | None = None
    max_kv_usage: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "max_in_flight_per_class", _frozen_mapping(self.max_in_flight_per_class)
        )
        if self.max_in_flight is not None:
            _require(self.max_in_flight >= 1, "max_in_flight must be >= 1")
            _require(
                0 <= self.interactive_reserved_slots < self.max_in_flight,
                "interactive_reserved_slots must be >= 0 and < max_in_flight",
            )
        else:
            _require(self.interactive_reserved_slots >= 0, "interactive_reserved_slots >= 0")
        for cls, cap in self.max_in_flight_per_class.items():
            _require(cap >= 1, f"max_in_flight_per_class[{cls}] must be >= 1")
        if self.prefill_token_budget is not None:
            _require(self.prefill_token_budget >= 1, "prefill_token_budget must be >= 1")
            _require(
                0 <= self.interactive_reserved_prefill_tokens <= self.prefill_token_budget,
                "interactive_reserved_prefill_tokens must be >= 0 and <= prefill_token_budget",
            )
        else:
            _require(
                self.interactive_reserved_prefill_tokens >= 0,
                "interactive_reserved_prefill_tokens must be >= 0",
            )
        if self.max_scraped_waiting is not None:
            ok = _finite(self.max_scraped_waiting) and self.max_scraped_waiting >= 0
            _require(ok, "max_scraped_waiting must be >= 0")
        if self.max_kv_usage is not None:
            ok = _finite(self.max_kv_usage) and 0 <= self.max_kv_usage <= 1
            _require(ok, "max_kv_usage must be in [0, 1]")


@dataclass(frozen=True, slots=True)
class WorkerSnapshot:
    """What the worker pool knows about one worker at one instant.

    The scheduler tracks its own in-flight work per worker (it admitted it); the snapshot
    brings the limits, the health and the scraped gauges (``None`` when not scraped).
    """

    name: str
    healthy: bool = True
    limits: WorkerBudget = field(default_factory=WorkerBudget)
    scraped_waiting: float | None = None
    kv_usage: float | None = None
    role: str = "general"  # general | long_prefill | embeddings (see policies.routing)
    # Background (non-interactive) sequences allowed on the worker now (policies.pacing);
    # None: no such cap.
    background_cap: int | None = None
    # Interactive sequences one app may have on the worker now (policies.pacing, the
    # per-app cap); None: no such cap.
    app_cap: int | None = None
    # False while the worker's background prefill duty is used up (policies.pacing):
    # background prompts wait, interactive ones do not.
    prefill_open: bool = True
    # An app with at least ``flood_at`` interactive sequences on the worker floods it and
    # may have only ``flood_prefill`` prompts in prefill there (policies.budgets); None:
    # no such limit.
    flood_at: int | None = None
    flood_prefill: int | None = None
    # Such an app waits while a lighter app's request there waits for its first token
    # (policies.budgets); only with ``flood_at``.
    flood_yields: bool = False
    # While another app shares its class, such an app's prompt counts against
    # ``flood_prefill`` until its first token, not only until its early prefill release.
    flood_until_first_token: bool = False
    # Background prompts the worker may have in prefill at once (policies.budgets): an
    # interactive prompt waits in vLLM's first-come-first-served queue behind at most these;
    # None: no such limit.
    background_prefill: int | None = None

    def __post_init__(self) -> None:
        _require(bool(self.name), "worker name must not be empty")
        caps = (
            self.background_cap,
            self.app_cap,
            self.flood_at,
            self.flood_prefill,
            self.background_prefill,
        )
        for cap in caps:
            _require(cap is None or cap >= 1, "pacing caps must be >= 1")

    @property
    def saturated(self) -> bool:
        """True when a scraped gauge is above its limit (background classes then wait)."""
        lim = self.limits
        waiting, max_waiting = self.scraped_waiting, lim.max_scraped_waiting
        if waiting is not None and max_waiting is not None and waiting > max_waiting:
            return True
        kv = self.kv_usage
        return kv is not None and lim.max_kv_usage is not None and kv > lim.max_kv_usage


@dataclass(frozen=True, slots=True)
class Rejection:
    """``enqueue`` refused the request; ``queued`` / ``queued_tokens`` describe the class
    queue at that moment (for a ``Retry-After`` estimate); ``retry_after_s``, when set, is
    the wait the shedding rule itself justifies, and ``ahead`` the requests it counted
    before this one (queued or still waiting in a worker)."""

    reason: RejectReason
    cls: str
    queued: int
    queued_tokens: int
    retry_after_s: float | None = None
    ahead: int | None = None


@dataclass(frozen=True, slots=True)
class Admission:
    """``admit`` chose ``request`` to be sent to the worker named ``worker`` now."""

    request: QueuedRequest
    worker: str
