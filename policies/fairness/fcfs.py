"""Baseline without fairness: the tenant whose next request arrived first goes next."""

from __future__ import annotations

from collections.abc import Mapping

from hearthgate.policies.fairness.base import FairShareParams
from hearthgate.policies.types import QueuedRequest


class FcfsShare:
    """Serves tenants in the order of their head requests' arrival (then id).

    It keeps the same weighted service counters as VTC, for the metrics only; they never
    influence a choice, so activation leaves nothing to undo.
    """

    def __init__(self, params: FairShareParams) -> None:
        self._params = params
        self._counter: dict[str, float] = {}

    def activate(self, tenant: str) -> None:
        """Nothing to do: arrival order needs no per-tenant state."""

    def deactivate(self, tenant: str) -> None:
        """Nothing to do."""

    def withdraw(self, tenant: str) -> None:
        """Nothing to do."""

    def choose(self, heads: Mapping[str, QueuedRequest]) -> str:
        """The tenant with the earliest (head arrival, head id)."""
        if not heads:
            raise ValueError("choose needs at least one backlogged tenant")
        return min(heads, key=lambda t: (heads[t].arrival, heads[t].id))

    def charge(self, tenant: str, prompt_tokens: float, output_tokens: float) -> None:
        """Add the weighted service to the tenant's counter (reporting only)."""
        cost = self._params.cost(tenant, prompt_tokens, output_tokens)
        self._counter[tenant] = self._counter.get(tenant, 0.0) + cost

    def counters(self) -> Mapping[str, float]:
        """A copy of every known counter."""
        return dict(self._counter)

    def set_params(self, params: FairShareParams) -> None:
        """Weigh later charges with ``params``; counters so far are kept."""
        self._params = params

    def snapshot(self) -> dict[str, float]:
        """Nothing: arrival order keeps no fair-share state to carry over a restart (the
        counters are for the metrics and start again from zero)."""
        return {}

    def restore(self, state: Mapping[str, float]) -> None:
        """Ignores ``state`` (see ``snapshot``); a class switched from VTC keeps no debts."""
