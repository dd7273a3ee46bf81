"""Shedding at enqueue: per-class queue caps by count and by queued prompt tokens."""

from __future__ import annotations

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


def is_expired(policy: ClassPolicy, req: QueuedRequest, now: float) -> bool:
    """Whether ``req`` has waited at least its class's queue timeout."""
    timeout = policy.queue_timeout_s
    return timeout is not None and now - req.arrival >= timeout
