"""Shedding at enqueue: per-class queue caps by count and by queued prompt tokens, and
background requests that could no longer meet their class's first-token target."""

from __future__ import annotations

import math

from hearthgate.policies.types import ClassPolicy, QueuedRequest, Rejection


def check_enqueue(
    policy: ClassPolicy, queued: int, queued_tokens: int, req: QueuedRequest
) -> Rejection | None:
    """The rejection for ``req`` given its class queue's current depth and tokens, or None.

    The token cap counts prompt-token estimates; a request bigger than the whole cap is
    still accepted into an empty queue, otherwise it could never be served.
    """
    if policy.max_queue is not None and queued >= policy.max_queue:
        return Rejection("queue_full", policy.name, queued, queued_tokens)
    cap = policy.max_queued_tokens
    if cap is not None and queued > 0 and queued_tokens + req.prompt_tokens > cap:
        return Rejection("queue_tokens_full", policy.name, queued, queued_tokens)
    return None


def check_late(
    policy: ClassPolicy,
    ahead: int,
    drain_rate: float,
    queued: int,
    queued_tokens: int,
    service_s: float = 0.0,
) -> Rejection | None:
    """Refuse a background request that could no longer meet its class's first-token
    target: ``ahead`` requests go before it and the class finishes ``drain_rate`` requests
    a second, so it would wait ``ahead / drain_rate`` seconds, then ``service_s`` more for
    its first token (its prefill); past ``ttft_s`` it is refused, with the time until the
    queue has drained to where it could make it again (at least 1 s) as the wait to
    suggest.

    Only for classes with ``shed_late``, not interactive, with a ``ttft_s`` target; never
    before the class has a measured drain rate, and never for a request with nothing ahead
    of it, so the worker always has the class's next request at hand.
    """
    target = policy.ttft_s
    if not policy.shed_late or policy.interactive or target is None:
        return None
    if ahead <= 0 or drain_rate <= 0:
        return None
    if ahead / drain_rate + service_s <= target:
        return None
    retry = retry_after(policy, ahead, drain_rate, service_s)
    return Rejection("target_unreachable", policy.name, queued, queued_tokens, retry, ahead)


def sheds_queued(policy: ClassPolicy) -> bool:
    """Whether the class tells a standing line's backlog (``line_keeps``): ``shed_late``
    with ``shed_after_wait_s`` and ``shed_queued``, a ``ttft_s`` target, not interactive."""
    return (
        policy.shed_late
        and policy.shed_queued
        and not policy.interactive
        and policy.shed_after_wait_s is not None
        and policy.ttft_s is not None
    )


def line_keeps(policy: ClassPolicy, drain_rate: float, unanswered: int) -> int | None:
    """How many of a standing line's queued requests, oldest first, keep their place: those
    that would reach a worker within the class's ``shed_after_wait_s`` at ``drain_rate``
    requests a second, behind its ``unanswered`` requests already sent (at least the oldest
    one, so the worker always has the class's next request at hand). The rest, a backlog
    that piled up before the line stood, would wait that long again for a first token
    already late: they are better told now (``retry_after``). None: the class does
    not shed queued requests (no ``shed_late`` with ``shed_after_wait_s`` and
    ``shed_queued``, interactive, or no measured drain rate yet)."""
    after = policy.shed_after_wait_s
    if not sheds_queued(policy) or after is None or drain_rate <= 0:
        return None
    return max(1, math.floor(drain_rate * after) - unanswered + 1)


def retry_after(
    policy: ClassPolicy, ahead: int, drain_rate: float, service_s: float = 0.0
) -> float:
    """The wait to suggest to a request refused with ``ahead`` requests before it (and
    ``service_s`` of prefill after them): until the line has drained to where it could meet
    its first-token target, at least 1 s (``check_late``, ``Scheduler.trim``)."""
    return max(1.0, ahead / drain_rate + service_s - (policy.ttft_s or 0.0))


class StandingLine:
    """Whether a class's line stands, so that ``check_late`` may shed for it (the class's
    ``shed_after_wait_s``, ``after_s`` here; None: it always stands).

    The line stands once the oldest request in the class's queue has waited ``after_s``
    (work arrives faster than the box serves it, not a burst it will catch up with); and
    from then on until ``after_s`` passes without the line standing so or a request shed
    under it, so that shedding, which keeps the line short, does not end itself while the
    flood goes on. The caller asks ``stands`` for a request and then tells ``saw`` whether
    it was shed. Pure: the caller passes the time.
    """

    __slots__ = ("after_s", "stood_at")

    def __init__(self, after_s: float | None) -> None:
        self.after_s = after_s
        self.stood_at: float | None = None  # when it last stood or shed a request

    def stands(self, oldest_wait_s: float | None, now: float) -> bool:
        """Whether the line stands at ``now`` with the class's oldest queued request having
        waited ``oldest_wait_s`` (None: the queue is empty)."""
        after = self.after_s
        if after is None:
            return True
        if oldest_wait_s is not None and oldest_wait_s >= after:
            return True
        return self.stood_at is not None and now - self.stood_at < after

    def saw(self, oldest_wait_s: float | None, shed: bool, now: float) -> None:
        """Record a request decided at ``now`` while the line stood: it stands on from now
        if the request was shed or the oldest has waited ``after_s``."""
        after = self.after_s
        if after is not None and (shed or (oldest_wait_s or 0.0) >= after):
            self.stood_at = now


def is_expired(policy: ClassPolicy, req: QueuedRequest, now: float) -> bool:
    """Whether ``req`` has waited at least its class's queue timeout."""
    timeout = policy.queue_timeout_s
    return timeout is not None and now - req.arrival >= timeout
