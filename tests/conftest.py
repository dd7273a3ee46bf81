"""Fixtures for every test folder."""

from __future__ import annotations

from hypothesis import settings as hypothesis_settings

# Real Redis servers started by the tests themselves (tests/redis_support.py).
from tests.redis_support import fresh_redis, make_redis, redis_server, redis_url  # noqa: F401

# Property tests judge results, not speed: on these shared 2-core boxes one example can take
# over a second while a benchmark or a vLLM worker holds the cores (hypothesis's default
# 200 ms deadline failed test_closed_loop_holds_the_target_without_collapsing that way).
hypothesis_settings.register_profile("hearthgate", deadline=None)
hypothesis_settings.load_profile("hearthgate")
