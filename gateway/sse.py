"""Server-sent events from a worker, relayed one event at a time.

:class:`SseSplitter` cuts the upstream byte stream into whole events as they arrive (no
buffering beyond one incomplete event). :class:`StreamObserver` looks at each event once:
it notes when token-bearing events arrive (for time to first token and inter-token gaps),
takes the usage numbers from the final usage chunk, and says whether the client should see
that chunk (the gateway asks for usage even when the client did not).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

_SEP = b"\n\n"
_DATA = b"data:"


class SseSplitter:
    """Accumulates bytes and returns complete events (each ending in a blank line)."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        buf = self._buf + chunk if self._buf else chunk
        if _SEP not in buf:
            self._buf = buf
            return []
        parts = buf.split(_SEP)
        self._buf = parts.pop()
        return [p + _SEP for p in parts if p]

    def rest(self) -> bytes:
        """Whatever trailing bytes never completed an event."""
        rest, self._buf = self._buf, b""
        return rest


def _has_token(choice: dict[str, Any]) -> bool:
    if choice.get("text"):
        return True
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return bool(
            delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls")
        )
    return False


_SLOW = (b'"usage":{', b'"error"', b'"text":""', b'"content":""', b'"content":null')
_TOKEN = (b'"text":"', b'"content":"', b'"tool_calls":[', b'"reasoning_content":"')


def _fast_token(payload: bytes) -> bool | None:
    """Whether a compact vLLM chunk carries a token, from its bytes alone; None when only
    a JSON parse can tell (usage, errors, empty texts next to others, other spacing).

    Safe because JSON escapes quotes inside strings: ``"text":"`` can only be a key.
    """
    if any(m in payload for m in _SLOW):
        return None
    if b'"choices":[{' not in payload:
        return None
    return True if any(m in payload for m in _TOKEN) else None


@dataclass
class StreamObserver:
    """Watches relayed events; ``strip_usage`` drops the usage-only chunk from the client view."""

    strip_usage: bool
    token_events: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    gaps: list[float] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    done: bool = False

    def observe(self, event: bytes, now: float) -> bool:
        """Record ``event`` seen at ``now``; return True if the client should receive it."""
        if not event.startswith(_DATA):
            return True
        payload = event[len(_DATA) :].strip()
        if payload == b"[DONE]":
            self.done = True
            return True
        fast = _fast_token(payload)
        if fast is not None:
            if fast:
                self._token(now)
            return True
        try:
            obj = json.loads(payload)
        except (ValueError, RecursionError):
            return True
        if not isinstance(obj, dict):
            return True
        if "error" in obj and isinstance(obj["error"], dict):
            self.error = obj["error"]
            return True
        usage = obj.get("usage")
        choices = obj.get("choices")
        if isinstance(usage, dict):
            self.usage = usage
            if not choices:
                return not self.strip_usage
        if isinstance(choices, list) and any(
            isinstance(c, dict) and _has_token(c) for c in choices
        ):
            self._token(now)
        return True

    def _token(self, now: float) -> None:
        self.token_events += 1
        if self.first_token_at is None:
            self.first_token_at = now
        elif self.last_token_at is not None:
            self.gaps.append(now - self.last_token_at)
        self.last_token_at = now
