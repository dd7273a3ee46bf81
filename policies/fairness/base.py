"""The fair-share Protocol: which backlogged tenant of one class is served next."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from hearthgate.policies.types import QueuedRequest


@dataclass(frozen=True, slots=True)
class FairShareParams:
    """Construction parameters every fair-share policy receives.

    Service is ``(w_in * prompt_tokens + w_out * output_tokens) / weight`` where ``weight``
    comes from ``weights`` (tenant name -> weight), else ``default_weight``.
    """

    w_in: float = 1.0
    w_out: float = 2.0
    weights: Mapping[str, float] = field(default_factory=dict)
    default_weight: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "weights", MappingProxyType(dict(self.weights)))
        if self.w_in < 0 or self.w_out < 0:
            raise ValueError("w_in and w_out must be >= 0")
        if self.default_weight <= 0 or any(w <= 0 for w in self.weights.values()):
            raise ValueError("tenant weights must be > 0")

    def weight(self, tenant: str) -> float:
        """The tenant's weight (the default for tenants not listed)."""
        return self.weights.get(tenant, self.default_weight)

    def cost(self, tenant: str, prompt_tokens: float, output_tokens: float) -> float:
        """The weighted service of that many tokens for ``tenant`` (negative corrects)."""
        raw = self.w_in * prompt_tokens + self.w_out * output_tokens
        return raw / self.weight(tenant)


class FairShare(Protocol):
    """Chooses between the backlogged tenants of one class and keeps their service account.

    The class queue calls ``activate`` when a tenant goes from no queued request to one,
    ``deactivate`` when its last queued request is admitted, and ``withdraw`` when its last
    queued request is removed unserved (cancelled or expired). Every call is deterministic.
    """

    def activate(self, tenant: str) -> None:
        """``tenant`` became backlogged; called before it can be chosen."""
        ...

    def deactivate(self, tenant: str) -> None:
        """``tenant``'s last queued request was admitted; it is no longer backlogged."""
        ...

    def withdraw(self, tenant: str) -> None:
        """``tenant``'s last queued request left unserved. If nothing was charged to it since
        ``activate``, its account is restored to what it was before (no trace is left)."""
        ...

    def choose(self, heads: Mapping[str, QueuedRequest]) -> str:
        """Given each backlogged tenant's next request (non-empty), the tenant to serve
        next. The answer does not depend on the mapping's iteration order."""
        ...

    def charge(self, tenant: str, prompt_tokens: float, output_tokens: float) -> None:
        """Account service to ``tenant``; negative amounts correct earlier estimates."""
        ...

    def counters(self) -> Mapping[str, float]:
        """Each known tenant's service counter (a copy; weighted tokens)."""
        ...

    def set_params(self, params: FairShareParams) -> None:
        """Charge later service with ``params`` (new weights after a settings reload);
        the counters so far stay as they are."""
        ...


FairShareFactory = Callable[[FairShareParams], FairShare]
"""Builds one fair-share instance (one per class) from the shared parameters."""
