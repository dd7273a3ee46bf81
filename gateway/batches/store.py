"""The batch store: batches, the queue of their lines, and the lines' results in Redis
(keys in ``keys.py``; the input, output and error files are the file store's, ``files.py``).

The queue is the at-least-once part: a runner reads entries with XREADGROUP under its own
consumer name, renews its claims while the lines run, and acknowledges and deletes an entry
in the same script that writes the line's result. Entries of a runner that stopped renewing
(killed, cut off) are taken over with XAUTOCLAIM. A result is written with HSETNX, so a line
that ran twice across a crash appears once; the counts move only when it was new.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from hearthgate.gateway.batches.files import FileStore
from hearthgate.gateway.batches.keys import CHUNK, Keys, int_or_none, new_id, page

GROUP = "run"
ACTIVE_STATUSES = ("validating", "in_progress", "finalizing", "cancelling")

# Write a line's result once, count it once, and acknowledge its queue entry (always).
_RECORD = """
local new = redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
if new == 1 then
  redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
end
if ARGV[5] ~= '' then
  redis.call('XACK', KEYS[3], ARGV[4], ARGV[5])
  redis.call('XDEL', KEYS[3], ARGV[5])
end
return new
"""


@dataclass(frozen=True)
class Claimed:
    """A queue entry this runner holds: the line at ``index`` of its batch."""

    batch_id: str
    entry_id: str
    index: int


class BatchStore:
    """The Redis access of the Batches API and the runners. Every method may raise redis's
    ``RedisError`` (Redis down or slow): callers map it to 503 or pause."""

    def __init__(self, redis: Redis, keys: Keys, files: FileStore, retention_s: float) -> None:
        # redis-py's annotations do not follow decode_responses=True: typed loosely here.
        self.r: Any = redis
        self.keys = keys
        self.files = files  # writes the output and error files, holds the input
        self.retention_s = max(1, int(retention_s))
        self._record = redis.register_script(_RECORD)

    async def ping(self) -> bool:
        return bool(await self.r.ping())

    # ------------------------------------------------------------ batches

    async def create_batch(
        self,
        owner: str,
        input_file: dict[str, str],
        endpoint: str,
        custom_ids: list[str],
        indices: list[int],
        window_s: float,
        metadata: dict[str, str] | None,
        now: int,
    ) -> dict[str, Any]:
        """Record a batch whose lines were checked, queue every line, and return it."""
        bid = new_id("batch_")
        record: dict[str, Any] = {
            "id": bid,
            "owner": owner,
            "endpoint": endpoint,
            "input_file_id": input_file["id"],
            "completion_window": "24h",
            "status": "validating",
            "created_at": now,
            "expires_at": now + int(window_s),
            "total": len(custom_ids),
            "completed": 0,
            "failed": 0,
            "metadata": json.dumps(metadata) if metadata is not None else "",
            "ending": "",
        }
        q = self.keys.queue(bid)
        async with self.r.pipeline(transaction=True) as pipe:
            for start in range(0, len(custom_ids), CHUNK):
                pipe.rpush(self.keys.ids(bid), *custom_ids[start : start + CHUNK])
            for i in indices:
                pipe.xadd(q, {"i": i})
            pipe.xgroup_create(q, GROUP, id="0", mkstream=True)
            pipe.hset(self.keys.batch(bid), mapping=record)
            pipe.zadd(self.keys.batches(owner), {bid: now})
            pipe.sadd(self.keys.active, bid)
            # The input stays while the batch needs it; it expires again when it ends.
            self.files.hold(pipe, input_file["id"], bid)
            await pipe.execute()
        return batch_object(record)

    async def batch_record(self, bid: str, owner: str | None = None) -> dict[str, str] | None:
        rec: dict[str, str] = await self.r.hgetall(self.keys.batch(bid))
        if not rec or (owner is not None and rec.get("owner") != owner):
            return None
        return rec

    async def list_batches(
        self, owner: str, limit: int, after: str | None
    ) -> tuple[list[dict[str, Any]], bool]:
        ids = await page(self.r, self.keys.batches(owner), after, True)
        out: list[dict[str, Any]] = []
        for bid in ids:
            rec = await self.batch_record(bid, owner)
            if rec is None:
                await self.r.zrem(self.keys.batches(owner), bid)
                continue
            if len(out) == limit:
                return out, True
            out.append(batch_object(rec))
        return out, False

    async def set_fields(self, bid: str, **fields: Any) -> None:
        await self.r.hset(self.keys.batch(bid), mapping={k: v for k, v in fields.items()})

    async def active(self) -> list[str]:
        ids: set[str] = await self.r.smembers(self.keys.active)
        return sorted(ids)

    async def retire(self, bid: str) -> None:
        """Take a batch that is no longer running off the active set."""
        await self.r.srem(self.keys.active, bid)

    # ------------------------------------------------------------ the queue

    def _claimed(self, bid: str, entries: Iterable[Any]) -> list[Claimed]:
        out = []
        for entry_id, fields in entries:
            if fields and "i" in fields:
                out.append(Claimed(bid, entry_id, int(fields["i"])))
        return out

    async def claim_new(self, bid: str, consumer: str, count: int) -> list[Claimed]:
        got = await self.r.xreadgroup(GROUP, consumer, {self.keys.queue(bid): ">"}, count=count)
        return [c for _, entries in got for c in self._claimed(bid, entries)]

    async def claim_own(self, bid: str, consumer: str) -> list[Claimed]:
        """Entries delivered to ``consumer`` before (a restart) and never acknowledged."""
        got = await self.r.xreadgroup(GROUP, consumer, {self.keys.queue(bid): "0"}, count=100_000)
        return [c for _, entries in got for c in self._claimed(bid, entries)]

    async def claim_stale(self, bid: str, consumer: str, idle_s: float) -> list[Claimed]:
        """Entries whose runner stopped renewing them ``idle_s`` ago."""
        out: list[Claimed] = []
        cursor = "0-0"
        while True:
            reply = await self.r.xautoclaim(
                self.keys.queue(bid), GROUP, consumer, int(idle_s * 1000), cursor, count=500
            )
            cursor, entries = reply[0], reply[1]
            out += self._claimed(bid, entries)
            if cursor in ("0-0", b"0-0"):
                return out

    async def renew(self, bid: str, consumer: str, entry_ids: list[str]) -> None:
        if entry_ids:
            await self.r.xclaim(self.keys.queue(bid), GROUP, consumer, 0, entry_ids, justid=True)

    async def live_pending(self, bid: str, idle_s: float) -> int:
        """Entries claimed by some runner that renewed them within ``idle_s``."""
        info = await self.r.xpending(self.keys.queue(bid), GROUP)
        total = int(info["pending"]) if info else 0
        if total == 0:
            return 0
        stale = await self.r.xpending_range(
            self.keys.queue(bid), GROUP, "-", "+", total, idle=int(idle_s * 1000)
        )
        return total - len(stale)

    async def drop(self, bid: str, entry_id: str) -> None:
        """Acknowledge a claimed entry without a result (its batch was cancelled or
        expired while the line ran)."""
        await self.r.xack(self.keys.queue(bid), GROUP, entry_id)

    async def queued(self, bid: str) -> int:
        n: int = await self.r.xlen(self.keys.queue(bid))
        return n

    async def record(
        self, bid: str, custom_id: str, line: str, ok: bool, entry_id: str | None
    ) -> bool:
        """Write one line's result (once) and acknowledge its entry; True if it was new."""
        new = await self._record(
            keys=[self.keys.results(bid), self.keys.batch(bid), self.keys.queue(bid)],
            args=[
                custom_id,
                ("+" if ok else "-") + line,
                "completed" if ok else "failed",
                GROUP,
                entry_id or "",
            ],
        )
        return bool(new)

    async def custom_ids(self, bid: str, indices: list[int]) -> list[str | None]:
        pipe = self.r.pipeline(transaction=False)
        for i in indices:
            pipe.lindex(self.keys.ids(bid), i)
        got: list[str | None] = await pipe.execute()
        return got

    # ------------------------------------------------------------ the end of a batch

    async def finalize(self, rec: dict[str, str], outcome: str, now: int) -> None:
        """Write the output and error files and end the batch as ``outcome`` (completed,
        expired, cancelled). Safe to run twice: the file ids follow from the batch id."""
        bid, owner = rec["id"], rec["owner"]
        missing_code = {"expired": "batch_expired", "cancelled": "batch_cancelled"}.get(outcome)
        total = int(rec["total"])
        out: list[str] = []
        err: list[str] = []
        for start in range(0, total, CHUNK):
            ids: list[str] = await self.r.lrange(self.keys.ids(bid), start, start + CHUNK - 1)
            results: list[str | None] = await self.r.hmget(self.keys.results(bid), ids)
            for cid, res in zip(ids, results, strict=True):
                if res is not None:
                    (out if res[0] == "+" else err).append(res[1:])
                elif missing_code is not None:
                    err.append(missing_line(bid, cid, missing_code))
        hexpart = bid.removeprefix("batch_")
        fields: dict[str, Any] = {"status": outcome, f"{outcome}_at": now}
        if out:
            f = await self.files.add_file(
                owner,
                f"{bid}_output.jsonl",
                "batch_output",
                out,
                True,
                _size(out),
                now,
                fid=f"file-{hexpart}-output",
            )
            fields["output_file_id"] = f["id"]
        if err:
            f = await self.files.add_file(
                owner,
                f"{bid}_error.jsonl",
                "batch_output",
                err,
                True,
                _size(err),
                now,
                fid=f"file-{hexpart}-error",
            )
            fields["error_file_id"] = f["id"]
        keep = self.retention_s
        async with self.r.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.batch(bid), mapping=fields)
            pipe.srem(self.keys.active, bid)
            pipe.delete(self.keys.queue(bid))
            for key in (self.keys.batch(bid), self.keys.ids(bid), self.keys.results(bid)):
                pipe.expire(key, keep)
            self.files.release(pipe, rec["input_file_id"])
            await pipe.execute()


def _size(lines: list[str]) -> int:
    return sum(len(line.encode()) + 1 for line in lines)


def missing_line(bid: str, custom_id: str, code: str) -> str:
    """The error-file line of a request that never ran (expired, cancelled, or its input
    line was no longer stored)."""
    message = {
        "batch_expired": "This request could not be executed before the completion window expired.",
        "batch_cancelled": "This request was not executed because the batch was cancelled.",
        "input_missing": "This request was not executed: its input line is no longer stored.",
    }[code]
    digest = hashlib.sha256(f"{bid}/{custom_id}".encode()).hexdigest()[:24]
    return json.dumps(
        {
            "id": f"batch_req_{digest}",
            "custom_id": custom_id,
            "response": None,
            "error": {"code": code, "message": message},
        }
    )


def batch_object(rec: dict[str, Any]) -> dict[str, Any]:
    times = (
        "in_progress_at",
        "finalizing_at",
        "completed_at",
        "failed_at",
        "expired_at",
        "cancelling_at",
        "cancelled_at",
    )
    meta = rec.get("metadata") or ""
    return {
        "id": rec["id"],
        "object": "batch",
        "endpoint": rec["endpoint"],
        "errors": None,
        "input_file_id": rec["input_file_id"],
        "completion_window": rec.get("completion_window", "24h"),
        "status": rec["status"],
        "output_file_id": rec.get("output_file_id") or None,
        "error_file_id": rec.get("error_file_id") or None,
        "created_at": int(rec["created_at"]),
        "expires_at": int_or_none(rec.get("expires_at")),
        **{t: int_or_none(rec.get(t)) for t in times},
        "request_counts": {
            "total": int(rec["total"]),
            "completed": int(rec.get("completed") or 0),
            "failed": int(rec.get("failed") or 0),
        },
        "metadata": json.loads(meta) if meta else None,
    }
