"""Admission budgets per worker: what the scheduler has in flight there, and whether one
more request fits."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from hearthgate.policies.types import WorkerSnapshot


class Verdict(enum.Enum):
    """Whether a request fits a worker now, and if not, the first limit in the way."""

    FITS = "fits"
    UNHEALTHY = "unhealthy"
    CLASS_CAP = "class_cap"  # the class's own in-flight cap on that worker
    SATURATED = "saturated"  # scraped gauges over their limits (background classes only)
    SLOTS = "slots"  # total in-flight cap, minus the interactive reserve for background
    PREFILL = "prefill"  # prefill token budget, minus the interactive reserve for background
    PACED = "paced"  # background sequences at the worker's decode-pacing cap


@dataclass(frozen=True, slots=True)
class WorkerUsage:
    """What the scheduler has admitted to one worker and not yet seen finish.

    ``prefill_tokens`` are prompt-token estimates of requests whose first token has not
    arrived; ``interactive_prefill_tokens`` the part of them from interactive classes.
    """

    name: str
    in_flight: int
    in_flight_by_class: Mapping[str, int]
    prefill_tokens: int
    interactive_prefill_tokens: int
    prefill_requests: int
    interactive_in_flight: int = 0


class WorkerLoad:
    """Mutable in-flight bookkeeping of one worker (owned by the scheduler)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._by_class: dict[str, int] = {}
        self._prefill = 0
        self._prefill_interactive = 0
        self._prefill_requests = 0
        self._interactive = 0

    def add(self, cls: str, interactive: bool, prompt_tokens: int, sequences: int = 1) -> None:
        """A request of ``sequences`` sequences was admitted here; it is in prefill until
        ``end_prefill``."""
        self._by_class[cls] = self._by_class.get(cls, 0) + sequences
        self._prefill += prompt_tokens
        self._prefill_requests += 1
        if interactive:
            self._prefill_interactive += prompt_tokens
            self._interactive += sequences

    def end_prefill(self, interactive: bool, prompt_tokens: int) -> None:
        """The request's first token arrived (or it ended before one): release its tokens."""
        self._prefill -= prompt_tokens
        self._prefill_requests -= 1
        if interactive:
            self._prefill_interactive -= prompt_tokens

    def remove(self, cls: str, interactive: bool = False, sequences: int = 1) -> None:
        """The request finished: release its slots (its prefill must have ended already)."""
        if interactive:
            self._interactive -= sequences
        left = self._by_class[cls] - sequences
        if left:
            self._by_class[cls] = left
        else:
            del self._by_class[cls]

    def usage(self) -> WorkerUsage:
        """A frozen view of the current bookkeeping."""
        return WorkerUsage(
            name=self.name,
            in_flight=sum(self._by_class.values()),
            in_flight_by_class=MappingProxyType(dict(sorted(self._by_class.items()))),
            prefill_tokens=self._prefill,
            interactive_prefill_tokens=self._prefill_interactive,
            prefill_requests=self._prefill_requests,
            interactive_in_flight=self._interactive,
        )


def check(
    worker: WorkerSnapshot,
    usage: WorkerUsage,
    cls: str,
    interactive: bool,
    prompt_tokens: int,
    sequences: int = 1,
) -> Verdict:
    """Whether one more request of ``cls`` with ``prompt_tokens`` fits ``worker`` now.
    In-flight counts and caps are in sequences (a request with ``n`` completions runs as
    ``sequences`` of them); a request with more sequences than a cap runs alone.

    Background classes may not use the interactive reserve (slots or prefill tokens) and
    wait while the worker is saturated or has as many background sequences as its
    decode-pacing cap (``WorkerSnapshot.background_cap``). The prefill budget admits any
    request when nothing is in prefill (so a request larger than the budget goes alone);
    interactive requests may also always use the reserved prefill tokens not used by other
    interactive requests, even while an oversized background prompt is alone in prefill.
    """
    if not worker.healthy:
        return Verdict.UNHEALTHY
    lim = worker.limits
    cap = lim.max_in_flight_per_class.get(cls)
    if cap is not None and usage.in_flight_by_class.get(cls, 0) >= cap:
        return Verdict.CLASS_CAP
    if not interactive and worker.saturated:
        return Verdict.SATURATED
    bg_cap = worker.background_cap
    background = usage.in_flight - usage.interactive_in_flight
    if not interactive and bg_cap is not None and background >= bg_cap:
        return Verdict.PACED
    if lim.max_in_flight is not None:
        slots = lim.max_in_flight - (0 if interactive else lim.interactive_reserved_slots)
        alone = sequences > 1 and usage.in_flight == 0  # too big to ever fit: runs alone
        if usage.in_flight + sequences > slots and not alone:
            return Verdict.SLOTS
    budget = lim.prefill_token_budget
    if budget is not None and usage.prefill_tokens > 0:
        reserved = lim.interactive_reserved_prefill_tokens
        after = usage.prefill_tokens + prompt_tokens
        if interactive:
            fits = after <= budget or usage.interactive_prefill_tokens + prompt_tokens <= reserved
        else:
            fits = after <= budget - reserved
        if not fits:
            return Verdict.PREFILL
    return Verdict.FITS
