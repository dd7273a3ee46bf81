"""The scheduler: the one pure state machine the admission controller drives.

It owns every queued request (per class, per tenant) and the bookkeeping of what it
admitted to each worker. The caller reports events with the current time; nothing here
reads a clock, sleeps or does I/O, so the same event log always gives the same decisions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from hearthgate.policies.bands import Backlog, precedence
from hearthgate.policies.budgets import Verdict, WorkerLoad, WorkerUsage, app_paced
from hearthgate.policies.class_apps import ClassApps
from hearthgate.policies.class_queue import ClassQueue
from hearthgate.policies.counts import count_down
from hearthgate.policies.fairness import FAIR_SHARES, FairShareFactory, FairShareParams
from hearthgate.policies.ordering import ORDERINGS, OrderingPolicy
from hearthgate.policies.placement import Blocked, place
from hearthgate.policies.routing import DEFAULT_POLICY, RoutingPolicy, route
from hearthgate.policies.shares import ShareLedger
from hearthgate.policies.shedding import (
    StandingLine,
    check_enqueue,
    check_late,
    line_keeps,
    retry_after,
    sheds_queued,
)
from hearthgate.policies.types import (
    Admission,
    ClassPolicy,
    QueuedRequest,
    Rejection,
    TenantPolicy,
    WorkerSnapshot,
)
from hearthgate.policies.waits import APP_CAP, HELD, NO_WORKER, WaitLedger


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One class queue for metrics and /status: depth, queued prompt tokens, oldest arrival
    (None when empty) and all tokens of the class dispatched so far (prompt + max_tokens)."""

    depth: int
    tokens: int
    oldest_arrival: float | None
    dispatched_tokens: int


FairnessSnapshot = dict[str, dict[str, float]]
"""Class -> tenant -> weighted tokens the tenant owes above its class's floor (>= 0): the
fair-share state ``Scheduler.fairness_snapshot`` exports and ``restore_fairness`` reads."""


def _amount(value: object) -> float | None:
    """``value`` as a float if it is an int or float (not a bool), finite and >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        return None
    return number + 0.0 if math.isfinite(number) and number >= 0 else None


@dataclass(slots=True)
class _Running:
    request: QueuedRequest
    worker: str
    interactive: bool
    in_prefill: bool = True
    awaiting: bool = True  # no first token yet (counted per app while interactive)
    output_charged: int = 0


class Scheduler:
    """Priority bands, starvation guard, fair sharing, ordering, budgets and shedding.

    Call ``enqueue`` when a request arrives, ``admit`` whenever something may have changed
    (arrival, first token, finish, worker snapshot), the ``on_*`` methods as the upstream
    answer progresses, and ``expire`` from one periodic ticker. A request id is known from
    its enqueue until it is cancelled, expired or finished, and never again after that.

    A tenant at its ``max_in_flight`` is passed over in every class, without holding up
    anyone else, until one of its requests finishes.

    Admission order: classes whose oldest request waited past ``max_wait_s`` (longest past
    first), then classes under their ``min_share``, then bands by priority. Inside a class,
    requests are offered in fair-share order (tenants), then ordering-policy order, each only
    to the workers in its ``workers`` set (None: any). Holds are per worker: a request that
    fits none of its workers keeps later requests of its class off them; if a shared budget
    (slots, prefill, saturation) stopped it, later background work of every class stays off
    them too (so small requests do not starve a big head), and if it is interactive, all
    later work does. Workers it cannot use stay open to the rest, so the scheduler is
    work-conserving across models.
    """

    def __init__(
        self,
        classes: Iterable[ClassPolicy],
        tenants: Iterable[TenantPolicy] = (),
        *,
        w_in: float = 1.0,
        w_out: float = 2.0,
        default_tenant_weight: float = 1.0,
        fair_shares: Mapping[str, FairShareFactory] = FAIR_SHARES,
        orderings: Mapping[str, OrderingPolicy] = ORDERINGS,
        routing: RoutingPolicy = DEFAULT_POLICY,
    ) -> None:
        """Raises ValueError for repeated class or tenant names, or unknown policy names.
        ``routing`` filters and orders each request's workers (``policies.routing``)."""
        self._orderings = orderings
        self._fair_shares = fair_shares
        policies, params, caps = self._checked(classes, tenants, w_in, w_out, default_tenant_weight)
        self._tenant_caps = caps
        self._tenant_names = frozenset(params.weights)
        self._queues: dict[str, ClassQueue] = {
            c.name: ClassQueue(c, orderings[c.ordering], fair_shares[c.fair_share](params))
            for c in policies
        }
        self._queued: dict[str, str] = {}  # request id -> class, while queued
        self._running: dict[str, _Running] = {}
        self._running_by_class: dict[str, int] = {}
        self._loads: dict[str, WorkerLoad] = {}
        self._tenant_running: dict[str, int] = {}  # in-flight count of capped tenants
        self._ledger = ShareLedger()
        self._waits = WaitLedger()
        self._class_apps = ClassApps()  # which apps share each class (the per-app cap)
        # Whether each class's line stands, for shedding (shed_after_wait_s)
        self._lines = {c.name: StandingLine(c.shed_after_wait_s) for c in policies}
        self._routing = routing

    def _checked(
        self,
        classes: Iterable[ClassPolicy],
        tenants: Iterable[TenantPolicy],
        w_in: float,
        w_out: float,
        default_tenant_weight: float,
    ) -> tuple[list[ClassPolicy], FairShareParams, dict[str, int]]:
        """The class policies, fair-share parameters and tenant caps, or ValueError."""
        weights: dict[str, float] = {}
        caps: dict[str, int] = {}
        for t in tenants:
            if t.name in weights:
                raise ValueError(f"tenant {t.name} is listed twice")
            weights[t.name] = t.weight
            if t.max_in_flight is not None:
                caps[t.name] = t.max_in_flight
        params = FairShareParams(w_in, w_out, weights, default_tenant_weight)
        policies: list[ClassPolicy] = []
        for c in classes:
            if any(p.name == c.name for p in policies):
                raise ValueError(f"class {c.name} is listed twice")
            if c.ordering not in self._orderings:
                raise ValueError(f"class {c.name}: unknown ordering {c.ordering!r}")
            if c.fair_share not in self._fair_shares:
                raise ValueError(f"class {c.name}: unknown fair_share {c.fair_share!r}")
            policies.append(c)
        if not policies:
            raise ValueError("at least one class is needed")
        return policies, params, caps

    def reconfigure(
        self,
        classes: Iterable[ClassPolicy],
        tenants: Iterable[TenantPolicy] = (),
        *,
        w_in: float = 1.0,
        w_out: float = 2.0,
        default_tenant_weight: float = 1.0,
        routing: RoutingPolicy = DEFAULT_POLICY,
    ) -> None:
        """Apply new settings in place (a settings reload), as if the scheduler had been
        built with them, keeping every queued and in-flight request and the fair-share
        counters.

        A class's new policy applies to its queued requests from the next call on (new
        priority, limits, timeouts; lanes re-sorted by a new ordering). New tenant weights
        and w_in/w_out weigh later service; counters so far stay in the old weighted
        tokens. A class whose fair_share kind changes starts a fresh one. New caps count
        the tenants' requests already in flight. A new class starts empty, classes come in
        the new order. Raises ValueError and changes nothing for what the constructor
        refuses, or when a class left out still has requests queued or in flight (remove
        it once it is idle)."""
        policies, params, caps = self._checked(classes, tenants, w_in, w_out, default_tenant_weight)
        names = {c.name for c in policies}
        busy = sorted(
            name for name, q in self._queues.items() if name not in names and self.active(name)
        )
        if busy:
            raise ValueError(
                f"class {', '.join(busy)} still has requests queued or in flight; "
                "remove it once it is idle"
            )
        queues: dict[str, ClassQueue] = {}
        for c in policies:
            q = self._queues.get(c.name)
            if q is None:
                fair = self._fair_shares[c.fair_share](params)
                q = ClassQueue(c, self._orderings[c.ordering], fair)
            elif c.fair_share != q.policy.fair_share:
                q.reconfigure(
                    c, self._orderings[c.ordering], self._fair_shares[c.fair_share](params)
                )
            else:
                q.set_fair_params(params)
                q.reconfigure(c, self._orderings[c.ordering])
            queues[c.name] = q
        lines: dict[str, StandingLine] = {}
        for c in policies:  # when each line stood carries over; a new rule applies from now
            line = lines[c.name] = self._lines.get(c.name) or StandingLine(None)
            line.after_s = c.shed_after_wait_s
        self._queues = queues
        self._lines = lines
        self._tenant_caps = caps
        self._tenant_names = frozenset(params.weights)
        running: dict[str, int] = {}
        for r in self._running.values():
            if r.request.tenant in caps:
                running[r.request.tenant] = running.get(r.request.tenant, 0) + 1
        self._tenant_running = running
        self._routing = routing

    # ----------------------------------------------------------------- queue events

    def enqueue(
        self,
        req: QueuedRequest,
        now: float,
        drain_rate: float = 0.0,
        service_s: float = 0.0,
        unanswered: int = 0,
    ) -> Rejection | None:
        """Queue ``req``, or return why it is shed: the class queue is at its count/token
        cap, or (``shed_late`` classes) the requests ahead of it, at ``drain_rate``
        requests of its class finished a second, plus ``service_s`` for its own prefill,
        would keep it past its first-token target (``policies.shedding.check_late``; rate
        0: unknown, never shed for that; with ``shed_after_wait_s``, only while the class's
        line stands, ``policies.shedding.StandingLine``). Ahead of it are the class's queued
        requests that would go first and ``unanswered``, the class's requests already sent
        to workers whose first token (a whole answer, when not streamed) has not come: a
        class no budget holds back, such as embeddings, has its whole line waiting in the
        worker, not in this queue.

        Raises ValueError for an unknown class or an id the scheduler already holds.
        """
        q = self._queues.get(req.cls)
        if q is None:
            raise ValueError(f"request {req.id}: unknown class {req.cls!r}")
        if req.id in self._queued or req.id in self._running:
            raise ValueError(f"request {req.id} is already queued or in flight")
        self._class_apps.arrived(req.cls, req.tenant, now)
        oldest = q.oldest()
        waited = None if oldest is None else now - oldest.arrival
        late = None
        line = self._lines[req.cls]
        if line.stands(waited, now):
            ahead = q.ahead_of_new(req.tenant) + unanswered
            late = check_late(q.policy, ahead, drain_rate, len(q), q.tokens, service_s)
            line.saw(waited, late is not None, now)
        rejection = check_enqueue(q.policy, len(q), q.tokens, req) or late
        if rejection is not None:
            return rejection
        if not len(q):
            self._ledger.open(req.cls)
        q.push(req)
        self._queued[req.id] = req.cls
        return None

    def cancel(self, req_id: str, now: float) -> bool:
        """Remove a queued request as if it had never been queued; False if it is not
        queued (in-flight requests end through ``on_finish``)."""
        return self._drop(req_id) is not None

    def expire(self, now: float) -> list[QueuedRequest]:
        """Remove and return the queued requests that reached their class's queue timeout,
        by (arrival, id). They leave the same (absent) trace as cancelled ones."""
        out: list[QueuedRequest] = []
        for q in self._queues.values():
            for req in q.expired(now):
                self._drop(req.id)
                out.append(req)
        out.sort(key=lambda r: (r.arrival, r.id))
        return out

    def trim(
        self,
        now: float,
        drain_rate: Callable[[str], float],
        unanswered: Mapping[str, int],
    ) -> list[tuple[QueuedRequest, Rejection]]:
        """Remove and return, each with why, the queued requests of every class whose line
        stands that it no longer keeps (``policies.shedding.line_keeps``: they would wait
        ``shed_after_wait_s`` again), newest first. ``drain_rate``: a class's requests
        finished a second; ``unanswered``: its requests sent to workers and not yet
        answered, ahead of every queued one."""
        out: list[tuple[QueuedRequest, Rejection]] = []
        for name, q in self._queues.items():
            oldest = q.oldest()
            if oldest is None or not sheds_queued(q.policy):  # no drain rate asked for then
                continue
            line = self._lines[name]
            waited = now - oldest.arrival
            if not line.stands(waited, now):
                continue
            rate = drain_rate(name)
            sent = unanswered.get(name, 0)
            keep = line_keeps(q.policy, rate, sent)
            if keep is None or keep >= len(q):
                continue
            tail = list(enumerate(q.newest(keep), start=keep + sent))
            for _, req in tail:
                self._drop(req.id)
            for ahead, req in reversed(tail):
                retry = retry_after(q.policy, ahead, rate)
                out.append(
                    (req, Rejection("target_unreachable", name, len(q), q.tokens, retry, ahead))
                )
            line.saw(waited, True, now)
        return out

    def _drop(self, req_id: str) -> QueuedRequest | None:
        cls = self._queued.pop(req_id, None)
        if cls is None:
            return None
        q = self._queues[cls]
        req = q.remove(req_id)
        if not len(q):
            self._ledger.close(cls)
        return req

    # ------------------------------------------------------------------- admission

    def admit(self, now: float, workers: Sequence[WorkerSnapshot]) -> list[Admission]:
        """Admit queued requests while one fits some worker; the admissions in order.

        ``workers`` are the current snapshots (limits, health, scraped gauges); worker
        names must be unique. Each admitted request is charged its prompt estimate, counts
        against the worker's budgets until ``on_first_token``/``on_finish``, and must be
        reported to ``on_finish`` exactly once.
        """
        seen: set[str] = set()
        for w in workers:
            if w.name in seen:
                raise ValueError(f"worker {w.name} appears twice")
            seen.add(w.name)
            if w.name not in self._loads:
                self._loads[w.name] = WorkerLoad(w.name)
        out: list[Admission] = []
        while True:
            waits: dict[str, str] = {}
            admission = self._admit_one(now, workers, waits)
            if admission is None:
                self._waits.settle(now, waits)
                return out
            out.append(admission)

    def _admit_one(
        self, now: float, workers: Sequence[WorkerSnapshot], waits: dict[str, str]
    ) -> Admission | None:
        """One admission, else None with ``waits`` filled: per class with a queue, what
        kept its head (its first candidate) off every worker (``policies.waits``)."""
        backlogs = []
        for name, q in self._queues.items():
            oldest = q.oldest()
            if oldest is not None:
                backlogs.append(Backlog(q.policy, oldest.arrival, self._ledger.share(name)))
        if not backlogs:
            return None
        usage = {w.name: self._loads[w.name].usage() for w in workers}
        names = frozenset(usage)
        # Holds are per worker: a head blocked on some workers keeps later work off those
        # workers only, so work that other workers can take still flows.
        held_all: set[str] = set()
        held_background: set[str] = set()
        at_cap = {
            t for t, cap in self._tenant_caps.items() if self._tenant_running.get(t, 0) >= cap
        }
        # (app, class, seqs, capped) -> workers
        paced_for: dict[tuple[str, str, int, bool], set[str]] = {}
        for name in precedence(backlogs, now):
            q = self._queues[name]
            interactive = q.policy.interactive
            # Workers this class cannot use in this pass.
            closed = set(held_all) if interactive else held_all | held_background
            for cand in q.candidates(skip=at_cap):
                head = name not in waits
                if len(closed) >= len(names):
                    if head:
                        waits[name] = HELD if names else NO_WORKER
                    break
                # The router picks the role tier by health (a long prompt waits for a busy
                # long-prefill worker rather than spilling onto a general one); the budgets
                # then decide which of those it fits, best score first.
                routed = route(workers, cand, self._routing)
                allowed = routed - closed
                capped = True  # only an interactive request's app can be held to the cap
                if interactive and allowed:
                    # Workers where its app is at the per-app pacing cap (held to it only
                    # while another app shares the class: policies.class_apps) or floods:
                    # only this app's work waits for them, other apps' requests go first.
                    capped = self._class_apps.shared(name, cand.tenant, now)
                    key = (cand.tenant, name, cand.sequences, capped)
                    paced = paced_for.get(key)
                    if paced is None:
                        paced = paced_for[key] = {
                            w.name
                            for w in workers
                            if app_paced(
                                w, usage[w.name], cand.tenant, name, cand.sequences, capped
                            )
                        }
                    allowed -= paced
                if not allowed:
                    if head and not routed:
                        waits[name] = NO_WORKER
                    elif head:
                        waits[name] = HELD if routed <= closed else Verdict.APP_PACED.value
                    continue  # its workers are held, down, paced, or none of them is known
                spot = place(
                    workers,
                    usage,
                    name,
                    interactive,
                    cand.prompt_tokens,
                    allowed,
                    self._routing,
                    cand.sequences,
                    cand.tenant,
                    capped,
                )
                if spot.worker is not None:
                    self._start(cand, spot.worker, interactive)
                    return Admission(cand, spot.worker)
                if head:
                    waits[name] = NO_WORKER if spot.limit is None else spot.limit.value
                # Later requests of this class wait for these workers behind this one.
                closed |= allowed
                if spot.blocked is Blocked.SHARED:
                    # ...and so does later work of other classes (background work only, when
                    # this one is background).
                    (held_all if interactive else held_background).update(allowed)
            waits.setdefault(name, APP_CAP)  # no candidate: each app at its max_in_flight
        return None

    def _start(self, req: QueuedRequest, worker: str, interactive: bool) -> None:
        q = self._queues[req.cls]
        # Charge before taking: when the tenant leaves the backlog, VTC remembers its
        # counter including this dispatch.
        q.charge(req.tenant, req.prompt_tokens, 0)
        q.take(req.id)
        del self._queued[req.id]
        self._ledger.record(req.cls, req.dispatched_tokens)
        if not len(q):
            self._ledger.close(req.cls)
        self._loads[worker].add(req.cls, interactive, req.prompt_tokens, req.sequences, req.tenant)
        self._running[req.id] = _Running(req, worker, interactive)
        self._running_by_class[req.cls] = self._running_by_class.get(req.cls, 0) + 1
        if req.tenant in self._tenant_caps:
            self._tenant_running[req.tenant] = self._tenant_running.get(req.tenant, 0) + 1

    # ------------------------------------------------------------- in-flight events

    def on_first_token(self, req_id: str, now: float) -> bool:
        """The request's first token arrived: release its prefill tokens. False if the id
        is not in flight or its prefill was already released."""
        run = self._running.get(req_id)
        if run is None or not run.in_prefill:
            return False
        self._end_prefill(run)
        return True

    def on_answered(self, req_id: str) -> bool:
        """The request's first token arrived (not only its early prefill release), or
        the estimate of its prefill says so for an answer that does not stream: it no
        longer counts as a light app's request waiting (``WorkerSnapshot.flood_yields``).
        True if that changed what admission sees (an interactive request, first time)."""
        run = self._running.get(req_id)
        if run is None or not run.awaiting:
            return False
        return self._answered(run)

    def _answered(self, run: _Running) -> bool:
        run.awaiting = False
        if not run.interactive:
            return False
        self._loads[run.worker].answered(run.request.cls, run.request.tenant)
        return True

    def on_progress(self, req_id: str, output_tokens_so_far: int, now: float) -> None:
        """``output_tokens_so_far`` tokens have streamed: charge the new ones to the tenant.
        Any output implies the first token arrived. Ignored for unknown ids and for counts
        that do not grow."""
        run = self._running.get(req_id)
        if run is None:
            return
        if output_tokens_so_far > 0 and run.in_prefill:
            self._end_prefill(run)
        if output_tokens_so_far > 0 and run.awaiting:
            self._answered(run)
        new = output_tokens_so_far - run.output_charged
        if new > 0:
            req = run.request
            self._queues[req.cls].charge(req.tenant, 0, new)
            run.output_charged = output_tokens_so_far

    def on_finish(
        self, req_id: str, prompt_tokens: int | None, output_tokens: int | None, now: float
    ) -> bool:
        """The request ended (completion, error, disconnect): release its slot and any
        prefill tokens, and correct the tenant's charge to the actual counts (None: keep
        the estimate / what was streamed). True the first time, False for unknown or
        already finished ids."""
        run = self._running.pop(req_id, None)
        if run is None:
            return False
        req = run.request
        count_down(self._running_by_class, req.cls)
        if run.in_prefill:
            self._end_prefill(run)
        if run.awaiting:
            self._answered(run)
        self._loads[run.worker].remove(req.cls, run.interactive, req.sequences, req.tenant)
        if req.tenant in self._tenant_running:
            count_down(self._tenant_running, req.tenant)
        prompt_fix = 0 if prompt_tokens is None else prompt_tokens - req.prompt_tokens
        output_fix = 0 if output_tokens is None else output_tokens - run.output_charged
        if prompt_fix or output_fix:
            self._queues[req.cls].charge(req.tenant, prompt_fix, output_fix)
        return True

    def _end_prefill(self, run: _Running) -> None:
        run.in_prefill = False
        req = run.request
        self._loads[run.worker].end_prefill(run.interactive, req.prompt_tokens, req.tenant)

    # ------------------------------------------------------------------------ views

    @property
    def classes(self) -> Mapping[str, ClassPolicy]:
        """Every configured class by name, in configuration order."""
        return {name: q.policy for name, q in self._queues.items()}

    def active(self, cls: str) -> bool:
        """Whether ``cls`` has requests queued or in flight."""
        q = self._queues.get(cls)
        return (q is not None and len(q) > 0) or cls in self._running_by_class

    def class_names(self) -> Iterable[str]:
        """The configured classes' names (a view, nothing copied)."""
        return self._queues.keys()

    def is_interactive(self, name: str) -> bool:
        """Whether the class is interactive (False for a class no longer configured)."""
        q = self._queues.get(name)
        return q is not None and q.policy.interactive

    def ttft_target(self, name: str) -> float | None:
        """The class's first-token target in seconds (None: none, or no such class)."""
        q = self._queues.get(name)
        return None if q is None else q.policy.ttft_s

    def has_class(self, name: str) -> bool:
        """Whether ``name`` is a configured class (``enqueue`` refuses others)."""
        return name in self._queues

    @property
    def queued_count(self) -> int:
        """Requests queued in all classes."""
        return len(self._queued)

    @property
    def in_flight_count(self) -> int:
        """Requests admitted and not yet finished, on all workers."""
        return len(self._running)

    def is_queued(self, req_id: str) -> bool:
        """Whether ``req_id`` is waiting in a queue."""
        return req_id in self._queued

    def ahead(self, req_id: str) -> int | None:
        """Roughly how many queued requests go before ``req_id``: those of higher-priority
        classes and those of its own class that arrived before it (the exact order also
        depends on fair shares, starvation guards and which workers are free). None if it
        is not queued."""
        cls = self._queued.get(req_id)
        if cls is None:
            return None
        q = self._queues[cls]
        higher = sum(len(o) for o in self._queues.values() if o.policy.priority < q.policy.priority)
        return higher + q.arrived_before(req_id)

    def worker_of(self, req_id: str) -> str | None:
        """The worker an in-flight request was admitted to, None if it is not in flight."""
        run = self._running.get(req_id)
        return None if run is None else run.worker

    def queue_stats(self) -> dict[str, QueueStats]:
        """Each configured class's queue, in configuration order."""
        out: dict[str, QueueStats] = {}
        for name, q in self._queues.items():
            oldest = q.oldest()
            out[name] = QueueStats(
                depth=len(q),
                tokens=q.tokens,
                oldest_arrival=None if oldest is None else oldest.arrival,
                dispatched_tokens=self._ledger.dispatched(name),
            )
        return out

    def queue_waits(self, now: float) -> dict[tuple[str, str], float]:
        """Seconds each class's oldest request has waited so far, by the limit in its way
        (class, reason) -> seconds (``policies.waits``), up to ``now``."""
        return self._waits.seconds(now)

    def tenant_counters(self) -> dict[str, dict[str, float]]:
        """Class -> tenant -> fair-share counter (weighted tokens), tenants sorted."""
        return {name: dict(sorted(q.counters().items())) for name, q in self._queues.items()}

    def worker_usage(self) -> dict[str, WorkerUsage]:
        """Budget use of every worker seen in a snapshot so far, by name."""
        return {name: self._loads[name].usage() for name in sorted(self._loads)}

    # ------------------------------------------------------------------ persistence

    def fairness_snapshot(self) -> FairnessSnapshot:
        """The fair-share state as plain JSON-able data, for ``restore_fairness`` after a
        restart: class -> tenant -> how far the tenant's counter is above its class's floor
        (weighted tokens, finite, >= 0), every configured class, tenants sorted.

        For VTC the floor is the counter a tenant that becomes backlogged now is lifted to
        (the smallest backlogged counter, else that of the last tenant to leave the
        backlog). Only the part above it matters: choices compare counters, and a counter
        below the floor is lifted to it anyway, so that lag is credit banked while idle,
        which VTC never grants. FCFS classes keep no state ({}). The scheduler keeps no
        per-tenant token totals (``tenant_counters`` are weighted); those are the caller's.
        """
        return {name: q.fairness_snapshot() for name, q in self._queues.items()}

    def restore_fairness(self, snapshot: object, *, extra_tenants: Iterable[str] = ()) -> None:
        """Replace the fair-share state with a ``fairness_snapshot`` of an earlier run.

        Call it on a scheduler with nothing queued or in flight (ValueError otherwise),
        typically right after building it. Each VTC class then behaves exactly as the
        snapshotted one would have if its backlog had emptied at that moment: floor 0, each
        tenant's counter its amount above the old floor. A tenant that had consumed more is
        served after the tenants waiting when it comes back until that difference is made
        up; a lag below the floor is not restored (VTC's lift bounds it while running too);
        a tenant missing from the snapshot starts as a new tenant (at the floor). As while
        running, a tenant that becomes backlogged while only tenants that owe more are
        waiting is lifted to the smallest of their counters. (A plain copy of the counters
        would restore no floor: an idle tenant with an old low counter that comes back first
        would be owed everyone's service since; not restoring gives heavy tenants a fresh
        start.)

        Classes not configured here, tenants neither configured (``tenants``) nor named in
        ``extra_tenants`` (say the gateway's anonymous tenant), values that are not finite
        numbers >= 0 (bools, strings, NaN, inf, negatives) and malformed structure are
        ignored: the content of ``snapshot`` never raises. Configured classes absent from it
        start afresh. Weights are not recorded: a tenant whose weight changed keeps its
        debt in the old weighted tokens.
        """
        if self._queued or self._running:
            raise ValueError("restore_fairness needs a scheduler with nothing queued or in flight")
        known = self._tenant_names | frozenset(extra_tenants)
        given = snapshot if isinstance(snapshot, Mapping) else {}
        for name, q in self._queues.items():
            raw = given.get(name)
            state: dict[str, float] = {}
            if isinstance(raw, Mapping):
                for tenant, value in raw.items():
                    amount = _amount(value)
                    if isinstance(tenant, str) and tenant in known and amount is not None:
                        state[tenant] = amount
            q.restore_fairness(state)

    def __repr__(self) -> str:
        queued = " ".join(f"{n}={len(q)}" for n, q in self._queues.items() if len(q))
        running = " ".join(
            f"{u.name}={u.in_flight}" for u in self.worker_usage().values() if u.in_flight
        )
        return (
            f"Scheduler(queued={self.queued_count} [{queued}], "
            f"in_flight={self.in_flight_count} [{running}])"
        )
