"""Ordering policies inside a tenant, registered in ``ORDERINGS`` (the only lookup place)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from hearthgate.policies.ordering.base import OrderingPolicy, SortKey
from hearthgate.policies.ordering.edf import Edf, effective_deadline
from hearthgate.policies.ordering.fcfs import Fcfs

ORDERINGS: Mapping[str, OrderingPolicy] = MappingProxyType({"fcfs": Fcfs(), "edf": Edf()})
"""Every ordering policy by name; ``ClassPolicy.ordering`` must be one of these keys."""

__all__ = ["ORDERINGS", "Edf", "Fcfs", "OrderingPolicy", "SortKey", "effective_deadline"]
