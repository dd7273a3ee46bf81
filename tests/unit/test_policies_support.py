"""Builders, a fake engine and an event-log runner shared by the policies tests.

Holds no tests itself; the name only keeps it inside the ``test_policies_*`` files.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from hypothesis import Phase, settings
from hypothesis import strategies as st

from hearthgate.policies import (
    Admission,
    ClassPolicy,
    QueuedRequest,
    Scheduler,
    TenantPolicy,
    WorkerBudget,
    WorkerSnapshot,
)

VOICE = ClassPolicy("voice", 0, interactive=True, ttft_s=0.3, itl_s=0.05)
CHAT = ClassPolicy("chat", 1, interactive=True, ttft_s=0.8, itl_s=0.08)
RAG = ClassPolicy("rag", 2, ttft_s=3.0, itl_s=0.15)
EMBED = ClassPolicy("embed", 3)
BATCH = ClassPolicy("batch", 4)
CLASSES = (VOICE, CHAT, RAG, EMBED, BATCH)


def req(
    id: str,
    cls: str = "chat",
    tenant: str = "a",
    arrival: float = 0.0,
    prompt: int = 10,
    max_tokens: int = 10,
    priority: int = 0,
    deadline: float | None = None,
) -> QueuedRequest:
    return QueuedRequest(id, cls, tenant, arrival, priority, prompt, max_tokens, deadline)


def worker(
    name: str = "w0",
    *,
    healthy: bool = True,
    waiting: float | None = None,
    kv: float | None = None,
    **limits: Any,
) -> WorkerSnapshot:
    return WorkerSnapshot(name, healthy, WorkerBudget(**limits), waiting, kv)


def classes(*overrides: ClassPolicy, base: Sequence[ClassPolicy] = CLASSES) -> list[ClassPolicy]:
    """The default classes with some replaced by name."""
    by_name = {c.name: c for c in base}
    for c in overrides:
        by_name[c.name] = c
    return list(by_name.values())


def with_(policy: ClassPolicy, **changes: Any) -> ClassPolicy:
    return replace(policy, **changes)


@dataclass
class Job:
    request: QueuedRequest
    worker: str
    target: int
    produced: int = 0


@dataclass
class Engine:
    """A fake vLLM: one tick of prefill, then one output token per tick until the target.

    ``tick`` first advances running jobs (first token, progress, finish) and then admits.
    """

    sched: Scheduler
    workers: list[WorkerSnapshot]
    output_of: Callable[[QueuedRequest], int] = lambda r: r.max_tokens
    actual_prompt_of: Callable[[QueuedRequest], int] = lambda r: r.prompt_tokens
    jobs: dict[str, Job] = field(default_factory=dict)
    admitted: list[tuple[float, Admission]] = field(default_factory=list)

    def tick(self, now: float) -> list[Admission]:
        for rid in list(self.jobs):
            job = self.jobs[rid]
            if job.produced < job.target:
                job.produced += 1
                if job.produced == 1:
                    self.sched.on_first_token(rid, now)
                self.sched.on_progress(rid, job.produced, now)
            if job.produced >= job.target:
                prompt = self.actual_prompt_of(job.request)
                assert self.sched.on_finish(rid, prompt, job.produced, now)
                del self.jobs[rid]
        out = self.sched.admit(now, self.workers)
        for a in out:
            self.jobs[a.request.id] = Job(a.request, a.worker, self.output_of(a.request))
            self.admitted.append((now, a))
        return out


# ------------------------------------------------------------------ event-log runner

OP_CLASSES = (
    VOICE,
    with_(CHAT, max_queue=6, ordering="edf"),
    with_(RAG, max_queued_tokens=3000, queue_timeout_s=4.0, max_wait_s=3.0),
    with_(EMBED, min_share=0.2),
    with_(BATCH, queue_timeout_s=6.0, fair_share="fcfs"),
)
OP_TENANTS = (TenantPolicy("t0", 1.0), TenantPolicy("t1", 2.0), TenantPolicy("t2", 0.5))

budgets = st.builds(
    WorkerBudget,
    max_in_flight=st.one_of(st.none(), st.integers(2, 6)),
    max_in_flight_per_class=st.dictionaries(
        st.sampled_from([c.name for c in OP_CLASSES]), st.integers(1, 2), max_size=3
    ),
    prefill_token_budget=st.one_of(st.none(), st.integers(300, 1500)),
    interactive_reserved_slots=st.just(1),
    interactive_reserved_prefill_tokens=st.integers(0, 300),
    max_scraped_waiting=st.one_of(st.none(), st.just(2.0)),
    max_kv_usage=st.one_of(st.none(), st.just(0.9)),
)


def log_settings(examples: int) -> settings:
    """Settings for the event-log properties. Shrinking is off: a log of index-based picks
    shrinks for minutes, so a failure is reported as found (the assertion names the rule)."""
    return settings(
        max_examples=examples,
        deadline=None,
        phases=(Phase.explicit, Phase.reuse, Phase.generate),
    )


class Op(NamedTuple):
    """One event of a generated log; each kind reads only the fields it needs."""

    kind: str
    pick: int  # which class / tenant / worker / in-flight / queued request
    size: int  # prompt tokens
    out: int  # max_tokens, output tokens so far
    delta: int  # actual prompt minus the estimate, at finish
    dt: float  # time step
    flag: bool  # health
    load: float  # scraped kv usage (the scraped waiting is 5 when flag, else 0)


# Repeats weight the draw: arrivals, admissions and completions are the common events.
_OP_MIX = (
    ["enqueue"] * 6
    + ["admit"] * 4
    + ["first"] * 2
    + ["finish"] * 2
    + ["tick"] * 2
    + ["progress", "cancel", "expire", "gauge", "health"]
)
_STEPS = (0.1, 0.5, 1.0, 2.5, 5.0)


def make_op(kind: str, pick: int, size: int, out: int) -> Op:
    """An op from four drawn numbers; the rarer fields are derived (fewer draws keep the
    generation fast)."""
    return Op(
        kind,
        pick,
        size,
        out,
        delta=(out * 37 + pick) % 101 - 50,
        dt=_STEPS[pick % len(_STEPS)],
        flag=pick % 3 != 0,
        load=(size % 101) / 100,
    )


ops = st.lists(
    st.builds(
        make_op,
        st.sampled_from(_OP_MIX),
        st.integers(0, 60),
        st.integers(0, 2000),
        st.integers(0, 64),
    ),
    min_size=20,
    max_size=100,
)


def _adjust_budget(budget: WorkerBudget) -> WorkerBudget:
    if budget.max_in_flight is None:
        budget = replace(budget, interactive_reserved_slots=0)
    if budget.prefill_token_budget is None:
        budget = replace(budget, interactive_reserved_prefill_tokens=0)
    return budget


@dataclass
class Mirror:
    """The test's own account of what is in flight: id -> (request, worker, in_prefill)."""

    running: dict[str, tuple[QueuedRequest, str, bool]] = field(default_factory=dict)
    queued: dict[str, QueuedRequest] = field(default_factory=dict)


AfterAdmit = Callable[[Scheduler, list[WorkerSnapshot], Mirror, list[Admission]], None]


@dataclass
class LogRun:
    sched: Scheduler
    trace: list[Any]
    mirror: Mirror
    now: float


def run_log(
    log: Sequence[Op],
    budget_list: Sequence[WorkerBudget],
    *,
    after_admit: AfterAdmit | None = None,
    sched: Scheduler | None = None,
    reverse_workers: bool = False,
) -> LogRun:
    """Apply ``log`` to a fresh scheduler; the trace of every decision and return value.

    A ``ghost`` op enqueues a request and cancels it at once; it adds nothing to the trace.
    ``reverse_workers`` hands the snapshots to ``admit`` in reverse order.
    """
    sched = sched or Scheduler(OP_CLASSES, OP_TENANTS)
    workers = [WorkerSnapshot(f"w{i}", True, _adjust_budget(b)) for i, b in enumerate(budget_list)]
    mirror = Mirror()
    queued = mirror.queued
    eligibility: list[frozenset[str] | None] = [None, None, frozenset({"w0"}), frozenset({"w1"})]
    outputs: dict[str, int] = {}
    now = 0.0
    serial = ghosts = 0
    trace: list[Any] = []
    for op in log:
        kind = op.kind
        if kind == "enqueue":
            serial += 1
            r = req(
                f"r{serial:03d}",
                OP_CLASSES[op.pick % len(OP_CLASSES)].name,
                OP_TENANTS[op.pick % len(OP_TENANTS)].name,
                now,
                op.size,
                op.out,
            )
            r = replace(r, workers=eligibility[op.delta % len(eligibility)])
            rejection = sched.enqueue(r, now)
            trace.append(("enqueue", r.id, rejection))
            if rejection is None:
                queued[r.id] = r
        elif kind == "ghost":
            ghosts += 1
            tenants = [t.name for t in OP_TENANTS] + ["newcomer"]
            g = req(
                f"ghost{ghosts:03d}",
                OP_CLASSES[op.pick % len(OP_CLASSES)].name,
                tenants[op.out % len(tenants)],
                now,
                op.size,
                op.out,
            )
            if sched.enqueue(g, now) is None:
                assert sched.cancel(g.id, now)
        elif kind == "admit":
            admissions = sched.admit(now, workers[::-1] if reverse_workers else workers)
            trace.append(("admit", [(a.request.id, a.worker) for a in admissions]))
            for a in admissions:
                del queued[a.request.id]
                mirror.running[a.request.id] = (a.request, a.worker, True)
            if after_admit is not None:
                after_admit(sched, workers, mirror, admissions)
        elif kind in ("first", "progress", "finish") and mirror.running:
            ids = list(mirror.running)
            rid = ids[op.pick % len(ids)]
            r, w, _ = mirror.running[rid]
            if kind == "first":
                trace.append(("first", rid, sched.on_first_token(rid, now)))
                mirror.running[rid] = (r, w, False)
            elif kind == "progress":
                outputs[rid] = outputs.get(rid, 0) + 1 + op.out % 8
                sched.on_progress(rid, outputs[rid], now)
                mirror.running[rid] = (r, w, False)
            else:
                actual_prompt = max(0, r.prompt_tokens + op.delta)
                done = sched.on_finish(rid, actual_prompt, outputs.get(rid, 0), now)
                again = sched.on_finish(rid, actual_prompt, 5, now)
                trace.append(("finish", rid, done, again))
                del mirror.running[rid]
        elif kind == "cancel" and queued:
            rid = list(queued)[op.pick % len(queued)]
            del queued[rid]
            trace.append(("cancel", rid, sched.cancel(rid, now), sched.cancel(rid, now)))
        elif kind == "expire":
            gone = sched.expire(now)
            trace.append(("expire", [r.id for r in gone]))
            for r in gone:
                del queued[r.id]
        elif kind == "tick":
            now += op.dt
        elif kind == "gauge":
            i = op.pick % len(workers)
            waiting = 5.0 if op.flag else 0.0
            workers[i] = replace(workers[i], scraped_waiting=waiting, kv_usage=op.load)
        elif kind == "health":
            i = op.pick % len(workers)
            workers[i] = replace(workers[i], healthy=op.flag)
    trace.append(("views", sched.queue_stats(), sched.tenant_counters(), sched.worker_usage()))
    trace.append(("repr", repr(sched)))
    return LogRun(sched, trace, mirror, now)
