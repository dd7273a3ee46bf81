"""Send one planned request and record its timing: status, every token chunk, usage.

Timing follows vLLM's own serving benchmark so that the two agree: a chunk counts as a token
when it carries a non-empty `choices` (for chat, the first bare `{"role": "assistant"}` header
is skipped, since it carries no token); TTFT is first such chunk minus send time; the end is
when the response body is complete.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from hearthgate.loadtests.records import RequestRecord, classify_status
from hearthgate.loadtests.workload import PlannedRequest

Clock = Callable[[], float]
_ERROR_LIMIT = 300


def new_record(req: PlannedRequest, target: str) -> RequestRecord:
    return RequestRecord(
        id=req.id,
        target=target,
        flow=req.flow,
        klass=req.klass,
        app=req.app,
        endpoint=req.endpoint,
        stream=req.stream,
        warmup=req.warmup,
        scheduled_s=req.scheduled_s,
        prompt_tokens_requested=req.prompt_tokens,
        output_tokens_requested=req.output_tokens,
    )


def _error_text(body: bytes) -> str:
    text = body.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
    except ValueError:
        return text[:_ERROR_LIMIT]
    if isinstance(obj, dict):
        err = obj.get("error", obj.get("detail", obj))
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])[:_ERROR_LIMIT]
        return str(err)[:_ERROR_LIMIT]
    return text[:_ERROR_LIMIT]


def _is_token_chunk(obj: Mapping[str, Any]) -> bool:
    choices = obj.get("choices")
    if not choices:
        return False
    first = choices[0]
    delta = first.get("delta") if isinstance(first, dict) else None
    if isinstance(delta, dict) and "role" in delta:
        # The chat stream's header chunk: role only, no token yet.
        return any(v for k, v in delta.items() if k != "role")
    return True


def _take_usage(rec: RequestRecord, obj: Mapping[str, Any]) -> None:
    usage = obj.get("usage")
    if isinstance(usage, dict):
        if usage.get("prompt_tokens") is not None:
            rec.prompt_tokens = int(usage["prompt_tokens"])
        if usage.get("completion_tokens") is not None:
            rec.output_tokens = int(usage["completion_tokens"])


def _handle_line(line: bytes, t: float, rec: RequestRecord) -> bool:
    """Process one SSE line received at `t`; True when it is the final `[DONE]`."""
    line = line.strip()
    if not line.startswith(b"data:"):
        return False  # blank separators, comments (":"), other fields
    payload = line[5:].strip()
    if payload == b"[DONE]":
        return True
    try:
        obj = json.loads(payload)
    except ValueError:
        rec.error = f"bad stream chunk: {payload[:80]!r}"
        return False
    if not isinstance(obj, dict):
        return False
    if "error" in obj and not obj.get("choices"):
        rec.error = _error_text(payload)
        return False
    if _is_token_chunk(obj):
        rec.chunk_s.append(round(t, 6))
    _take_usage(rec, obj)
    return False


async def _read_stream(resp: aiohttp.ClientResponse, rec: RequestRecord, now: Clock) -> None:
    # Read whatever bytes have arrived (as vLLM's benchmark does) and stamp every complete
    # line in them with the arrival time of those bytes.
    done = False
    buf = b""
    async for data in resp.content.iter_any():
        t = now()
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            done = _handle_line(line, t, rec) or done
    if buf:
        done = _handle_line(buf, now(), rec) or done
    rec.end_s = round(now(), 6)
    if not done and rec.error is None:
        rec.error = "stream ended without [DONE]"


def queued_seconds(header: str | None) -> float | None:
    """The gateway's x-hearthgate-queued-ms header in seconds (None: absent or not a number)."""
    if header is None:
        return None
    try:
        ms = float(header)
    except ValueError:
        return None
    return ms / 1000 if math.isfinite(ms) and ms >= 0 else None


async def execute(
    session: aiohttp.ClientSession,
    rec: RequestRecord,
    *,
    url: str,
    body: dict[str, Any],
    headers: Mapping[str, str],
    timeout_s: float,
    t0: float,
    clock: Clock = time.perf_counter,
) -> RequestRecord:
    """POST `body` to `url`, filling `rec` in place (also on error or cancellation).
    Times are stored relative to `t0`."""

    def now() -> float:
        return clock() - t0

    rec.sent_s = round(now(), 6)
    try:
        async with session.post(
            url,
            json=body,
            headers=dict(headers),
            timeout=aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(10.0, timeout_s)),
        ) as resp:
            rec.status = resp.status
            rec.retry_after = resp.headers.get("Retry-After")
            rec.queued_s = queued_seconds(resp.headers.get("x-hearthgate-queued-ms"))
            if resp.status >= 400:
                rec.error = f"HTTP {resp.status}: {_error_text(await resp.read())}"
                rec.end_s = round(now(), 6)
            elif rec.stream:
                await _read_stream(resp, rec, now)
            else:
                data = await resp.read()
                rec.end_s = round(now(), 6)
                rec.chunk_s = [rec.end_s]
                try:
                    obj = json.loads(data)
                except ValueError:
                    rec.error = f"bad JSON response: {data[:80]!r}"
                else:
                    if isinstance(obj, dict):
                        _take_usage(rec, obj)
    except asyncio.CancelledError:
        rec.error = "cancelled"
        rec.end_s = round(now(), 6)
        rec.outcome = "failed"
        raise
    except TimeoutError:
        rec.error = f"timeout after {timeout_s:g} s"
        rec.end_s = round(now(), 6)
    except (aiohttp.ClientError, OSError, ValueError) as err:
        # Connection refused or reset, a broken stream, an over-long line: all failures.
        rec.error = f"{type(err).__name__}: {err}"[:_ERROR_LIMIT]
        rec.end_s = round(now(), 6)
    if rec.stream and rec.error is None and rec.status == 200 and not rec.chunk_s:
        rec.error = "no token received"
    rec.outcome = classify_status(rec.status, rec.error)
    return rec
