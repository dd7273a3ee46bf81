"""Real Redis servers for the tests (``deploy/redis_server.py``), never the system's service.

Fixtures (``tests/conftest.py`` makes them available to every test):

- ``redis_server``: one server for the whole session, in a temporary directory;
- ``redis_url``: that server's URL, its data flushed (``FLUSHALL``) before each test;
- ``make_redis``: a factory, ``make_redis(appendfsync="everysec")`` starts a server of the
  test's own (own port, own data directory); all are stopped after the test;
- ``fresh_redis``: ``make_redis()`` with ``appendfsync="always"``, for tests that kill or
  restart Redis (every acknowledged write is on disk, so ``kill()`` loses none).

A missing ``redis-server`` fails these tests with the hint that ``make setup`` installs it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hearthgate.deploy.redis_server import AppendFsync, RedisServer, RedisServerError

MakeRedis = Callable[..., RedisServer]


def start_redis(data_dir: Path, appendfsync: AppendFsync = "everysec") -> RedisServer:
    """A started RedisServer in ``data_dir``; a missing or failing redis-server fails the
    test with its message (no traceback into the fixture)."""
    server = RedisServer(data_dir, appendfsync=appendfsync)
    try:
        server.start()
    except RedisServerError as exc:
        pytest.fail(str(exc), pytrace=False)
    return server


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = start_redis(tmp_path_factory.mktemp("redis-session"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    if not redis_server.running:  # a test stopped the shared server: bring it back
        redis_server.start()
    redis_server.command("FLUSHALL")
    return redis_server.url


@pytest.fixture
def make_redis(tmp_path: Path) -> Iterator[MakeRedis]:
    servers: list[RedisServer] = []

    def make(appendfsync: AppendFsync = "everysec") -> RedisServer:
        server = start_redis(tmp_path / f"redis-{len(servers)}", appendfsync)
        servers.append(server)
        return server

    try:
        yield make
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def fresh_redis(make_redis: MakeRedis) -> RedisServer:
    return make_redis(appendfsync="always")
