"""The file store: uploaded JSONL files (and the batches' output and error files) in Redis.

A file is a record hash and a hash of its lines by line number, listed in its owner's index
by creation time (keys in ``keys.py``). Every key expires ``batch.retention_hours`` after
the file was written, except while a batch reads the file (:meth:`FileStore.hold`).

Files live in Redis, not on a local disk: every gateway replica sees them, and Redis's
append-only file keeps them across restarts (``batch.max_file_bytes`` bounds one file).
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from hearthgate.gateway.batches.keys import CHUNK, Keys, int_or_none, new_id, page


class FileStore:
    """The Redis access of the Files API. Every method may raise redis's ``RedisError``
    (Redis down or slow): callers map it to 503 or pause."""

    def __init__(self, redis: Redis, keys: Keys, retention_s: float) -> None:
        # redis-py's annotations do not follow decode_responses=True: typed loosely here.
        self.r: Any = redis
        self.keys = keys
        self.retention_s = max(1, int(retention_s))

    async def add_file(
        self,
        owner: str,
        filename: str,
        purpose: str,
        lines: list[str],
        trailing_newline: bool,
        nbytes: int,
        now: int,
        fid: str | None = None,
    ) -> dict[str, Any]:
        """Store a file (its lines in order) and return its OpenAI file object."""
        fid = fid or new_id("file-")
        record = {
            "id": fid,
            "owner": owner,
            "filename": filename,
            "purpose": purpose,
            "bytes": nbytes,
            "created_at": now,
            "expires_at": now + self.retention_s,
            "lines": len(lines),
            "trailing_newline": int(trailing_newline),
        }
        k = self.keys
        async with self.r.pipeline(transaction=True) as pipe:
            pipe.delete(k.lines(fid))
            for start in range(0, len(lines), CHUNK):
                chunk = lines[start : start + CHUNK]
                pipe.hset(k.lines(fid), mapping={str(start + i): v for i, v in enumerate(chunk)})
            pipe.hset(k.file(fid), mapping=record)
            pipe.zadd(k.files(owner), {fid: now})
            pipe.expire(k.file(fid), self.retention_s)
            pipe.expire(k.lines(fid), self.retention_s)
            await pipe.execute()
        return file_object(record)

    async def file_record(self, owner: str, fid: str) -> dict[str, str] | None:
        rec: dict[str, str] = await self.r.hgetall(self.keys.file(fid))
        if not rec or rec.get("owner") != owner:
            return None
        return rec

    async def list_files(
        self, owner: str, purpose: str | None, limit: int, after: str | None, desc: bool
    ) -> tuple[list[dict[str, Any]], bool]:
        ids = await page(self.r, self.keys.files(owner), after, desc)
        out: list[dict[str, Any]] = []
        for fid in ids:
            rec = await self.file_record(owner, fid)
            if rec is None:
                await self.r.zrem(self.keys.files(owner), fid)  # expired or deleted
                continue
            if purpose is not None and rec.get("purpose") != purpose:
                continue
            if len(out) == limit:
                return out, True
            out.append(file_object(rec))
        return out, False

    async def read_lines(self, fid: str, start: int, count: int) -> list[str | None]:
        fields = [str(i) for i in range(start, start + count)]
        got: list[str | None] = await self.r.hmget(self.keys.lines(fid), fields)
        return got

    async def read_some(self, fid: str, indices: list[int]) -> list[str | None]:
        """The lines at ``indices`` (one round trip)."""
        if not indices:
            return []
        got: list[str | None] = await self.r.hmget(self.keys.lines(fid), [str(i) for i in indices])
        return got

    async def file_content(self, rec: dict[str, str]) -> bytes:
        n = int(rec["lines"])
        parts: list[str] = []
        for start in range(0, n, CHUNK):
            got = await self.read_lines(rec["id"], start, min(CHUNK, n - start))
            parts.extend(v or "" for v in got)
        text = "\n".join(parts) + ("\n" if rec.get("trailing_newline") == "1" else "")
        return text.encode()

    async def delete_file(self, owner: str, fid: str) -> None:
        async with self.r.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.file(fid), self.keys.lines(fid))
            pipe.zrem(self.keys.files(owner), fid)
            await pipe.execute()

    # ------------------------------------------------------------ a batch's input

    def hold(self, pipe: Any, fid: str, bid: str) -> None:
        """Queue on ``pipe`` (the batch store's transaction that creates batch ``bid``) the
        commands that keep the input file while the batch needs it: no expiry, and its
        record names the batch."""
        pipe.persist(self.keys.file(fid))
        pipe.persist(self.keys.lines(fid))
        pipe.hset(self.keys.file(fid), "in_use_by", bid)

    def release(self, pipe: Any, fid: str) -> None:
        """Queue on ``pipe`` (the transaction that ends a batch) the commands that let its
        input file expire again, ``retention_s`` from now."""
        pipe.hdel(self.keys.file(fid), "in_use_by")
        pipe.expire(self.keys.file(fid), self.retention_s)
        pipe.expire(self.keys.lines(fid), self.retention_s)


def file_object(rec: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": rec["id"],
        "object": "file",
        "bytes": int(rec["bytes"]),
        "created_at": int(rec["created_at"]),
        "expires_at": int_or_none(rec.get("expires_at")),
        "filename": rec["filename"],
        "purpose": rec["purpose"],
        "status": "processed",
        "status_details": None,
    }
