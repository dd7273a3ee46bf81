"""Earliest deadline first inside a tenant."""

from __future__ import annotations

from dataclasses import dataclass

from hearthgate.policies.ordering.base import SortKey
from hearthgate.policies.types import ClassPolicy, QueuedRequest


def effective_deadline(req: QueuedRequest, cls: ClassPolicy) -> float:
    """The request's own deadline, else arrival plus the class TTFT target (plus 0 if unset)."""
    if req.deadline is not None:
        return req.deadline
    return req.arrival + (cls.ttft_s if cls.ttft_s is not None else 0.0)


@dataclass(frozen=True, slots=True)
class Edf:
    """Earliest effective deadline first; equal deadlines by arrival, then request id."""

    name: str = "edf"

    def sort_key(self, req: QueuedRequest, cls: ClassPolicy) -> SortKey:
        """(deadline, arrival, id)."""
        return (effective_deadline(req, cls), req.arrival, req.id)
