"""The settings behind decode pacing, as the gateway hands them to the admission controller:
the background rule and the per-app cap's floor, both off together or per_app alone."""

from __future__ import annotations

from typing import Any

import pytest

from hearthgate.gateway.scheduling import app_pacing_floor, class_policy, pacing_rule
from hearthgate.gateway.settings import RequestClass, load_settings

WORKERS = [{"name": "w0", "url": "http://127.0.0.1:9", "models": ["m"]}]


def settings(**pacing: Any) -> Any:
    return load_settings(None, workers=WORKERS, scheduler={"pacing": pacing})


def test_defaults_pace_background_and_apps() -> None:
    s = settings()
    rule = pacing_rule(s)
    assert rule is not None
    assert rule.target_gap_s == pytest.approx(0.015)  # 0.3 x the chat class's 50 ms itl
    assert rule.prefill_gap_s == pytest.approx(0.025)  # prefill pacing: 0.5 x 50 ms
    assert rule.app_gap_s == pytest.approx(0.015)  # the per-app cap: background's gap
    assert app_pacing_floor(s) == 4


def test_the_per_app_cap_may_hold_its_own_share_of_itl() -> None:
    rule = pacing_rule(settings(app_target_fraction=0.2))
    assert rule is not None and rule.app_gap_s == pytest.approx(0.01)  # 0.2 x 50 ms
    assert rule.target_gap_s == pytest.approx(0.015)  # background's gap unchanged
    fixed = pacing_rule(settings(target_gap_ms=12))
    assert fixed is not None and fixed.app_gap_s == pytest.approx(0.012)  # follows it
    own = pacing_rule(settings(target_gap_ms=12, app_target_fraction=0.16))
    assert own is not None and own.app_gap_s == pytest.approx(0.008)  # its own share
    with pytest.raises(Exception, match="app_target_fraction"):
        settings(app_target_fraction=0)


def test_prefill_pacing_is_set_as_a_share_of_itl_or_turned_off() -> None:
    rule = pacing_rule(settings(prefill_fraction=0.4))
    assert rule is not None and rule.prefill_gap_s == pytest.approx(0.02)  # 0.4 x 50 ms
    assert rule.target_gap_s == pytest.approx(0.015)
    off = pacing_rule(settings(prefill_fraction=None))
    assert off is not None and off.prefill_gap_s is None
    with pytest.raises(Exception, match="prefill_fraction"):
        settings(prefill_fraction=0)


def test_the_flood_prefill_limit_reaches_the_rule() -> None:
    assert settings().scheduler.pacing.flood_prefill == 1
    assert pacing_rule(settings(flood_prefill=None)).flood_prefill is None  # type: ignore[union-attr]
    rule = pacing_rule(settings(flood_prefill=2))
    assert rule is not None and rule.flood_prefill == 2
    with pytest.raises(Exception, match="flood_prefill"):
        settings(flood_prefill=0)


def test_the_per_app_gap_follows_the_workers_speed_by_default() -> None:
    assert pacing_rule(settings()).app_gap_steps == 3.0  # type: ignore[union-attr]
    rule = pacing_rule(settings(app_gap_steps=2.5))
    assert rule is not None and rule.app_gap_steps == 2.5
    assert pacing_rule(settings(app_gap_steps=None)).app_gap_steps is None  # type: ignore[union-attr]
    with pytest.raises(Exception, match="app_gap_steps"):
        settings(app_gap_steps=0.5)


def test_the_flood_yield_reaches_the_rule() -> None:
    assert settings().scheduler.pacing.flood_yields is True
    assert pacing_rule(settings()).flood_yields is True  # type: ignore[union-attr]
    assert pacing_rule(settings(flood_yields=False)).flood_yields is False  # type: ignore[union-attr]
    assert pacing_rule(settings()).flood_until_first_token is False  # type: ignore[union-attr]
    rule = pacing_rule(settings(flood_until_first_token=True))
    assert rule is not None and rule.flood_until_first_token is True


def test_the_background_prefill_limit_is_off_by_default_and_reaches_the_rule() -> None:
    assert pacing_rule(settings()).background_prefill is None  # type: ignore[union-attr]
    rule = pacing_rule(settings(background_prefill=1))
    assert rule is not None and rule.background_prefill == 1
    with pytest.raises(Exception, match="background_prefill"):
        settings(background_prefill=0)


def test_late_cuts_of_the_decode_cap_are_only_when_blind_by_default_or_always() -> None:
    assert pacing_rule(settings()).late_cut_when_blind is True  # type: ignore[union-attr]
    rule = pacing_rule(settings(late_cuts_decode_cap="always"))
    assert rule is not None and rule.late_cut_when_blind is False
    with pytest.raises(Exception, match="late_cuts_decode_cap"):
        settings(late_cuts_decode_cap="never")


def test_the_cap_grows_in_proportion_by_default_or_additively() -> None:
    assert pacing_rule(settings()).proportional_growth is True  # type: ignore[union-attr]
    rule = pacing_rule(settings(cap_growth="additive"))
    assert rule is not None and rule.proportional_growth is False
    with pytest.raises(Exception, match="cap_growth"):
        settings(cap_growth="exponential")


def test_per_app_off_keeps_background_pacing() -> None:
    s = settings(per_app=False)
    assert pacing_rule(s) is not None
    assert app_pacing_floor(s) is None


def test_pacing_off_turns_off_both() -> None:
    s = settings(enabled=False, app_min_cap=2)
    assert pacing_rule(s) is None
    assert s.prefill_gap_ms() is None
    assert app_pacing_floor(s) is None


def test_app_floor_is_set_by_hand() -> None:
    assert app_pacing_floor(settings(app_min_cap=8)) == 8
    with pytest.raises(Exception, match="app_min_cap"):
        settings(app_min_cap=0)


def test_the_looser_gap_while_background_is_behind_is_on_by_default_or_turned_off() -> None:
    rule = pacing_rule(settings())
    assert rule is not None and rule.behind_gap_s == pytest.approx(0.04)  # 0.8 x 50 ms
    rule = pacing_rule(settings(prefill_behind_fraction=None))
    assert rule is not None and rule.behind_gap_s is None
    rule = pacing_rule(settings(prefill_behind_fraction=0.6))
    assert rule is not None and rule.behind_gap_s == pytest.approx(0.03)  # 0.6 x 50 ms
    # Never tighter than prefill pacing's own gap, and nothing without prefill pacing.
    tighter = pacing_rule(settings(prefill_behind_fraction=0.3))
    assert tighter is not None and tighter.behind_gap_s == pytest.approx(0.025)
    assert (
        settings(prefill_fraction=None, prefill_behind_fraction=0.8).prefill_behind_gap_ms() is None
    )


def test_a_standing_line_wait_reaches_the_class_policy_in_seconds() -> None:
    c = RequestClass(priority=2, ttft_ms=3000, shed_late=True, shed_after_wait_ms=9000)
    policy = class_policy("rag", c)
    assert policy.shed_late and policy.shed_after_wait_s == pytest.approx(9.0)
    assert class_policy("rag", RequestClass(priority=2)).shed_after_wait_s is None
    with pytest.raises(ValueError, match="shed_after_wait_ms"):
        RequestClass(priority=2, shed_after_wait_ms=0)


def test_the_shipped_rag_class_sheds_once_its_line_has_stood_15_s() -> None:
    rag = class_policy("rag", settings().classes["rag"])
    assert rag.shed_late and rag.shed_after_wait_s == pytest.approx(15.0)
    assert settings().classes["embed"].shed_after_wait_ms is None  # embed: at once
    assert not rag.shed_queued  # its backlog is not told (measured once, not adopted)
    on = RequestClass(priority=2, ttft_ms=3000, shed_late=True, shed_queued=True)
    assert class_policy("rag", on).shed_queued
