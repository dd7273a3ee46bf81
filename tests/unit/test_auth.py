"""Safe by default: the refusal to serve the network without keys, hashed keys, the admin
key's rules, and the keys `make run` makes up (deploy/run_local.py)."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from hearthgate.deploy.run_local import KEY_VAR, demo_admin_key, demo_keys, ready_message
from hearthgate.gateway.auth import AdminGuard, AppKeys, bearer_key
from hearthgate.gateway.classify import Classifier
from hearthgate.gateway.cli import main as hearthgate
from hearthgate.gateway.errors import Unauthorized
from hearthgate.gateway.settings import Settings, SettingsError, is_loopback, load_settings

REPO = Path(__file__).resolve().parents[2]
WORKERS = [{"name": "w", "url": "http://127.0.0.1:1", "models": ["m"]}]
PLAIN = "correct horse battery staple"
DIGEST = hashlib.sha256(PLAIN.encode()).hexdigest()


@pytest.fixture(autouse=True)
def _no_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("HEARTHGATE_")]:
        monkeypatch.delenv(key)


def settings(**extra: Any) -> Settings:
    return load_settings(None, **{"workers": WORKERS, **extra})


# ----- the refusal -----


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "nas.local", ""])
def test_network_host_without_keys_is_refused(host: str) -> None:
    problem = settings(listen={"host": host}).exposure_problem()
    assert problem is not None
    assert "(reachable from the network) but no app has a key" in problem
    assert "key_env" in problem and "key_sha256" in problem
    assert "deploy/settings.example.yaml" in problem
    assert "allow_anonymous: true" in problem


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.2.1", "::1", "localhost", "LOCALHOST"])
def test_loopback_without_keys_is_fine(host: str) -> None:
    assert settings(listen={"host": host}).exposure_problem() is None


@pytest.mark.parametrize(
    "extra",
    [
        {"apps": [{"name": "a", "key_env": "A_KEY"}]},
        {"apps": [{"name": "open"}, {"name": "a", "key_sha256": DIGEST}]},
        {"auth": {"allow_anonymous": True}},
    ],
)
def test_keys_or_allow_anonymous_lift_the_refusal(extra: dict[str, Any]) -> None:
    assert settings(listen={"host": "0.0.0.0"}, **extra).exposure_problem() is None


def test_an_app_without_a_key_is_no_key() -> None:
    s = settings(listen={"host": "0.0.0.0"}, apps=[{"name": "open", "default_class": "chat"}])
    assert s.exposure_problem() is not None


def test_is_loopback() -> None:
    assert is_loopback("::ffff:127.0.0.1") and is_loopback("[::1]")
    assert not is_loopback("::ffff:10.0.0.1") and not is_loopback("10.0.0.1")
    assert not is_loopback("testclient")


def test_check_reports_the_refusal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "open.yaml"
    cfg.write_text(yaml.safe_dump({"listen": {"host": "0.0.0.0"}, "workers": WORKERS}))
    assert hearthgate(["check", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"refusing to serve {cfg}: listen.host is 0.0.0.0" in err
    assert "allow_anonymous: true" in err
    cfg.write_text(
        yaml.safe_dump(
            {"listen": {"host": "0.0.0.0"}, "workers": WORKERS, "auth": {"allow_anonymous": True}}
        )
    )
    assert hearthgate(["check", str(cfg)]) == 0
    assert "ok (1 workers: w)" in capsys.readouterr().out


def test_environment_override_of_the_host_is_checked_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "loopback.yaml"
    cfg.write_text(yaml.safe_dump({"workers": WORKERS}))
    assert hearthgate(["check", str(cfg)]) == 0
    monkeypatch.setenv("HEARTHGATE_LISTEN__HOST", "0.0.0.0")  # as the container image does
    assert hearthgate(["check", str(cfg)]) == 2
    assert "listen.host is 0.0.0.0" in capsys.readouterr().err


def test_shipped_settings_pass() -> None:
    for name in ("settings.example.yaml", "config/settings.yaml"):
        assert load_settings(REPO / "deploy" / name).exposure_problem() is None


# ----- settings validation of keys -----


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"apps": [{"name": "a", "key_sha256": PLAIN}]}, "apps.0.key_sha256: Value error"),
        ({"apps": [{"name": "a", "key_sha256": DIGEST[:-1]}]}, "apps.0.key_sha256"),
        ({"apps": [{"name": "a", "key_sha256": DIGEST[:-1] + "g"}]}, "apps.0.key_sha256"),
        (
            {"apps": [{"name": "a", "key_env": "A", "key_sha256": DIGEST}]},
            "apps.0: Value error, set key_env or key_sha256, not both",
        ),
        ({"apps": [{"name": "a", "key_env": ""}]}, "apps.0.key_env"),
        ({"auth": {"admin_key_sha256": "x"}}, "auth.admin_key_sha256"),
        (
            {"auth": {"admin_key_env": "X", "admin_key_sha256": DIGEST}},
            "auth: Value error, set admin_key_env or admin_key_sha256, not both",
        ),
        ({"auth": {"allow_anonymus": True}}, "auth.allow_anonymus: unknown key"),
    ],
)
def test_bad_keys_name_the_key(extra: dict[str, Any], needle: str) -> None:
    with pytest.raises(SettingsError) as info:
        settings(**extra)
    assert needle in str(info.value)


def test_sha256_is_normalised_to_lower_case() -> None:
    s = settings(apps=[{"name": "a", "key_sha256": DIGEST.upper()}])
    assert s.apps[0].key_sha256 == DIGEST


# ----- app keys -----


def test_hashed_key_authenticates_with_the_plain_key() -> None:
    s = settings(
        apps=[
            {"name": "env-app", "key_env": "ENV_APP_KEY"},
            {"name": "hashed", "key_sha256": DIGEST.upper()},
        ]
    )
    c = Classifier(s, {"ENV_APP_KEY": "env-secret"})
    assert c.auth_required
    found = c.authenticate(f"Bearer {PLAIN}")
    assert found is not None and found.name == "hashed"
    found = c.authenticate("bearer   env-secret ")
    assert found is not None and found.name == "env-app"
    for bad in (f"Bearer {DIGEST}", "Bearer correct horse", None, f"Basic {PLAIN}", "Bearer "):
        with pytest.raises(Unauthorized):
            c.authenticate(bad)


def test_every_digest_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    apps = [{"name": f"a{i}", "key_env": f"K{i}"} for i in range(3)]
    keys = AppKeys(settings(apps=apps), {"K0": "zero", "K1": "one", "K2": "two"})
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)  # what gateway.auth calls
    for key, want in (("zero", "a0"), ("two", "a2"), ("nobody", None)):
        calls.clear()
        found = keys.find(key)
        assert (found.name if found else None) == want
        # the same work whichever key matched (or none): every digest, all 32 bytes long
        assert len(calls) == 3
        assert all(len(a) == len(b) == 32 for a, b in calls)


def test_unset_key_env_locks_its_app_out_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    s = settings(apps=[{"name": "a", "key_env": "MISSING_KEY"}])
    c = Classifier(s, {})
    assert "app a: environment variable MISSING_KEY is not set" in caplog.text
    with pytest.raises(Unauthorized):
        c.authenticate("Bearer ")
    with pytest.raises(Unauthorized):
        c.authenticate("Bearer anything")


def test_bearer_key() -> None:
    assert bearer_key("Bearer abc") == "abc"
    assert bearer_key("BEARER  abc  ") == "abc"
    assert bearer_key("Bearer") is None
    assert bearer_key("Basic abc") is None
    assert bearer_key(None) is None


# ----- the admin key -----


def test_admin_key_from_env_or_hash() -> None:
    for auth, env in (
        ({"admin_key_env": "ADMIN"}, {"ADMIN": PLAIN}),
        ({"admin_key_sha256": DIGEST}, {}),
    ):
        guard = AdminGuard(settings(auth=auth), env)
        assert guard.has_key
        guard.check(f"Bearer {PLAIN}", "192.168.1.20")
        guard.check(f"Bearer {PLAIN}", "127.0.0.1")
        for header in (None, "Bearer wrong", f"Basic {PLAIN}", f"Bearer {DIGEST}"):
            for client in ("127.0.0.1", "192.168.1.20"):
                with pytest.raises(Unauthorized):
                    guard.check(header, client)


def test_without_admin_key_only_this_machine() -> None:
    s = settings(listen={"host": "0.0.0.0"}, apps=[{"name": "a", "key_env": "A"}])
    guard = AdminGuard(s, {"A": "app-key"})
    assert not guard.has_key
    guard.check(None, "127.0.0.1")
    guard.check(None, "::1")
    for client in ("192.168.1.20", None):
        with pytest.raises(Unauthorized, match="admin key"):
            guard.check("Bearer app-key", client)  # an app's key does not open it


def test_admin_key_env_unset_falls_back_to_this_machine(caplog: pytest.LogCaptureFixture) -> None:
    guard = AdminGuard(settings(auth={"admin_key_env": "ADMIN"}), {})
    assert "admin key: environment variable ADMIN is not set" in caplog.text
    guard.check(None, "127.0.0.1")
    with pytest.raises(Unauthorized):
        guard.check("Bearer ", "192.168.1.20")


# ----- make run's keys -----


def test_make_run_keys_are_random_per_run_and_respect_the_users_own() -> None:
    s = load_settings(REPO / "deploy/settings.example.yaml")
    env1: dict[str, str] = {}
    env2: dict[str, str] = {"CHAT_KEY": "mine"}
    keys1, keys2 = demo_keys(s, env1), demo_keys(s, env2)
    assert set(keys1) == {a.name for a in s.apps if a.key_env}
    assert keys2["family-chat"] == "mine" == env2["CHAT_KEY"]
    for name, key in keys1.items():
        assert len(key) >= 32 and "demo" not in key
        assert keys2[name] != key  # a new key every run, not a fixed one
    assert len(set(keys1.values())) == len(keys1)
    app_env = {a.name: a.key_env for a in s.apps}
    assert all(env1[str(app_env[n])] == k for n, k in keys1.items())
    assert demo_admin_key(s, env1) is None
    admin = settings(auth={"admin_key_env": "ADMIN"})
    admin_key = demo_admin_key(admin, env1)
    assert admin_key is not None and env1["ADMIN"] == admin_key and len(admin_key) >= 32


def test_ready_message_carries_the_generated_key() -> None:
    s = load_settings(REPO / "deploy/settings.example.yaml")
    keys = demo_keys(s, {})
    msg = ready_message(s, keys)
    assert f"  export {KEY_VAR}={keys['family-chat']}\n" in msg
    curls = [ln for ln in msg.splitlines() if ln.lstrip().startswith("curl ")]
    assert len(curls) == 2
    assert all(f'-H "Authorization: Bearer ${KEY_VAR}"' in c for c in curls)
    for name, key in keys.items():
        assert re.search(rf"^  {re.escape(name)} +\w+={re.escape(key)}$", msg, re.M)
    admin_msg = ready_message(s, keys, admin_key="adm1n")
    assert "Authorization: Bearer adm1n" in admin_msg


def test_readme_shows_what_make_run_prints() -> None:
    """The README's "Try it" block is exactly ready_message() for the example settings,
    with the keys shown there: the printed commands and the README's never drift apart."""
    readme = (REPO / "README.md").read_text()
    try_it = readme[readme.index("## Try it") : readme.index("## Pointing an app at it")]
    blocks = re.findall(r"^```\w*\n(.*?)^```$", try_it, re.S | re.M)
    block = next(b for b in blocks if "is ready at" in b)
    s = load_settings(REPO / "deploy/settings.example.yaml")
    env = dict(re.findall(r"^  (?!export )\S+ +(\w+_KEY)=(\S+)$", block, re.M))
    assert set(env) == {a.key_env for a in s.apps if a.key_env}
    assert block.rstrip("\n") == ready_message(s, demo_keys(s, env))


# ----- the NAS deployment: the admin key reaches the gateway and Prometheus -----


def test_compose_hands_the_admin_key_to_the_gateway_and_prometheus() -> None:
    deploy = REPO / "deploy"
    admin_env = load_settings(deploy / "config" / "settings.yaml").auth.admin_key_env
    assert admin_env == "ADMIN_KEY"
    services = yaml.safe_load((deploy / "compose.yaml").read_text())["services"]
    assert admin_env in services["gateway"]["environment"]
    prom_service = services["prometheus"]
    assert prom_service["environment"][admin_env] == services["gateway"]["environment"][admin_env]
    prom = yaml.safe_load((deploy / "prometheus.yml").read_text())
    (job,) = [j for j in prom["scrape_configs"] if j["job_name"] == "hearthgate"]
    assert job["authorization"]["type"] == "Bearer"
    secret = job["authorization"]["credentials_file"]
    # the entrypoint writes the variable, without a newline, to that file on a tmpfs
    shell, flag, script, _ = prom_service["entrypoint"]
    assert (shell, flag) == ("/bin/sh", "-c")
    assert f"printf '%s' \"$${admin_env}\" > {secret}" in script
    assert script.endswith('exec /bin/prometheus "$$@"')
    assert str(Path(secret).parent) in prom_service["tmpfs"]
    assert prom_service["command"][0].startswith("--config.file=")


def test_loopback_operator_pages_refuse_rebinding_hosts_and_cross_origin_posts() -> None:
    """Without an admin key, a page open in a browser on the gateway's machine must not
    reach /reload or /status: by a rebound DNS name (its Host names its own site) or by a
    cross-origin form post (its Origin names another site)."""
    guard = AdminGuard(settings())
    guard.check(None, "127.0.0.1", "127.0.0.1:8080", None)
    guard.check(None, "127.0.0.1", "localhost:8080", "http://localhost:8080")  # the page itself
    guard.check(None, "::1", "[::1]:8080", None)
    guard.check(None, "127.0.0.1", None, None)  # no Host (HTTP/1.0 tools): not a browser
    with pytest.raises(Unauthorized, match="not this machine's loopback"):
        guard.check(None, "127.0.0.1", "evil.example:8080", None)
    with pytest.raises(Unauthorized, match="may not use the operator endpoints"):
        guard.check(None, "127.0.0.1", "127.0.0.1:8080", "http://evil.example")
    with pytest.raises(Unauthorized, match="may not use the operator endpoints"):
        guard.check(None, "127.0.0.1", "127.0.0.1:8080", "null")  # a sandboxed page
    with pytest.raises(Unauthorized, match="may not use the operator endpoints"):
        guard.check(None, "127.0.0.1", "127.0.0.1:8080", "http://127.0.0.1:9999")
