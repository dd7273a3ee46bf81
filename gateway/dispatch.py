"""The attempts of one request that got past classification: admit it on a worker, forward
it (or hand it to the embeddings coalescer), and when an attempt fails before the client got
anything, try again where ``policies/failover.py`` says, or answer the error.

Runs inside the request's :class:`gateway.lease.Lease` (``Gateway.serve``), which gives back
whatever an attempt held.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

from starlette.responses import Response

from hearthgate.gateway.classify import Classification
from hearthgate.gateway.embed_batch import mergeable
from hearthgate.gateway.errors import BadRequest, ClientGone, NoWorkerAvailable, class_gone
from hearthgate.gateway.lease import FirstByteTimeout, Lease, WorkerLost
from hearthgate.gateway.parse import ParsedRequest
from hearthgate.gateway.proxy import AnswerBroke
from hearthgate.gateway.upstream import WorkerUnreachable
from hearthgate.policies.failover import Failure, Retry, next_step
from hearthgate.policies.types import QueuedRequest

if TYPE_CHECKING:
    from hearthgate.gateway.core import Gateway
    from hearthgate.gateway.workers import WorkerState

log = logging.getLogger("hearthgate")


def serving_workers(gw: Gateway, parsed: ParsedRequest) -> list[WorkerState]:
    """The workers that may answer ``parsed``: those serving its model; for a follow-up
    naming a stored answer (``previous_response_id``), only the worker that holds it.
    Raises BadRequest when that worker is gone (removed, or down: vLLM keeps stored
    answers in memory) or unknown while several could hold it."""
    candidates = gw.pool.for_model(parsed.model)
    previous = parsed.body.get("previous_response_id") if parsed.spec.stores_answers else None
    if not isinstance(previous, str):
        return candidates
    home = gw.homes.home(previous)
    if home is None:
        if len(candidates) <= 1:
            return candidates  # the only worker that could hold it answers for itself
        raise BadRequest(
            f"previous response {previous!r} is unknown to this gateway (it may have been "
            "restarted since); send the conversation again without previous_response_id",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    held = [w for w in candidates if w.name == home]
    if not held or held[0].up is False:
        raise BadRequest(
            f"previous response {previous!r} was stored by worker {home}, which is gone "
            "(down or removed, and its stored responses with it); send the conversation "
            "again without previous_response_id",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return held


async def dispatch(
    gw: Gateway,
    lease: Lease,
    route: str,
    parsed: ParsedRequest,
    c: Classification,
    received_at: float,
) -> Response:
    """The answer to ``parsed`` (the worker's, relayed, or the error to send). Raises
    ClientGone when the client left, GatewayError for an error answer."""
    cls = gw.settings.classes.get(c.cls)
    if cls is None:  # a reload removed the class while the request was being read
        raise class_gone(c.cls, gw.settings.health.retry_after_s)
    first_byte_s = (
        cls.first_byte_timeout_ms / 1000
        if cls.first_byte_timeout_ms is not None
        else gw.settings.upstream.first_byte_timeout_s
    )
    done = functools.partial(gw.record_result, route, parsed.model, c)
    # Mergeable embeddings go through the coalescer (a bad input is refused here, alone).
    batching = mergeable(parsed)
    candidates = serving_workers(gw, parsed)
    workers = frozenset(w.name for w in candidates)
    n = parsed.body.get("n")
    sequences = n if isinstance(n, int) and n > 1 else 1
    failed: set[str] = set()
    attempt = 0
    while True:
        attempt += 1
        req = QueuedRequest(
            id=f"r{next(gw.request_ids)}",
            cls=c.cls,
            tenant=c.app,
            arrival=received_at,
            priority=cls.priority,
            prompt_tokens=c.prompt_tokens,
            max_tokens=c.max_tokens,
            workers=workers,
            endpoint=parsed.endpoint,
            pooling=parsed.spec.pooling,
            sequences=sequences,
        )
        healthy = gw.pool.any_up(workers)
        try:
            worker = await lease.admit(req, eligible_healthy=healthy)
        except ClientGone:
            gw.metrics.rejected.labels(c.cls, "disconnected").inc()
            raise
        priority = gw.admission.upstream_priority(req, worker.name)
        answer: tuple[int, bytes, str] | None = None
        broke: AnswerBroke | None = None
        try:
            if batching is not None:
                return await gw.coalescer.forward(
                    batching,
                    worker,
                    lease.hand_over(),
                    c.cls,
                    c.prompt_tokens,
                    received_at,
                    done,
                    lease.wait_gone,
                    priority=priority,
                )
            return await gw.proxy.forward(lease, parsed, received_at, done, priority, first_byte_s)
        except WorkerUnreachable as exc:
            answer = exc.answer
            if answer is not None:
                failure = Failure.ERROR_ANSWER
            else:
                failure = Failure.REFUSED if exc.refused else Failure.DROPPED
        except AnswerBroke as exc:
            log.info("answer from %s broke off before the first byte", worker.name)
            failure, broke = Failure.BROKEN, exc
        except WorkerLost as exc:
            if not exc.failover:
                raise exc.error from None
            failure = Failure.LOST
        except FirstByteTimeout:
            failure = Failure.SILENT
            log.warning(
                "worker %s sent nothing within %.1f s; failing over", worker.name, first_byte_s
            )
        lease.end_attempt(0, 0)
        failed.add(worker.name)
        worker.failovers += 1
        serving = [(w.name, w.up is not False) for w in candidates]
        step = next_step(serving, frozenset(failed), failure, attempt)
        if isinstance(step, Retry):
            log.info("retrying on %s (attempt %d)", ", ".join(sorted(step.workers)), attempt)
            workers = step.workers
            continue
        if step.pass_answer and answer is not None:
            status, content, ctype = answer
            gw.metrics.count(route, parsed.model, status)
            return Response(content, status, {"x-hearthgate-worker": worker.name}, media_type=ctype)
        if broke is not None and worker.up is not False:
            raise broke.error  # the worker is up and keeps breaking its answers: 502
        if failure is Failure.SILENT:
            raise NoWorkerAvailable(
                f"worker {worker.name} sent nothing within {first_byte_s:g} s and no other "
                "worker serves this model; try again shortly",
                retry_after_s=gw.settings.health.retry_after_s,
            )
        raise NoWorkerAvailable(
            "no worker that serves this model is reachable; try again shortly",
            retry_after_s=gw.settings.health.retry_after_s,
        )
