"""Which worker an admitted request goes to: the router's order, the budgets' verdict."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hearthgate.policies.budgets import Verdict, WorkerUsage, check
from hearthgate.policies.routing import DEFAULT_POLICY, RoutingPolicy, scores
from hearthgate.policies.types import WorkerSnapshot


class Blocked(enum.Enum):
    """Why a request fits no worker."""

    NO_WORKER = "no_worker"  # no healthy worker at all
    OWN_CAP = "own_cap"  # every healthy worker has the class (or the app) at its own cap
    SHARED = "shared"  # a shared budget (slots, prefill, saturation) is in the way


@dataclass(frozen=True, slots=True)
class Placement:
    """Either ``worker`` (the request fits there) or ``blocked`` (why it fits nowhere) and
    ``limit``: the budget verdict on the best-scoring healthy worker (None when it fits or
    no worker is healthy)."""

    worker: str | None
    blocked: Blocked | None
    limit: Verdict | None = None


def place(
    workers: Sequence[WorkerSnapshot],
    usage: Mapping[str, WorkerUsage],
    cls: str,
    interactive: bool,
    prompt_tokens: int,
    eligible: frozenset[str] | None = None,
    routing: RoutingPolicy = DEFAULT_POLICY,
    sequences: int = 1,
    app: str | None = None,
    capped: bool = True,
) -> Placement:
    """The best-scoring worker (``policies.routing.scores``: gateway in-flight, scraped
    waiting and KV usage; ties by name) among those the request fits, else the reason it
    fits none. ``usage`` must hold every worker in ``workers``; only workers named in
    ``eligible`` count (None: all); ``capped``: as for ``budgets.app_paced``. Scores are
    normalised over the healthy eligible workers, whether they fit or not."""
    considered = [w for w in workers if eligible is None or w.name in eligible]
    healthy_ws = [w for w in considered if w.healthy]
    score = scores(healthy_ws, {w.name: usage[w.name].in_flight for w in healthy_ws}, routing)
    best: tuple[float, str] | None = None
    nearest: tuple[float, str, Verdict] | None = None
    healthy = 0
    own_cap = 0
    for w in considered:
        u = usage[w.name]
        verdict = check(w, u, cls, interactive, prompt_tokens, sequences, app, capped)
        if verdict is Verdict.UNHEALTHY:
            continue
        healthy += 1
        if verdict is Verdict.FITS:
            key = (score[w.name], w.name)
            if best is None or key < best:
                best = key
            continue
        if nearest is None or (score[w.name], w.name) < nearest[:2]:
            nearest = (score[w.name], w.name, verdict)
        if verdict in (Verdict.CLASS_CAP, Verdict.APP_PACED):
            own_cap += 1  # limits of this class or app only: other work may still go
    if best is not None:
        return Placement(best[1], None)
    if nearest is None:
        return Placement(None, Blocked.NO_WORKER)
    blocked = Blocked.OWN_CAP if own_cap == healthy else Blocked.SHARED
    return Placement(None, blocked, nearest[2])
