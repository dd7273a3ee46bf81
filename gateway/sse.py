"""Server-sent events from a worker, relayed one event at a time.

:class:`SseSplitter` cuts the upstream byte stream into whole events as they arrive (no
buffering beyond one incomplete event). :class:`StreamObserver` looks at each event once:
it notes when token-bearing events arrive (for time to first token and inter-token gaps),
takes the usage numbers where the endpoint's reader finds them, and says whether the client
should see OpenAI's usage chunk (the gateway asks for it even when the client did not). What
each kind of stream carries is its endpoint's :class:`gateway.endpoints.EventReader`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hearthgate.gateway.endpoints import EventReader

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


def event_data(event: bytes) -> bytes | None:
    """The ``data:`` field of one event (OpenAI's chunks start with it; named events such as
    the Responses API's put ``event: <type>`` first); None when the event has none."""
    if event.startswith(_DATA):
        start = len(_DATA)
    else:
        at = event.find(b"\n" + _DATA)
        if at < 0:
            return None
        start = at + 1 + len(_DATA)
    end = event.find(b"\n", start)
    return event[start : end if end >= 0 else None].strip()


@dataclass
class StreamObserver:
    """Watches relayed events through the endpoint's ``reader`` (gateway/endpoints);
    ``strip_usage`` drops OpenAI's usage-only chunk from the client view."""

    reader: EventReader
    strip_usage: bool = False
    token_events: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    gaps: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: dict[str, Any] | None = None
    ident: str | None = None  # the answer's id, where the stream names it
    done: bool = False

    def observe(self, event: bytes, now: float) -> bool:
        """Record ``event`` seen at ``now``; return True if the client should receive it."""
        payload = event_data(event)
        if payload is None:
            return True
        if payload == b"[DONE]":
            self.done = True
            return True
        fast = self.reader.fast(payload)
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
        seen = self.reader.read(obj)
        if seen.error is not None:
            self.error = seen.error
        if seen.prompt_tokens is not None:
            self.prompt_tokens = seen.prompt_tokens
        if seen.completion_tokens is not None:
            self.completion_tokens = seen.completion_tokens
        if seen.ident is not None:
            self.ident = seen.ident
        if seen.token:
            self._token(now)
        return not (seen.usage_only and self.strip_usage)

    def _token(self, now: float) -> None:
        self.token_events += 1
        if self.first_token_at is None:
            self.first_token_at = now
        elif self.last_token_at is not None:
            self.gaps.append(now - self.last_token_at)
        self.last_token_at = now
