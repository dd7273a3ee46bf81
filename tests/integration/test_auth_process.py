"""Safe by default, with real ``hearthgate`` processes on loopback: the refusal to serve the
network without keys, the admin key on /status and /metrics as Prometheus sends it, an app
key given as its SHA-256, and the commands `make run` prints (and the README's SDK example)
against a gateway started the way deploy/run_local.py starts it."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from hearthgate.deploy.gateway_process import GatewayProcess, free_port, stop_process
from hearthgate.deploy.redis_server import RedisServer
from hearthgate.deploy.run_local import KEY_VAR, demo_keys, gateway_command, ready_message
from hearthgate.gateway.settings import Settings, load_settings
from tests.support import REPO, RUN_DIR, instant_upstream, wait_http

PLAIN = "the-notes-app-key"
DIGEST = hashlib.sha256(PLAIN.encode()).hexdigest()
ADMIN_ENV = "HG_TEST_ADMIN_KEY"
ADMIN = "the-admin-key"
# An address of the TEST-NET-1 block, never one of this machine's: if the refusal ever
# broke, the gateway would fail to bind instead of listening beyond loopback.
NETWORK_HOST = "192.0.2.1"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("HEARTHGATE_")}


def _hearthgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hearthgate.gateway.cli", *args],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )


def test_serve_refuses_a_network_address_without_keys(tmp_path: Path) -> None:
    workers = [{"name": "w", "url": f"http://127.0.0.1:{free_port()}", "models": ["m"]}]
    cfg = tmp_path / "open.yaml"
    cfg.write_text(yaml.safe_dump({"listen": {"host": NETWORK_HOST}, "workers": workers}))
    served = _hearthgate("serve", "--config", str(cfg))
    assert served.returncode == 2, served.stderr
    want = (
        f"hearthgate: refusing to serve {cfg}: listen.host is {NETWORK_HOST} (reachable from "
        "the network) but no app has a key: add `key_env` or `key_sha256` to your apps (see "
        "deploy/settings.example.yaml), or set `auth: {allow_anonymous: true}` to serve "
        "anyone on the network on purpose"
    )
    assert served.stderr.strip() == want
    checked = _hearthgate("check", str(cfg))
    assert checked.returncode == 2
    assert checked.stderr.strip() == want
    # the same through `serve --host` on a file that is fine on loopback
    cfg.write_text(yaml.safe_dump({"workers": workers}))
    assert _hearthgate("check", str(cfg)).returncode == 0
    served = _hearthgate("serve", "--config", str(cfg), "--host", NETWORK_HOST)
    assert served.returncode == 2
    assert f"listen.host is {NETWORK_HOST} (reachable from the network)" in served.stderr


@pytest.fixture(scope="module")
def keyed_gateway() -> Iterator[str]:
    """A gateway whose only app has its key as a SHA-256, with an admin key."""
    os.environ[ADMIN_ENV] = ADMIN  # GatewayProcess passes the environment on
    try:
        with instant_upstream() as upstream:
            settings = {
                "workers": [{"name": "w", "url": upstream, "models": ["m"]}],
                "apps": [{"name": "notes", "key_sha256": DIGEST}],
                "auth": {"admin_key_env": ADMIN_ENV},
            }
            with GatewayProcess(settings, run_dir=RUN_DIR, name="auth") as gw:
                wait_http(gw.url + "/readyz")
                yield gw.url
    finally:
        os.environ.pop(ADMIN_ENV, None)


def _is_401(resp: httpx.Response) -> bool:
    return resp.status_code == 401 and resp.json()["error"]["type"] == "authentication_error"


def _prometheus_header(tmp_path: Path) -> str:
    """The Authorization header Prometheus sends with the hearthgate job of
    deploy/prometheus.yml, its credentials file written as compose writes it."""
    prom = yaml.safe_load((REPO / "deploy/prometheus.yml").read_text())
    (job,) = [j for j in prom["scrape_configs"] if j["job_name"] == "hearthgate"]
    auth = job["authorization"]
    secret = tmp_path / Path(auth["credentials_file"]).name
    secret.write_text(ADMIN + "\n")
    return f"{auth.get('type', 'Bearer')} {secret.read_text().strip()}"


@pytest.mark.parametrize("path", ["/status", "/metrics"])
def test_admin_key_guards_status_and_metrics(keyed_gateway: str, path: str, tmp_path: Path) -> None:
    url = keyed_gateway + path
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {PLAIN}"},  # an app's key is not the admin key
        {"Authorization": f"Basic {ADMIN}"},
    ):
        assert _is_401(httpx.get(url, headers=headers)), headers
    ok = httpx.get(url, headers={"Authorization": f"Bearer {ADMIN}"})
    assert ok.status_code == 200
    assert ("hearthgate_" in ok.text) if path == "/metrics" else ("workers" in ok.json())
    scraped = httpx.get(url, headers={"Authorization": _prometheus_header(tmp_path)})
    assert scraped.status_code == 200


def test_health_checks_stay_open(keyed_gateway: str) -> None:
    assert httpx.get(keyed_gateway + "/healthz").status_code == 200
    assert httpx.get(keyed_gateway + "/readyz").status_code == 200


def test_hashed_app_key_authenticates_with_the_plain_key(keyed_gateway: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    url = keyed_gateway + "/v1/chat/completions"
    ok = httpx.post(url, json=body, headers={"Authorization": f"Bearer {PLAIN}"})
    assert ok.status_code == 200 and ok.json()["choices"]
    for headers in ({}, {"Authorization": f"Bearer {DIGEST}"}, {"Authorization": "Bearer x"}):
        assert _is_401(httpx.post(url, json=body, headers=headers)), headers
    models = keyed_gateway + "/v1/models"
    assert _is_401(httpx.get(models))
    listed = httpx.get(models, headers={"Authorization": f"Bearer {PLAIN}"})
    assert [m["id"] for m in listed.json()["data"]] == ["m"]


def test_hearthgate_reload_command(keyed_gateway: str, tmp_path: Path) -> None:
    """`hearthgate reload` finds the gateway from the file's listen address and presents
    the admin key named by auth.admin_key_env; every refusal is a clear line and exit 1
    or 2, never a traceback."""
    port = int(keyed_gateway.rsplit(":", 1)[1])
    config = str(RUN_DIR / f"auth-{port}.yaml")
    done = _hearthgate("reload", "--config", config)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "reloaded: nothing changed"
    status = httpx.get(keyed_gateway + "/status", headers={"Authorization": f"Bearer {ADMIN}"})
    assert status.json()["settings"]["last_reload"]["ok"] is True
    assert status.json()["settings"]["path"] == config

    no_key = _hearthgate("reload", "--config", config, "--key-env", "HG_TEST_NO_SUCH_VAR")
    assert no_key.returncode == 1
    assert no_key.stderr.strip() == (
        f"hearthgate: {keyed_gateway} answered 401: "
        "missing admin key: send 'Authorization: Bearer <admin key>'"
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("workers: [")
    refused = _hearthgate("reload", "--config", str(bad))
    assert refused.returncode == 2
    assert "is not valid YAML" in refused.stderr
    assert refused.stderr.strip().endswith("the running gateway keeps its settings")
    nobody = f"http://127.0.0.1:{free_port()}"
    gone = _hearthgate("reload", "--config", config, "--url", nobody)
    assert gone.returncode == 1
    assert gone.stderr.startswith(f"hearthgate: no gateway answered at {nobody}: ")
    assert "Traceback" not in done.stderr + no_key.stderr + refused.stderr + gone.stderr


# ----- what `make run` prints, against a gateway started the way it starts one -----


@pytest.fixture(scope="module")
def make_run_gateway(redis_server: RedisServer) -> Iterator[tuple[Settings, str]]:
    """deploy/settings.example.yaml with its workers replaced by the instant upstream and a
    free port, served by run_local's command with run_local's generated keys and a Redis
    (as `make run` starts one); yields the settings and what run_local prints once the
    gateway is ready."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    with instant_upstream() as upstream:
        data: dict[str, Any] = yaml.safe_load((REPO / "deploy/settings.example.yaml").read_text())
        port = free_port()
        data["listen"]["port"] = port
        for w in data["workers"]:
            w["url"] = upstream
        data["redis"]["url"] = redis_server.url
        data["redis"]["key_prefix"] = f"make-run-{port}:"
        cfg = RUN_DIR / f"make-run-{port}.yaml"
        cfg.write_text(yaml.safe_dump(data, sort_keys=False))
        settings = load_settings(cfg)
        env = _env()
        keys = demo_keys(settings, env)
        with (RUN_DIR / f"make-run-{port}.log").open("wb") as log:
            proc = subprocess.Popen(
                gateway_command(str(cfg)), env=env, stdout=log, stderr=subprocess.STDOUT
            )
            try:
                wait_http(f"http://127.0.0.1:{port}/readyz", proc=proc)
                yield settings, ready_message(settings, keys)
            finally:
                stop_process(proc)


def _printed_commands(message: str) -> list[str]:
    """The shell commands of the message, continuation lines joined, indentation removed."""
    commands: list[str] = []
    joining = False
    for line in message.splitlines():
        if joining:
            commands[-1] += "\n" + line.strip()
        elif line.startswith(("  export ", "  curl ")):
            commands.append(line.strip())
        else:
            continue
        joining = line.endswith("\\")
    return commands


def test_make_run_commands_work_as_printed(make_run_gateway: tuple[Settings, str]) -> None:
    _, message = make_run_gateway
    commands = _printed_commands(message)
    assert [c.split()[0] for c in commands] == ["export", "curl", "curl"]
    assert commands[0].startswith(f"export {KEY_VAR}=")
    script = "\n".join(f"{c}\necho '<<end>>'" for c in commands)
    env = {k: v for k, v in _env().items() if k != KEY_VAR}  # the printed export sets it
    out = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    _, chat, embeddings, _ = out.stdout.split("<<end>>")
    assert chat.count("data: {") >= 32 and "data: [DONE]" in chat, chat
    assert '"embedding"' in embeddings and "error" not in embeddings, embeddings
    # the status page named on the first line, from this machine: no key needed
    status_url = re.search(r"status: (\S+/status)", message)
    assert status_url is not None
    status = subprocess.run(
        ["curl", "-sS", status_url[1]], capture_output=True, text=True, env=env, timeout=30
    )
    assert '"workers"' in status.stdout, status.stdout
    # and without the printed key, the same commands get 401
    no_key = script.replace(commands[0], f"export {KEY_VAR}=not-the-key")
    out = subprocess.run(["bash", "-c", no_key], capture_output=True, text=True, timeout=60)
    assert out.stdout.count("invalid API key") == 2, out.stdout


def test_readme_sdk_example_works_against_make_run(
    make_run_gateway: tuple[Settings, str],
) -> None:
    if importlib.util.find_spec("openai") is None:
        pytest.skip("the openai package is not installed (pip install openai)")
    settings, message = make_run_gateway
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Pointing an app at it") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None and "http://127.0.0.1:8080/v1" in code[1]
    program = code[1].replace(":8080/", f":{settings.listen.port}/")
    export = next(c for c in _printed_commands(message) if c.startswith("export "))
    key = export.split("=", 1)[1]
    out = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        env={**_env(), KEY_VAR: key},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("t0 t1 "), out.stdout


def test_readme_batch_example_works_against_make_run(
    make_run_gateway: tuple[Settings, str],
) -> None:
    settings, message = make_run_gateway
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Background jobs") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None and "client.batches.create" in code[1]
    program = (
        code[1]
        .replace(":8080/", f":{settings.listen.port}/")
        .replace("time.sleep(2)", "time.sleep(0.2)")
    )
    export = next(c for c in _printed_commands(message) if c.startswith("export "))
    key = export.split("=", 1)[1]
    out = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        env={**_env(), KEY_VAR: key},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    printed = out.stdout.splitlines()
    assert [p.split(" ", 1)[0] for p in printed] == [f"note-{i}" for i in range(100)]
    assert all(p.split(" ", 1)[1].startswith("t0 ") for p in printed), printed[:3]


def test_a_browser_page_cannot_reload_or_read_status_without_the_admin_key() -> None:
    """A gateway without an admin key, reached from this machine: a page on another site
    (a cross-origin form post) and a page whose DNS name was rebound to 127.0.0.1 (its own
    name in Host) are refused; the gateway's own status page is not."""
    workers = [{"name": "w", "url": f"http://127.0.0.1:{free_port()}", "models": ["m"]}]
    with GatewayProcess({"workers": workers}, run_dir=RUN_DIR, name="browser-gateway") as gw:
        form = {"content-type": "application/x-www-form-urlencoded"}
        posted = httpx.post(
            gw.url + "/reload", headers={**form, "origin": "http://evil.example"}, content=b"a=1"
        )
        assert posted.status_code == 401
        assert "may not use the operator endpoints" in posted.json()["error"]["message"]
        port = httpx.URL(gw.url).port
        rebound = httpx.get(gw.url + "/status", headers={"host": f"evil.example:{port}"})
        assert rebound.status_code == 401
        assert "not this machine's loopback" in rebound.json()["error"]["message"]
        assert httpx.get(gw.url + "/status").status_code == 200
        own = {"origin": gw.url.replace("127.0.0.1", "localhost"), "host": f"localhost:{port}"}
        assert httpx.get(gw.url + "/status", headers=own).status_code == 200
