"""The Redis layout of the Files and Batches API: the keys under one prefix, named here
once for the file store (``files.py``) and the batch store (``store.py``), and the few
helpers both use.

Keys (``P`` is ``redis.key_prefix``)::

    P file:{id}            hash   the file's record (owner, filename, purpose, bytes, ...)
    P file:{id}:lines      hash   line number -> line text (files are read back in order)
    P files:{owner}        zset   the owner's files by creation time
    P batch:{id}           hash   the batch's record: status, times, counts, file ids
    P batch:{id}:ids       list   the input's custom_ids, in file order
    P batch:{id}:queue     stream one entry per line not yet done; consumer group "run"
    P batch:{id}:results   hash   custom_id -> "+" or "-" and the output line (written once)
    P batches:{owner}      zset   the owner's batches by creation time
    P batches:active       set    batches a runner still has work on
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

# Lines written or read per command, so no single command grows with the file.
CHUNK = 1000


@dataclass(frozen=True)
class Keys:
    """The key names under ``prefix``; the table above says what each holds."""

    prefix: str

    def file(self, fid: str) -> str:
        return f"{self.prefix}file:{fid}"

    def lines(self, fid: str) -> str:
        return f"{self.prefix}file:{fid}:lines"

    def files(self, owner: str) -> str:
        return f"{self.prefix}files:{owner}"

    def batch(self, bid: str) -> str:
        return f"{self.prefix}batch:{bid}"

    def ids(self, bid: str) -> str:
        return f"{self.prefix}batch:{bid}:ids"

    def queue(self, bid: str) -> str:
        return f"{self.prefix}batch:{bid}:queue"

    def results(self, bid: str) -> str:
        return f"{self.prefix}batch:{bid}:results"

    def batches(self, owner: str) -> str:
        return f"{self.prefix}batches:{owner}"

    @property
    def active(self) -> str:
        return f"{self.prefix}batches:active"


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def int_or_none(v: Any) -> int | None:
    """A number field of a record as read back; unset fields are stored as ""."""
    return None if v is None or v == "" else int(v)


async def page(r: Any, key: str, after: str | None, desc: bool) -> list[str]:
    """The ids of an owner's index (``files:`` or ``batches:``) that follow ``after``, in
    creation order or its reverse; none when ``after`` is not in it."""
    start = 0
    if after is not None:
        rank = await (r.zrevrank(key, after) if desc else r.zrank(key, after))
        if rank is None:
            return []
        start = int(rank) + 1
    get = r.zrevrange if desc else r.zrange
    ids: list[str] = await get(key, start, -1)
    return ids
