"""``plan_reload`` and the ``Reloader`` on plain values: what a reload applies, what it
leaves for the next start, and what it refuses (keeping the running settings)."""

from __future__ import annotations

from typing import Any

import pytest

from hearthgate.gateway.reload import Reloader, plan_reload
from hearthgate.gateway.settings import Settings, SettingsError

WORKERS = [{"name": "w0", "url": "http://w0", "models": ["m"]}]


def make(**extra: Any) -> Settings:
    return Settings(**{"workers": WORKERS, **extra})


def test_nothing_changed() -> None:
    plan = plan_reload(make(), make())
    assert (plan.changed, plan.at_restart) == ([], [])


def test_live_sections_change_and_restart_only_ones_are_kept() -> None:
    old = make(listen={"port": 8000}, upstream={"max_connections": 100})
    new = make(
        listen={"port": 9000},
        upstream={"max_connections": 7},
        limits={"max_body_bytes": 4321},
        classes={"chat": {"priority": 3, "interactive": True}, "embed": {"priority": 4}},
    )
    plan = plan_reload(old, new)
    assert set(plan.changed) == {"limits", "classes"}
    assert plan.at_restart == ["listen", "upstream"]
    assert plan.settings.listen.port == 8000  # kept until the next start
    assert plan.settings.upstream.max_connections == 100
    assert plan.settings.limits.max_body_bytes == 4321
    assert plan.settings.classes["chat"].priority == 3


def test_the_scheduler_tick_waits_for_a_restart_but_weights_apply() -> None:
    plan = plan_reload(make(), make(scheduler={"tick_ms": 10, "w_out": 3.0}))
    assert plan.changed == ["scheduler"]
    assert plan.at_restart == ["scheduler.tick_ms"]
    assert plan.settings.scheduler.tick_ms == 50.0
    assert plan.settings.scheduler.w_out == 3.0


def test_opening_to_the_network_without_keys_is_refused() -> None:
    old = make(
        listen={"host": "0.0.0.0"},
        apps=[{"name": "a", "key_sha256": "ab" * 32}],
    )
    new = make(listen={"host": "0.0.0.0"}, apps=[{"name": "a"}])
    with pytest.raises(ValueError, match="no app has a key"):
        plan_reload(old, new)


def test_a_new_file_without_the_batch_class_is_refused_when_batches_run() -> None:
    old = make(redis={"url": "redis://127.0.0.1:1/0"})
    classes = {"chat": {"priority": 1, "interactive": True}, "embed": {"priority": 3}}
    new = make(redis={"url": "redis://127.0.0.1:1/0"}, classes=classes)
    with pytest.raises(ValueError, match=r"batch\.class 'batch'"):
        plan_reload(old, new)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_reloader_applies_valid_settings_and_keeps_old_ones_on_error() -> None:
    clock = Clock()
    applied: list[Settings] = []
    files = [make(limits={"max_body_bytes": 9999})]

    def source() -> Settings:
        got = files.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    r = Reloader(make(), applied.append, source, "s.yaml", wall_clock=clock)
    assert r.loaded_at == 1000.0
    clock.now = 1010.0
    out = r.reload()
    assert out.ok and out.changed == ["limits"] and out.at == 1010.0
    assert applied[-1].limits.max_body_bytes == 9999
    assert r.settings.limits.max_body_bytes == 9999 and r.loaded_at == 1010.0

    clock.now = 1020.0
    files.append(SettingsError("s.yaml: classes.chat.priority: not an integer"))  # type: ignore[arg-type]
    out = r.reload()
    assert not out.ok and "classes.chat.priority" in str(out.error)
    assert len(applied) == 1 and r.loaded_at == 1010.0  # nothing applied, old load time
    assert r.status()["last_reload"]["ok"] is False


def test_a_refusal_by_apply_keeps_the_old_settings() -> None:
    def refuse(s: Settings) -> None:
        raise ValueError("class rag still has requests queued or in flight")

    r = Reloader(make(), refuse, lambda: make(limits={"max_body_bytes": 5555}))
    out = r.reload()
    assert not out.ok and "class rag" in str(out.error)
    assert r.settings.limits.max_body_bytes != 5555


def test_without_a_source_a_reload_is_refused_clearly() -> None:
    out = Reloader(make(), lambda s: None).reload()
    assert not out.ok and "not started from a settings file" in str(out.error)
