"""The batch runner: feeds batch lines into the gateway's own scheduler, a few at a time.

Each line runs as a request of the batch's owning app in ``batch.class`` through the same
request path as live traffic (:meth:`Gateway.call`), so batches share fairly between apps,
fill idle capacity and yield to interactive work by the scheduler's rules. The runner keeps
at most ``batch.max_waiting`` lines in the scheduler (split evenly between the apps that
have batches running); the rest wait in Redis. A line refused for a full queue, a timeout
in the queue, a worker that is down or a gateway shutting down (429, 503) is not failed: it
waits and tries again.

Redis going away pauses the runner, never live traffic: lines already running finish and
their results are kept in memory until Redis answers again. A cancelled or expired batch
stops at once on every gateway: its lines still waiting are withdrawn and those running are
aborted upstream; what finished before stays in the output.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import secrets
import socket
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from hearthgate.gateway.batches.files import FileStore
from hearthgate.gateway.batches.store import ACTIVE_STATUSES, BatchStore, Claimed, missing_line
from hearthgate.gateway.inprocess import Answer, OnBehalf
from hearthgate.gateway.settings import Settings

if TYPE_CHECKING:
    from hearthgate.gateway.core import Gateway

log = logging.getLogger("hearthgate.batch")

# Statuses a line answer may have without being done: it waits and runs again.
_WAIT = {0, 429, 503}
# Statuses retried a few times (a worker that broke off or timed out), then recorded.
_RETRY = {502, 504}
_MAX_RETRIES = 4


@dataclass
class _Line:
    claim: Claimed
    custom_id: str
    owner: str
    task: asyncio.Task[None] | None = None


@dataclass
class _Batch:
    """What this runner knows of one active batch."""

    id: str
    owner: str
    route: str
    input_file_id: str
    created_at: int
    status: str
    total: int
    done: int
    expires_at: int
    completed: int = 0
    failed: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    own_taken: bool = False  # entries left to this consumer by an earlier run re-read
    progress: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=120))

    def eta_s(self, now: float) -> float | None:
        """Seconds to finish at the rate of the last minutes (None: no rate yet)."""
        if len(self.progress) < 2:
            return None
        (t0, d0), (t1, d1) = self.progress[0], self.progress[-1]
        if d1 <= d0 or t1 <= t0:
            return None
        return max(0.0, (self.total - self.done) / ((d1 - d0) / (t1 - t0)))


def runner_id(settings: Settings) -> str:
    return settings.batch.runner_id or f"{socket.gethostname()}:{settings.listen.port}"


class BatchRunner:
    """One per gateway process; ``start`` it once the gateway runs, ``stop`` before."""

    def __init__(
        self,
        gateway: Gateway,
        store: BatchStore,
        files: FileStore,
        settings: Settings,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.gw = gateway
        self.store = store
        self.files = files
        self.settings = settings
        self.cfg = settings.batch
        self.cls = settings.batch_class()
        self.consumer = runner_id(settings)
        self.wall = wall
        self.redis_up: bool | None = None
        self.redis_error = ""
        self.batches: dict[str, _Batch] = {}
        self.lines: dict[tuple[str, str], _Line] = {}
        self.unwritten: list[tuple[str, str, str, bool, str]] = []
        self.finished = {"completed": 0, "failed": 0}
        self._wake = asyncio.Event()
        self._shutdown = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_stale = 0.0
        self._last_renew = 0.0
        self._fill_index = 0
        self._begins: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------ life cycle

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="batch-runner")

    async def stop(self) -> None:
        """Stop feeding lines and withdraw those in flight; their queue entries stay
        claimed by this runner, so it (or another, after the claim timeout) runs them."""
        self._shutdown.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for b in self.batches.values():
            b.stop.set()  # as if each line's client left: withdrawn, or aborted upstream
        tasks = [*self._begins, *(ln.task for ln in self.lines.values() if ln.task is not None)]
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=5.0)
            for t in pending:
                t.cancel()
        with contextlib.suppress(RedisError, OSError):
            await self._flush()

    def wake(self) -> None:
        self._wake.set()

    # ------------------------------------------------------------ the loop

    async def _loop(self) -> None:
        backoff = 0.5
        while not self._shutdown.is_set():
            try:
                await self._step()
            except (RedisError, OSError) as exc:
                if self.redis_up is not False:
                    log.warning("Redis unreachable (%s): batches pause, live traffic goes on", exc)
                self.redis_up, self.redis_error = False, f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            except Exception:
                log.exception("batch runner step failed; trying again")
                await asyncio.sleep(1.0)
                continue
            if self.redis_up is False:
                log.info("Redis is back: batches resume")
            self.redis_up, self.redis_error, backoff = True, "", 0.5
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=0.5)
            # Lines finishing wake the loop; at most 20 steps a second keeps Redis round
            # trips (and the gateway's CPU) small at hundreds of lines per second.
            await asyncio.sleep(0.05)

    async def _step(self) -> None:
        await self._flush()
        now = self.wall()
        active = await self.store.active()
        for bid in list(self.batches):
            if bid not in active:
                self._forget(bid)
        for bid in active:
            rec = await self.store.batch_record(bid)
            if rec is None or rec.get("status") not in ACTIVE_STATUSES:
                await self.store.retire(bid)
                self._forget(bid)
                continue
            await self._advance(self._track(rec, now), rec, now)
        claim_s = self.cfg.claim_timeout_s
        if now - self._last_renew >= claim_s / 3:
            self._last_renew = now
            await self._renew()
        if now - self._last_stale >= claim_s / 2:
            self._last_stale = now
            for b in self._dispatchable():
                self._start_lines(b, await self.store.claim_stale(b.id, self.consumer, claim_s))
        await self._fill()

    def _track(self, rec: dict[str, str], now: float) -> _Batch:
        b = self.batches.get(rec["id"])
        if b is None:
            b = _Batch(
                id=rec["id"],
                owner=rec["owner"],
                route=rec["endpoint"],
                input_file_id=rec["input_file_id"],
                created_at=int(rec["created_at"]),
                status=rec["status"],
                total=int(rec["total"]),
                done=0,
                expires_at=int(rec["expires_at"]),
            )
            self.batches[b.id] = b
        b.status = rec["status"]
        b.completed, b.failed = int(rec.get("completed") or 0), int(rec.get("failed") or 0)
        b.done = b.completed + b.failed
        b.progress.append((now, b.done))
        return b

    def _forget(self, bid: str) -> None:
        b = self.batches.pop(bid, None)
        if b is not None:
            b.stop.set()

    async def _advance(self, b: _Batch, rec: dict[str, str], now: float) -> None:
        """Move the batch along its statuses as far as it can go now."""
        ts = int(now)
        if b.status == "validating":
            await self.store.set_fields(b.id, status="in_progress", in_progress_at=ts)
            b.status = "in_progress"
        if b.status == "in_progress" and now >= b.expires_at:
            log.info("batch %s expired with %d of %d lines done", b.id, b.done, b.total)
            await self.store.set_fields(b.id, ending="expired")
            rec["ending"] = "expired"
        ending = rec.get("ending") or ("cancelled" if b.status == "cancelling" else "")
        if ending:
            b.stop.set()  # withdraw or abort its lines here
            mine = sum(1 for (bid, _) in self.lines if bid == b.id)
            if mine == 0 and await self.store.live_pending(b.id, self.cfg.claim_timeout_s) == 0:
                await self.store.finalize(rec, ending, ts)
                self._ended(b, ending)
            return
        if b.status == "in_progress" and b.done >= b.total:
            await self.store.set_fields(b.id, status="finalizing", finalizing_at=ts)
            b.status = rec["status"] = "finalizing"
        if b.status == "finalizing":
            await self.store.finalize(rec, "completed", ts)
            self._ended(b, "completed")

    def _ended(self, b: _Batch, outcome: str) -> None:
        log.info("batch %s %s: %d of %d lines done", b.id, outcome, b.done, b.total)
        self.gw.metrics.batches_ended.labels(outcome).inc()
        self._forget(b.id)

    def _dispatchable(self) -> list[_Batch]:
        return [
            b for b in self.batches.values() if b.status == "in_progress" and not b.stop.is_set()
        ]

    async def _fill(self) -> None:
        """Claim new lines up to the window, split evenly between the apps with work."""
        batches = self._dispatchable()
        for b in batches:
            if not b.own_taken:  # lines this consumer held before a restart come first
                self._start_lines(b, await self.store.claim_own(b.id, self.consumer))
                b.own_taken = True
        free = self.cfg.max_waiting - len(self.lines)
        if free <= 0 or not batches:
            return
        by_owner: dict[str, list[_Batch]] = defaultdict(list)
        for b in sorted(batches, key=lambda b: (b.created_at, b.id)):
            by_owner[b.owner].append(b)
        quota = math.ceil(self.cfg.max_waiting / len(by_owner))
        running: dict[str, int] = defaultdict(int)
        for ln in self.lines.values():
            running[ln.owner] += 1
        owners = sorted(by_owner)
        self._fill_index = (self._fill_index + 1) % len(owners)
        for owner in owners[self._fill_index :] + owners[: self._fill_index]:
            batches_of = by_owner[owner]
            room = min(free, quota - running[owner])
            if room <= 0:
                continue
            # An app's batches share its room evenly (its chat and its embeddings batch run
            # side by side, on their own workers); what one cannot use goes to the next.
            share = math.ceil(room / len(batches_of))
            for pass_share in (share, room):
                for b in batches_of:
                    n = min(pass_share, room)
                    if n <= 0:
                        break
                    got = await self.store.claim_new(b.id, self.consumer, n)
                    self._start_lines(b, got)
                    room -= len(got)
                    free -= len(got)

    def _start_lines(self, b: _Batch, claims: list[Claimed]) -> None:
        fresh = [c for c in claims if (c.batch_id, c.entry_id) not in self.lines]
        if fresh:
            # Reserve the window now; _begin replaces these with the running lines.
            for c in fresh:
                self.lines[(c.batch_id, c.entry_id)] = _Line(c, "", b.owner, task=None)
            task = asyncio.create_task(self._begin(b, fresh), name=f"batch-{b.id}-start")
            self._begins.add(task)
            task.add_done_callback(self._begins.discard)

    async def _begin(self, b: _Batch, claims: list[Claimed]) -> None:
        """Read the claimed lines' custom_ids and bodies, then run each as its own task."""
        try:
            indices = [c.index for c in claims]
            ids = await self.store.custom_ids(b.id, indices)
            bodies = await self.files.read_some(b.input_file_id, indices)
        except (RedisError, OSError):
            for c in claims:  # still claimed in Redis: taken again after a restart or claim
                self.lines.pop((c.batch_id, c.entry_id), None)
            b.own_taken = False
            return
        for c, cid, raw in zip(claims, ids, bodies, strict=True):
            key = (c.batch_id, c.entry_id)
            if cid is None or raw is None:  # its input went away: failed, never stuck
                self.lines.pop(key, None)
                name = cid or f"line-{c.index + 1}"
                out = missing_line(b.id, name, "input_missing")
                with contextlib.suppress(RedisError, OSError):
                    await self.store.record(b.id, name, out, False, c.entry_id)
                continue
            line = _Line(c, cid, b.owner)
            line.task = asyncio.create_task(self._run(b, line, raw), name=f"batch-line-{cid}")
            self.lines[key] = line

    async def _run(self, b: _Batch, line: _Line, raw: str) -> None:
        key = (line.claim.batch_id, line.claim.entry_id)
        try:
            body = json.dumps(json.loads(raw)["body"]).encode()
            answer = await self._call(b, body)
            if answer is None:
                if self._shutdown.is_set():  # still claimed: runs again after the restart
                    return
                # cancelled or expired meanwhile: acknowledged, never recorded
                with contextlib.suppress(RedisError, OSError):
                    await self.store.drop(b.id, line.claim.entry_id)
                return
            ok = 200 <= answer.status < 300
            out = output_line(line.custom_id, answer)
            self.finished["completed" if ok else "failed"] += 1
            self.gw.metrics.batch_lines_finished.labels("completed" if ok else "failed").inc()
            try:
                await self.store.record(b.id, line.custom_id, out, ok, line.claim.entry_id)
            except (RedisError, OSError):
                self.unwritten.append((b.id, line.custom_id, out, ok, line.claim.entry_id))
        finally:
            self.lines.pop(key, None)
            self.wake()

    async def _call(self, b: _Batch, body: bytes) -> Answer | None:
        who = OnBehalf(b.owner, self.cls)
        retries = 0
        while True:
            if b.stop.is_set():
                return None
            answer = await self.gw.call(b.route, body, who, b.stop)
            if b.stop.is_set():
                return None
            if answer.status in _WAIT or (answer.status in _RETRY and retries < _MAX_RETRIES):
                retries += answer.status in _RETRY
                wait = _retry_after(answer, retries)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(b.stop.wait(), timeout=wait)
                continue
            return answer

    async def _renew(self) -> None:
        by_batch: dict[str, list[str]] = defaultdict(list)
        for bid, entry in self.lines:
            by_batch[bid].append(entry)
        for bid, entries in by_batch.items():
            await self.store.renew(bid, self.consumer, entries)

    async def _flush(self) -> None:
        while self.unwritten:
            bid, cid, out, ok, entry = self.unwritten[0]
            await self.store.record(bid, cid, out, ok, entry)
            self.unwritten.pop(0)

    # ------------------------------------------------------------ views

    def line_states(self) -> dict[str, int]:
        """Lines of the active batches by state, as this gateway sees them."""
        states = {"waiting": 0, "running": len(self.lines), "completed": 0, "failed": 0}
        for b in self.batches.values():
            states["completed"] += b.completed
            states["failed"] += b.failed
            states["waiting"] += max(0, b.total - b.done)
        states["waiting"] = max(0, states["waiting"] - states["running"])
        return states

    def status(self) -> dict[str, Any]:
        now = self.wall()
        return {
            "redis": {True: "up", False: "down", None: "unknown"}[self.redis_up],
            "redis_error": self.redis_error or None,
            "runner": self.consumer,
            "lines_running": len(self.lines),
            "lines_unwritten": len(self.unwritten),
            "max_waiting": self.cfg.max_waiting,
            "class": self.cls,
            "batches": [
                {
                    "id": b.id,
                    "app": b.owner,
                    "status": b.status,
                    "total": b.total,
                    "done": b.done,
                    "running_here": sum(1 for (bid, _) in self.lines if bid == b.id),
                    "eta_s": _round(b.eta_s(now)),
                    "expires_in_s": round(b.expires_at - now),
                }
                for b in sorted(self.batches.values(), key=lambda b: b.created_at)
            ],
        }


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


def _retry_after(answer: Answer, retries: int) -> float:
    try:
        return max(0.2, min(30.0, float(answer.headers.get("retry-after", ""))))
    except ValueError:
        return min(30.0, 0.5 * 2.0**retries)


def output_line(custom_id: str, answer: Answer) -> str:
    """One line of the output or error file, in OpenAI's format."""
    try:
        body: Any = json.loads(answer.body)
    except ValueError:
        body = answer.body.decode("utf-8", "replace")
    request_id = answer.headers.get("x-request-id") or f"req_{secrets.token_hex(12)}"
    return json.dumps(
        {
            "id": f"batch_req_{secrets.token_hex(12)}",
            "custom_id": custom_id,
            "response": {"status_code": answer.status, "request_id": request_id, "body": body},
            "error": None,
        }
    )
