"""First come, first served inside a tenant."""

from __future__ import annotations

from dataclasses import dataclass

from hearthgate.policies.ordering.base import SortKey
from hearthgate.policies.types import ClassPolicy, QueuedRequest


@dataclass(frozen=True, slots=True)
class Fcfs:
    """Earliest arrival first; equal arrivals by request id."""

    name: str = "fcfs"

    def sort_key(self, req: QueuedRequest, cls: ClassPolicy) -> SortKey:
        """(arrival, 0, id)."""
        return (req.arrival, 0.0, req.id)
