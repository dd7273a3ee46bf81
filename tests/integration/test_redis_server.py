"""deploy/redis_server.py against the real ``redis-server`` binary (``make setup`` installs
it), the Redis fixtures of tests/redis_support.py, and how ``make run`` picks its Redis."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import redis

from hearthgate.deploy import redis_server as rs
from hearthgate.deploy.gateway_process import free_port
from hearthgate.deploy.redis_server import RedisServer, RedisServerError, ping, port_free
from hearthgate.deploy.run_local import plan_redis
from hearthgate.gateway.settings import Settings, load_settings


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_starts_on_loopback_with_append_only_persistence(fresh_redis: RedisServer) -> None:
    assert ping(fresh_redis.port)
    assert fresh_redis.url == f"redis://127.0.0.1:{fresh_redis.port}/0"
    assert fresh_redis.command("PING") == "PONG"
    config = fresh_redis.command("CONFIG", "GET", "*")
    assert isinstance(config, list)
    got = dict(zip(config[::2], config[1::2], strict=True))
    assert got[b"appendonly"] == b"yes"
    assert got[b"appendfsync"] == b"always"
    assert got[b"save"] == b""
    assert got[b"bind"] == b"127.0.0.1"
    assert got[b"daemonize"] == b"no"
    assert got[b"dir"] == str(fresh_redis.data_dir).encode()
    assert (fresh_redis.data_dir / "redis.log").read_text().strip()


def test_writes_survive_a_kill(fresh_redis: RedisServer) -> None:
    client = redis.Redis.from_url(fresh_redis.url)
    try:
        client.set("job:1", "queued")
        client.rpush("queue", "a", "b")
    finally:
        client.close()
    pid, port = fresh_redis.pid, fresh_redis.port
    assert pid is not None
    assert fresh_redis.kill() == -9
    assert not fresh_redis.running and _gone(pid) and not ping(port)
    fresh_redis.start()
    assert fresh_redis.port == port and fresh_redis.pid != pid
    assert fresh_redis.command("GET", "job:1") == b"queued"
    assert fresh_redis.command("LRANGE", "queue", 0, -1) == [b"a", b"b"]


def test_restart_keeps_port_and_data(fresh_redis: RedisServer) -> None:
    url = fresh_redis.url
    assert fresh_redis.command("INCRBY", "n", 5) == 5
    assert fresh_redis.restart() == url
    assert fresh_redis.command("INCRBY", "n", 1) == 6


def test_everysec_default_keeps_data_across_a_stop(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "r") as server:
        assert server.appendfsync == "everysec"
        server.command("SET", "k", "v")
    with RedisServer(tmp_path / "r", port=server.port) as again:
        assert again.command("GET", "k") == b"v"


def test_stop_leaves_no_process(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "r")
    server.start()
    pid = server.pid
    assert pid is not None
    assert server.stop() == 0
    assert _gone(pid) and not server.running and not ping(server.port)
    assert port_free(server.port)
    assert server.stop() is None  # idempotent


def test_one_server_per_data_dir(fresh_redis: RedisServer) -> None:
    with pytest.raises(RedisServerError, match="in use by another redis-server"):
        RedisServer(fresh_redis.data_dir).start()
    fresh_redis.kill()  # killed, the directory stays taken until stop()
    with pytest.raises(RedisServerError, match="in use"):
        RedisServer(fresh_redis.data_dir).start()
    fresh_redis.stop()
    with RedisServer(fresh_redis.data_dir) as other:
        assert other.command("PING") == "PONG"


def test_busy_port_fails_with_the_log_tail(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = RedisServer(tmp_path / "r", port=taken.getsockname()[1])
        with pytest.raises(RedisServerError, match="exited") as err:
            server.start()
    assert "Address already in use" in str(err.value)
    assert not server.running


def test_missing_binary_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(rs, "SEARCH_DIRS", (str(tmp_path),))
    assert rs.find_redis_server() is None
    with pytest.raises(RedisServerError) as err:
        RedisServer(tmp_path / "r").start()
    assert "redis-server not found" in str(err.value)
    assert "make setup" in str(err.value) and "apt-get install redis-server" in str(err.value)
    with pytest.raises(RedisServerError, match="make setup"):
        RedisServer(tmp_path / "r", binary=str(tmp_path / "redis-server")).start()


def test_find_redis_server_finds_the_installed_binary() -> None:
    found = rs.find_redis_server()
    assert found is not None and os.access(found, os.X_OK)


@pytest.mark.parametrize("run", [1, 2])
def test_redis_url_gives_every_test_an_empty_database(redis_url: str, run: int) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.dbsize() == 0
        client.set(f"left-behind-{run}", "x")
    finally:
        client.close()


def _settings(tmp_path: Path, redis_section: str = "") -> Settings:
    path = tmp_path / "settings.yaml"
    path.write_text(
        'workers: [{name: g, url: "http://127.0.0.1:8000", models: [m]}]\n' + redis_section
    )
    return load_settings(path)


def test_make_run_starts_a_redis_only_when_none_is_configured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HEARTHGATE_REDIS__URL", raising=False)
    configured = _settings(tmp_path, "redis: {url: 'redis://10.0.0.5:6379/0'}\n")
    assert plan_redis(configured, {}) is None
    assert plan_redis(_settings(tmp_path), {"HEARTHGATE_REDIS__URL": "redis://h:1/0"}) is None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        planned = plan_redis(_settings(tmp_path), {}, data_dir=tmp_path / "redis", port=busy)
    assert planned is not None and planned.port != busy and not planned.running
    assert planned.data_dir == (tmp_path / "redis").resolve()
    free = free_port()
    planned = plan_redis(_settings(tmp_path), {}, data_dir=tmp_path / "redis", port=free)
    assert planned is not None and planned.port == free
