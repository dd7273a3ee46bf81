"""Fair sharing between tenants inside a class, registered in ``FAIR_SHARES``."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from hearthgate.policies.fairness.base import FairShare, FairShareFactory, FairShareParams
from hearthgate.policies.fairness.fcfs import FcfsShare
from hearthgate.policies.fairness.vtc import Vtc

FAIR_SHARES: Mapping[str, FairShareFactory] = MappingProxyType({"vtc": Vtc, "fcfs": FcfsShare})
"""Every fair-share policy by name; ``ClassPolicy.fair_share`` must be one of these keys."""

__all__ = ["FAIR_SHARES", "FairShare", "FairShareFactory", "FairShareParams", "FcfsShare", "Vtc"]
