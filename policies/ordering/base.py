"""The ordering Protocol: which of one tenant's queued requests in a class goes first."""

from __future__ import annotations

from typing import Protocol

from hearthgate.policies.types import ClassPolicy, QueuedRequest

SortKey = tuple[float, float, str]
"""(primary, secondary, request id): smaller goes first; the id makes the order total."""


class OrderingPolicy(Protocol):
    """Orders the queued requests of one tenant inside one class.

    ``sort_key`` is a pure function of the request and its class: the same inputs always
    give the same key, and two different requests never share a key (it ends in the id).
    """

    @property
    def name(self) -> str:
        """The registry key of this policy."""
        ...

    def sort_key(self, req: QueuedRequest, cls: ClassPolicy) -> SortKey:
        """The key by which ``req`` is ordered among its tenant's queued requests."""
        ...
