"""Virtual token counter fair sharing (Sheng et al., "Fairness in Serving Large Language
Models", OSDI 2024)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from hearthgate.policies.fairness.base import FairShareParams
from hearthgate.policies.types import QueuedRequest

_UNKNOWN = None  # marker in the undo log: the tenant had no counter before it activated


class Vtc:
    """The backlogged tenant with the smallest counter goes next.

    Counters grow by ``(w_in * prompt + w_out * output) / weight``. A tenant that becomes
    backlogged is lifted to the smallest counter among the backlogged tenants (or, when none
    is backlogged, to the counter of the tenant that left the backlog last), so idling banks
    no credit. Ties go to the earlier head request (arrival, then id).

    ``snapshot``/``restore`` carry the state across a restart: see ``snapshot``.
    """

    def __init__(self, params: FairShareParams) -> None:
        self._params = params
        self._counter: dict[str, float] = {}
        self._backlogged: dict[str, None] = {}  # a dict, not a set: iteration order is stable
        self._last_left: float | None = None
        # Counter before the lift, for tenants not charged since they activated.
        self._undo: dict[str, float | None] = {}

    def activate(self, tenant: str) -> None:
        """Lift ``tenant`` (see class doc) and mark it backlogged."""
        if tenant in self._backlogged:
            raise ValueError(f"tenant {tenant} is already backlogged")
        before = self._counter.get(tenant, _UNKNOWN)
        own = before if before is not None else 0.0
        if self._backlogged:
            floor = min(self._counter[t] for t in self._backlogged)
        elif self._last_left is not None:
            floor = self._last_left
        else:
            floor = own
        self._counter[tenant] = max(own, floor)
        self._backlogged[tenant] = None
        self._undo[tenant] = before

    def deactivate(self, tenant: str) -> None:
        """No longer backlogged; remembers its counter as the last one to leave."""
        del self._backlogged[tenant]
        self._undo.pop(tenant, None)
        self._last_left = self._counter[tenant]

    def withdraw(self, tenant: str) -> None:
        """No longer backlogged; undoes the lift if the tenant was not charged since."""
        del self._backlogged[tenant]
        if tenant not in self._undo:
            self._last_left = self._counter[tenant]
            return
        before = self._undo.pop(tenant)
        if before is None:
            del self._counter[tenant]
        else:
            self._counter[tenant] = before

    def choose(self, heads: Mapping[str, QueuedRequest]) -> str:
        """The tenant with the smallest (counter, head arrival, head id)."""
        if not heads:
            raise ValueError("choose needs at least one backlogged tenant")
        return min(
            heads,
            key=lambda t: (self._counter.get(t, 0.0), heads[t].arrival, heads[t].id),
        )

    def charge(self, tenant: str, prompt_tokens: float, output_tokens: float) -> None:
        """Add the weighted service to the tenant's counter."""
        cost = self._params.cost(tenant, prompt_tokens, output_tokens)
        self._counter[tenant] = self._counter.get(tenant, 0.0) + cost
        self._undo.pop(tenant, None)

    def counters(self) -> Mapping[str, float]:
        """A copy of every known counter."""
        return dict(self._counter)

    def set_params(self, params: FairShareParams) -> None:
        """Weigh later charges with ``params``; counters so far are kept."""
        self._params = params

    def _floor(self) -> float:
        # What a tenant becoming backlogged now is lifted to (if below): the smallest
        # backlogged counter, else the counter of the last to leave the backlog, else 0.
        if self._backlogged:
            return min(self._counter[t] for t in self._backlogged)
        return self._last_left if self._last_left is not None else 0.0

    def snapshot(self) -> dict[str, float]:
        """Each known tenant's counter above the floor (0 when at or below it), by tenant.

        Only this part carries over a restart. VTC's choices depend on differences of
        counters only, and a counter below the floor is lifted to it as the tenant becomes
        backlogged, so a lag below the floor is credit banked while idle, which VTC never
        grants. The part above it is service the tenant still owes the others (typically
        output charged after it left the backlog) and is kept to the token.
        """
        floor = self._floor()
        return {t: max(c - floor, 0.0) + 0.0 for t, c in sorted(self._counter.items())}

    def restore(self, state: Mapping[str, float]) -> None:
        """Replace every account with ``state`` (a ``snapshot``: tenant -> counter above the
        floor, finite and >= 0) at floor 0, with nobody backlogged.

        This is the state the snapshotted VTC would reach if its backlog emptied at once and
        the tenant that left last sat at the floor: a returning tenant is lifted to
        ``max(own, 0)``, or to the smallest backlogged counter, exactly as before the
        restart. So a tenant that owed service still owes the same amount to whoever is
        backlogged when it comes back, an idle one gains nothing, and a tenant absent from
        ``state`` starts as any new tenant does. As while running, the debt is owed only to
        tenants that are waiting when the debtor comes back: one that becomes backlogged
        while only more indebted tenants are is lifted to the smallest of their counters.

        Raises ValueError while a tenant is backlogged or for a value that is not a finite
        number >= 0 (``Scheduler.restore_fairness`` filters those out first).
        """
        if self._backlogged:
            raise ValueError("restore needs an empty backlog")
        for tenant, value in state.items():
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"tenant {tenant}: counter {value!r} is not finite and >= 0")
        self._counter = {t: float(v) + 0.0 for t, v in state.items()}
        self._undo.clear()
        self._last_left = 0.0
