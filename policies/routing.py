"""The router: which workers may take a request, and in what order they are tried.

Two steps, both pure and deterministic:

1. **Filter** (:func:`route`): the healthy workers that serve the request's model (its
   ``workers`` set), narrowed by role. Each kind of request has an order of preference
   over roles, and the first role with at least one healthy worker wins:

   - embeddings endpoint: ``embeddings``, then ``general``, then ``long_prefill``;
   - a generation request whose prompt estimate reaches ``long_prefill_min_tokens``:
     ``long_prefill``, then ``general`` (where the prefill budget keeps it from stalling
     running streams), then ``embeddings``;
   - any other generation request: ``general``, then ``long_prefill``, then ``embeddings``.

   So short requests never reach a long-prefill worker while a general one is healthy, and
   when only long-prefill workers are left (none configured, all down) they serve
   everything: availability over isolation. The choice depends on health only, never on
   load: a long prompt waits for a busy long-prefill worker rather than spilling onto the
   general one, which is what the split is for.

2. **Score** (:func:`score`, used by ``policies.placement``): among the filtered workers
   the request fits (the budgets decide fit), the one with the lowest weighted sum of
   three terms, each normalised to 0..1:

   - the gateway's own in-flight count on the worker, divided by the largest count among
     the candidates (0 when all are idle);
   - vLLM's scraped ``num_requests_waiting``, divided likewise by the largest among them;
   - vLLM's scraped KV-cache usage (already 0..1).

   A scraped value that is unknown (never scraped, or older than three intervals) counts
   as ``unknown_load`` (default 1.0, the worst a known worker can score on that term): a
   worker whose gauges went quiet may be hung, so it is not mistaken for an idle one. When
   no worker has gauges (scraping off), the term is equal for all and in-flight decides.
   Ties go to the worker name that sorts first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hearthgate.policies.types import QueuedRequest, WorkerSnapshot

GENERAL = "general"
LONG_PREFILL = "long_prefill"
EMBEDDINGS = "embeddings"
ROLES = (GENERAL, LONG_PREFILL, EMBEDDINGS)

_PREFERENCE = {
    "embeddings": (EMBEDDINGS, GENERAL, LONG_PREFILL),
    "long": (LONG_PREFILL, GENERAL, EMBEDDINGS),
    "short": (GENERAL, LONG_PREFILL, EMBEDDINGS),
}


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(what)


@dataclass(frozen=True, slots=True)
class RoutingWeights:
    """Weights of the three score terms (>= 0; all zero: ties by name only)."""

    in_flight: float = 1.0
    waiting: float = 1.0
    kv: float = 1.0

    def __post_init__(self) -> None:
        for key in ("in_flight", "waiting", "kv"):
            value = getattr(self, key)
            _check(math.isfinite(value) and value >= 0, f"routing weight {key} must be >= 0")


@dataclass(frozen=True, slots=True)
class RoutingPolicy:
    """``long_prefill_min_tokens``: prompt estimate from which a generation request prefers
    a ``long_prefill`` worker (None: never). ``unknown_load``: the normalised value an
    unknown scraped gauge counts as (0..1)."""

    long_prefill_min_tokens: int | None = None
    weights: RoutingWeights = RoutingWeights()
    unknown_load: float = 1.0

    def __post_init__(self) -> None:
        if self.long_prefill_min_tokens is not None:
            _check(self.long_prefill_min_tokens >= 1, "long_prefill_min_tokens must be >= 1")
        ok = math.isfinite(self.unknown_load) and 0 <= self.unknown_load <= 1
        _check(ok, "unknown_load must be in [0, 1]")


DEFAULT_POLICY = RoutingPolicy()


def request_kind(req: QueuedRequest, policy: RoutingPolicy = DEFAULT_POLICY) -> str:
    """``embeddings``, ``long`` (prefers a long-prefill worker) or ``short``."""
    if req.pooling or req.endpoint == "embeddings":
        return "embeddings"
    threshold = policy.long_prefill_min_tokens
    if threshold is not None and req.prompt_tokens >= threshold:
        return "long"
    return "short"


def route(
    workers: Sequence[WorkerSnapshot],
    req: QueuedRequest,
    policy: RoutingPolicy = DEFAULT_POLICY,
) -> frozenset[str]:
    """The workers ``req`` may be placed on now: healthy, in its ``workers`` set (None:
    any), of the first role in its preference order that has one. Empty when none is
    healthy."""
    healthy = [w for w in workers if w.healthy and (req.workers is None or w.name in req.workers)]
    for role in _PREFERENCE[request_kind(req, policy)]:
        picked = frozenset(w.name for w in healthy if _role(w) == role)
        if picked:
            return picked
    # Roles outside the three known ones (never from the settings): last resort.
    return frozenset(w.name for w in healthy)


def _role(w: WorkerSnapshot) -> str:
    return w.role if w.role in ROLES else ""


def _relative(values: Mapping[str, float | None], unknown: float) -> dict[str, float]:
    known = [v for v in values.values() if v is not None]
    top = max(known, default=0.0)
    return {
        name: unknown if v is None else (v / top if top > 0 else 0.0) for name, v in values.items()
    }


def scores(
    workers: Iterable[WorkerSnapshot],
    in_flight: Mapping[str, int],
    policy: RoutingPolicy = DEFAULT_POLICY,
) -> dict[str, float]:
    """Each worker's score (lower is better); ``in_flight`` is the gateway's own count per
    worker name (missing: 0). Normalisation is over the workers given."""
    ws = list(workers)
    wt = policy.weights
    flights = _relative({w.name: float(in_flight.get(w.name, 0)) for w in ws}, 0.0)
    waiting = _relative({w.name: _known(w.scraped_waiting) for w in ws}, policy.unknown_load)
    out: dict[str, float] = {}
    for w in ws:
        kv = _known(w.kv_usage)
        kv_term = policy.unknown_load if kv is None else min(1.0, max(0.0, kv))
        load = wt.in_flight * flights[w.name] + wt.waiting * waiting[w.name]
        out[w.name] = load + wt.kv * kv_term
    return out


def _known(value: float | None) -> float | None:
    if value is None or not math.isfinite(value) or value < 0:
        return None  # a gauge we cannot trust is unknown, not idle
    return value


def rank(
    workers: Iterable[WorkerSnapshot],
    in_flight: Mapping[str, int],
    policy: RoutingPolicy = DEFAULT_POLICY,
) -> list[str]:
    """Worker names, best first: by score, ties by name."""
    s = scores(workers, in_flight, policy)
    return sorted(s, key=lambda name: (s[name], name))


def pick(
    workers: Sequence[WorkerSnapshot],
    req: QueuedRequest,
    in_flight: Mapping[str, int],
    policy: RoutingPolicy = DEFAULT_POLICY,
) -> str | None:
    """Filter, score, pick: the best worker for ``req`` ignoring budgets (None: no healthy
    worker can serve it)."""
    allowed = route(workers, req, policy)
    ranked = rank([w for w in workers if w.name in allowed], in_flight, policy)
    return ranked[0] if ranked else None
