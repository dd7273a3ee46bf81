"""Who sent a request (the app, from its API key) and which class it belongs to.

The class comes from, in order: the ``X-Hearthgate-Class`` header when the app may choose,
the first matching rule of the settings, the app's default class, the global default.
Prompt tokens are estimated from the characters of the prompt (``tokens.chars_per_token``,
rounded up; exact when the client sends token ids); the gateway may replace the estimate
with the worker's own tokenizer count for long prompts, and every estimate is corrected by
the worker's usage numbers when the request ends.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from hearthgate.gateway.auth import AppKeys, bearer_key
from hearthgate.gateway.errors import BadRequest, Unauthorized
from hearthgate.gateway.parse import ParsedRequest
from hearthgate.gateway.settings import App, Rule, Settings

CLASS_HEADER = "x-hearthgate-class"
ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class Classification:
    app: str
    cls: str
    prompt_tokens: int
    max_tokens: int


def _rule_matches(rule: Rule, parsed: ParsedRequest, prompt_tokens: int, max_tokens: int) -> bool:
    checks = (
        rule.endpoint is None or rule.endpoint == parsed.endpoint,
        rule.model is None or rule.model == parsed.model,
        rule.stream is None or rule.stream == parsed.stream,
        rule.min_prompt_tokens is None or prompt_tokens >= rule.min_prompt_tokens,
        rule.max_prompt_tokens is None or prompt_tokens <= rule.max_prompt_tokens,
        rule.min_max_tokens is None or max_tokens >= rule.min_max_tokens,
        rule.max_max_tokens is None or max_tokens <= rule.max_max_tokens,
    )
    return all(checks)


class Classifier:
    """Authenticates apps and assigns classes; reads API keys once, at construction."""

    def __init__(self, settings: Settings, environ: Mapping[str, str] = os.environ) -> None:
        self._settings = settings
        self._keys = AppKeys(settings, environ)
        self.auth_required = settings.has_app_keys()
        self._open_app = next((a for a in settings.apps if not a.has_key), None)

    def authenticate(self, authorization: str | None) -> App | None:
        """The app owning the bearer key; None when no keys are configured. Raises 401.
        Keys are compared as SHA-256 digests, each in constant time (gateway.auth)."""
        if not self.auth_required:
            return self._open_app
        key = bearer_key(authorization)
        if key is None:
            raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
        found = self._keys.find(key)
        if found is None:
            raise Unauthorized("invalid API key")
        return found

    def max_tokens(self, parsed: ParsedRequest) -> int:
        if parsed.spec.cost is not None:
            return parsed.spec.cost(parsed)[1]
        if not parsed.spec.generates:
            return 0
        per_sequence = parsed.max_tokens
        if per_sequence is None:
            per_sequence = self._settings.tokens.default_max_tokens
        n = parsed.body.get("n")
        # `n` completions decode as `n` sequences: each may produce max_tokens.
        return per_sequence * (n if isinstance(n, int) and n > 1 else 1)

    def classify(
        self,
        parsed: ParsedRequest,
        app: App | None,
        class_header: str | None,
        prompt_tokens: int,
    ) -> Classification:
        s = self._settings
        max_tokens = self.max_tokens(parsed)
        app_name = app.name if app is not None else ANONYMOUS
        cls: str | None = None
        if class_header and app is not None and app.may_choose_class:
            allowed = s.choosable_classes(app)
            if class_header not in allowed:
                raise BadRequest(
                    f"app {app.name} may not choose class {class_header!r} in "
                    f"X-Hearthgate-Class; it may choose: {', '.join(allowed) or 'none'}"
                )
            cls = class_header
        if cls is None:
            for rule in s.rules:
                if _rule_matches(rule, parsed, prompt_tokens, max_tokens):
                    cls = rule.class_
                    break
        if cls is None and app is not None:
            cls = app.default_class
        if cls is None:
            cls = s.default_class
        return Classification(app_name, cls, prompt_tokens, max_tokens)
