"""Pure scheduling policies: value types, bands, fair sharing, ordering, budgets, shedding.

Standard library only; time comes in as an argument; every decision is deterministic.
"""

from hearthgate.policies.budgets import Verdict, WorkerUsage
from hearthgate.policies.scheduler import QueueStats, Scheduler
from hearthgate.policies.types import (
    Admission,
    ClassPolicy,
    QueuedRequest,
    Rejection,
    RejectReason,
    TenantPolicy,
    WorkerBudget,
    WorkerSnapshot,
)

__all__ = [
    "Admission",
    "ClassPolicy",
    "QueueStats",
    "QueuedRequest",
    "RejectReason",
    "Rejection",
    "Scheduler",
    "TenantPolicy",
    "Verdict",
    "WorkerBudget",
    "WorkerSnapshot",
    "WorkerUsage",
]
