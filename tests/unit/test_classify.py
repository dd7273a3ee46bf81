"""Classification: app from API key, class from header / rules / app default / global."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hearthgate.gateway.classify import Classifier
from hearthgate.gateway.errors import BadRequest, Unauthorized
from hearthgate.gateway.parse import ParsedRequest, parse_body
from hearthgate.gateway.settings import Settings, load_settings
from hearthgate.gateway.tokens import HeuristicCounter

WORKERS = [{"name": "w", "url": "http://127.0.0.1:1", "models": ["m"]}]
ENV = {"ASSISTANT_KEY": "k-assistant", "NOTES_KEY": "k-notes"}


def settings(**extra: Any) -> Settings:
    base: dict[str, Any] = {
        "workers": WORKERS,
        "apps": [
            {"name": "assistant", "key_env": "ASSISTANT_KEY", "default_class": "voice"},
            {"name": "notes", "key_env": "NOTES_KEY", "may_choose_class": True},
        ],
        "rules": [
            {"endpoint": "embeddings", "class": "embed"},
            {"min_prompt_tokens": 1500, "class": "rag"},
            {"stream": False, "min_max_tokens": 512, "class": "batch"},
        ],
    }
    base.update(extra)
    return load_settings(None, **base)


def req(endpoint: str = "chat", **body: Any) -> ParsedRequest:
    key = {"chat": "messages", "completions": "prompt", "embeddings": "input"}[endpoint]
    full = {"model": "m", key: [{"role": "user", "content": "hi"}] if key == "messages" else "hi"}
    full.update(body)
    return parse_body(json.dumps(full).encode(), endpoint)


def test_keys_pick_the_app_in_constant_time_compare() -> None:
    c = Classifier(settings(), ENV)
    app = c.authenticate("Bearer k-notes")
    assert app is not None and app.name == "notes"
    for bad in (None, "", "Basic x", "Bearer", "Bearer k-note", "Bearer k-notes2"):
        with pytest.raises(Unauthorized):
            c.authenticate(bad)


def test_no_keys_configured_means_open() -> None:
    c = Classifier(settings(apps=[]), ENV)
    assert not c.auth_required
    assert c.authenticate(None) is None
    assert c.classify(req(), None, None, 10).app == "anonymous"


def test_unset_key_env_cannot_authenticate() -> None:
    c = Classifier(settings(), {"NOTES_KEY": "k-notes"})
    with pytest.raises(Unauthorized):
        c.authenticate("Bearer k-assistant")


def test_order_header_rules_app_default_global() -> None:
    s = settings()
    c = Classifier(s, ENV)
    assistant, notes = s.apps
    # Rules first: a long prompt is rag even from the voice app.
    assert c.classify(req(), assistant, None, 2000).cls == "rag"
    # Then the app's default.
    assert c.classify(req(), assistant, None, 10).cls == "voice"
    # Then the global default.
    assert c.classify(req(), notes, None, 10).cls == "chat"
    # The header wins for an app allowed to choose...
    assert c.classify(req(), notes, "batch", 2000).cls == "batch"
    # ...and is ignored for one that is not.
    assert c.classify(req(), assistant, "batch", 10).cls == "voice"
    with pytest.raises(BadRequest, match="may not choose class 'vip'"):
        c.classify(req(), notes, "vip", 10)


def test_rule_conditions() -> None:
    c = Classifier(settings(), ENV)
    assert c.classify(req("embeddings"), None, None, 5).cls == "embed"
    assert c.classify(req(max_tokens=600), None, None, 5).cls == "batch"
    assert c.classify(req(max_tokens=600, stream=True), None, None, 5).cls == "chat"


def test_token_estimate_heuristic_and_ids() -> None:
    c = Classifier(settings(), ENV)
    h = HeuristicCounter(settings().tokens)
    assert h.estimate(req("completions", prompt="x" * 41)) == 11  # ceil(41/4)
    assert h.estimate(req("completions", prompt=[1, 2, 3, 4, 5])) == 5
    chat = req(
        messages=[
            {"role": "system", "content": "abcd"},
            {"role": "user", "content": [{"type": "text", "text": "efgh"}]},
        ]
    )
    assert h.estimate(chat) == 2
    assert c.max_tokens(req()) == 256  # default when the client sets none
    assert c.max_tokens(req(max_tokens=9)) == 9
    assert c.max_tokens(req("embeddings")) == 0


def test_settings_reject_unknown_class_references() -> None:
    with pytest.raises(Exception, match=r"rules\.0\.class: unknown class 'vip'"):
        settings(rules=[{"class": "vip"}])
    with pytest.raises(Exception, match="default_class"):
        settings(default_class="nope")
