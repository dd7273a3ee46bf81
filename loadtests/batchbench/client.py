"""Talking to the gateway for `hearthgate bench batch`: the Files and Batches endpoints,
creating the batches and polling them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from hearthgate.loadtests.batchbench.lines import to_jsonl
from hearthgate.loadtests.batchbench.rates import lines_per_s
from hearthgate.loadtests.workload import PlannedRequest

FINAL = ("completed", "failed", "expired", "cancelled")


class BatchClient:
    """The Files and Batches endpoints of a gateway, as app ``key``."""

    def __init__(self, session: aiohttp.ClientSession, url: str, key: str) -> None:
        self.s = session
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {key}"}

    async def _json(self, resp: aiohttp.ClientResponse, what: str) -> dict[str, Any]:
        text = await resp.text()
        if resp.status != 200:
            raise RuntimeError(f"{what}: HTTP {resp.status}: {text[:300]}")
        obj: dict[str, Any] = json.loads(text)
        return obj

    async def upload(self, data: bytes, name: str) -> str:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", data, filename=name, content_type="application/jsonl")
        async with self.s.post(f"{self.url}/v1/files", data=form, headers=self.headers) as resp:
            return str((await self._json(resp, f"upload {name}"))["id"])

    async def create(self, file_id: str, endpoint: str) -> dict[str, Any]:
        body = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"}
        async with self.s.post(f"{self.url}/v1/batches", json=body, headers=self.headers) as r:
            return await self._json(r, f"create batch on {endpoint}")

    async def get(self, bid: str) -> dict[str, Any]:
        async with self.s.get(f"{self.url}/v1/batches/{bid}", headers=self.headers) as resp:
            return await self._json(resp, f"get {bid}")

    async def cancel(self, bid: str) -> dict[str, Any]:
        async with self.s.post(f"{self.url}/v1/batches/{bid}/cancel", headers=self.headers) as r:
            return await self._json(r, f"cancel {bid}")


@dataclass
class BatchRun:
    """One submission of the batches and what the polls saw."""

    created_s: float  # just before the first POST /v1/batches
    lines: int
    ids: dict[str, str] = field(default_factory=dict)  # endpoint -> batch id
    sizes: dict[str, int] = field(default_factory=dict)  # endpoint -> lines
    ended_s: dict[str, float] = field(default_factory=dict)  # endpoint -> first final poll
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)  # last seen
    polls: list[tuple[float, int]] = field(default_factory=list)  # (time, lines done)
    # the same per batch (endpoint -> (time, its lines done))
    polls_by: dict[str, list[tuple[float, int]]] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return len(self.ended_s) == len(self.ids)

    @property
    def end_s(self) -> float | None:
        return max(self.ended_s.values()) if self.finished and self.ended_s else None

    def statuses(self) -> dict[str, str]:
        return {ep: str(o.get("status")) for ep, o in self.objects.items()}

    def all_completed(self) -> bool:
        return self.finished and all(s == "completed" for s in self.statuses().values())

    def per_batch(self) -> dict[str, dict[str, Any]]:
        out = {}
        for ep, bid in self.ids.items():
            counts = (self.objects.get(ep) or {}).get("request_counts") or {}
            end = self.ended_s.get(ep)
            out[ep] = {
                "id": bid,
                "lines": self.sizes[ep],
                "status": (self.objects.get(ep) or {}).get("status"),
                "completed": counts.get("completed"),
                "failed": counts.get("failed"),
                "seconds": None if end is None else round(end - self.created_s, 3),
                "lines_per_s": _r(lines_per_s(self.sizes[ep], self.created_s, end)),
            }
        return out


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


async def submit_and_poll(
    client: BatchClient,
    files: dict[str, tuple[str, int]],
    *,
    interval_s: float = 0.5,
    stop: asyncio.Event | None = None,
    timeout_s: float = 3600.0,
    clock: Callable[[], float] = time.perf_counter,
) -> BatchRun:
    """Create one batch per ``files`` entry (endpoint -> (file id, lines)) at once, then poll
    them every ``interval_s`` until all are final, ``stop`` is set or ``timeout_s`` passed."""
    run = BatchRun(created_s=clock(), lines=sum(n for _, n in files.values()))
    created = await asyncio.gather(*(client.create(fid, ep) for ep, (fid, _) in files.items()))
    for (ep, (_, n)), obj in zip(files.items(), created, strict=True):
        run.ids[ep], run.sizes[ep], run.objects[ep] = str(obj["id"]), n, obj
    while True:
        tick = clock()
        objs = await asyncio.gather(*(client.get(b) for b in run.ids.values()))
        t = clock()
        done = 0
        for ep, obj in zip(run.ids, objs, strict=True):
            run.objects[ep] = obj
            counts = obj.get("request_counts") or {}
            mine = int(counts.get("completed") or 0) + int(counts.get("failed") or 0)
            run.polls_by.setdefault(ep, []).append((t, mine))
            done += mine
            if obj.get("status") in FINAL and ep not in run.ended_s:
                run.ended_s[ep] = t
        run.polls.append((t, done))
        if run.finished or (stop is not None and stop.is_set()):
            return run
        if t - run.created_s > timeout_s:
            raise TimeoutError(f"batches {run.statuses()} not done after {timeout_s:g} s")
        wait = max(0.0, interval_s - (clock() - tick))
        if stop is None:
            await asyncio.sleep(wait)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=wait)


async def cancel_all(client: BatchClient, run: BatchRun, timeout_s: float = 120.0) -> None:
    """Cancel the run's batches that are still going and wait until they are final."""
    going = [bid for ep, bid in run.ids.items() if ep not in run.ended_s]
    for bid in going:
        with contextlib.suppress(RuntimeError):
            await client.cancel(bid)
    deadline = time.monotonic() + timeout_s
    while going and time.monotonic() < deadline:
        objs = await asyncio.gather(*(client.get(b) for b in going))
        going = [b for b, o in zip(going, objs, strict=True) if o.get("status") not in FINAL]
        if going:
            await asyncio.sleep(0.5)
    if going:
        raise TimeoutError(f"batches {going} not final {timeout_s:g} s after cancel")


async def upload_all(
    client: BatchClient, lines: dict[str, list[PlannedRequest]], label: str
) -> dict[str, tuple[str, int]]:
    """Upload each endpoint's lines as one file; endpoint -> (file id, lines)."""
    out = {}
    for ep, reqs in lines.items():
        name = f"{label}-{ep.strip('/').replace('/', '-')}.jsonl"
        out[ep] = (await client.upload(to_jsonl(reqs), name), len(reqs))
    return out
