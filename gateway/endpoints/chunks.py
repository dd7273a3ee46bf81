"""OpenAI's streamed chunks (chat and completions): ``data: {"choices": [...]}`` events, and
a last usage chunk with empty ``choices`` when the request asked for it."""

from __future__ import annotations

from typing import Any

from hearthgate.gateway.endpoints.spec import NOTHING, Seen, count

_SLOW = (b'"usage":{', b'"error"', b'"text":""', b'"content":""', b'"content":null')
_TOKEN = (b'"text":"', b'"content":"', b'"tool_calls":[', b'"reasoning_content":"')


def _has_token(choice: dict[str, Any]) -> bool:
    if choice.get("text"):
        return True
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return bool(
            delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls")
        )
    return False


class ChunkReader:
    """Reads chat and completions chunks."""

    def fast(self, data: bytes) -> bool | None:
        """Whether a compact vLLM chunk carries a token, from its bytes alone; None when
        only a JSON parse can tell (usage, errors, empty texts next to others, other
        spacing). Safe because JSON escapes quotes inside strings: ``"text":"`` can only
        be a key."""
        if any(m in data for m in _SLOW):
            return None
        if b'"choices":[{' not in data:
            return None
        return True if any(m in data for m in _TOKEN) else None

    def read(self, event: dict[str, Any]) -> Seen:
        if isinstance(event.get("error"), dict):
            return Seen(error=event["error"])
        usage = event.get("usage")
        choices = event.get("choices")
        token = isinstance(choices, list) and any(
            isinstance(c, dict) and _has_token(c) for c in choices
        )
        if isinstance(usage, dict):
            return Seen(
                token=token,
                prompt_tokens=count(usage.get("prompt_tokens")),
                completion_tokens=count(usage.get("completion_tokens")),
                usage_only=not choices,
            )
        return Seen(token=True) if token else NOTHING
