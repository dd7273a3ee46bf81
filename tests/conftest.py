"""Fixtures for every test folder."""

from __future__ import annotations

# Real Redis servers started by the tests themselves (tests/redis_support.py).
from tests.redis_support import fresh_redis, make_redis, redis_server, redis_url  # noqa: F401
