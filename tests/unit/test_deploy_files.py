"""deploy/compose.yaml, deploy/Dockerfile, the compose settings and the Prometheus config,
checked without a container engine: what each file says, and that they agree with each
other, with pyproject.toml and with the gateway's settings model."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from hearthgate.gateway.cli import main as hearthgate
from hearthgate.gateway.livecheck_rules import check_context
from hearthgate.gateway.settings import Settings, load_settings

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KEYS = {
    "ASSISTANT_KEY": "a",
    "NOTES_KEY": "n",
    "CHAT_KEY": "c",
    "SUMMARIES_KEY": "s",
    "ADMIN_KEY": "m",
    "GRAFANA_ADMIN_PASSWORD": "g",
}
WORKERS = ("vllm-gen", "vllm-embed")
VOICE = ("vllm-stt", "speech")  # profile voice
MONITORING = ("prometheus", "grafana")
_VAR = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR:?error} substitution, applied everywhere."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        got = env.get(name)
        missing = got is None or (got == "" and op is not None and op.startswith(":"))
        if not missing:
            return str(got)
        if op is not None and op.endswith("?"):
            raise KeyError(f"{name}: {arg}")
        return arg if op is not None else ""

    return _VAR.sub(sub, value)


def raw_compose() -> dict[str, Any]:
    data = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = interpolate(raw_compose(), KEYS)
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    svcs = compose["services"]
    assert isinstance(svcs, dict)
    return svcs


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


@pytest.fixture
def compose_settings(monkeypatch: pytest.MonkeyPatch) -> Settings:
    for key in [k for k in os.environ if k.startswith("HEARTHGATE_")]:
        monkeypatch.delenv(key)
    return load_settings(DEPLOY / "config" / "settings.yaml")


def flags(service: dict[str, Any]) -> dict[str, str]:
    """``--flag value`` pairs of a worker's command."""
    cmd = [str(a) for a in service["command"]]
    out = {}
    for i, arg in enumerate(cmd):
        if arg.startswith("--"):
            out[arg] = cmd[i + 1] if i + 1 < len(cmd) and not cmd[i + 1].startswith("--") else ""
    return out


# ----- compose.yaml -----


def test_services_and_images(services: dict[str, Any]) -> None:
    assert set(services) == {*WORKERS, *VOICE, "gateway", "redis", "prometheus", "grafana"}
    for name in (*WORKERS, "vllm-stt"):
        image = services[name]["image"]
        assert image.startswith("vllm/vllm-openai:v"), image  # pinned, not :latest
    assert services["redis"]["image"] == "redis:7"
    assert services["prometheus"]["image"].startswith("prom/prometheus:v")
    assert re.fullmatch(r"grafana/grafana:\d+\.\d+\.\d+", services["grafana"]["image"])
    build = services["gateway"]["build"]
    assert (DEPLOY / build["context"]).resolve() == REPO
    assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"


def test_only_the_gateway_is_on_the_network(services: dict[str, Any]) -> None:
    assert services["gateway"]["ports"] == ["8080:8080"]
    for name in (*WORKERS, *VOICE, "redis"):
        assert "ports" not in services[name], f"{name} must not skip the gateway"
    for name in MONITORING:
        assert all(p.startswith("127.0.0.1:") for p in services[name]["ports"]), name


def test_healthchecks(services: dict[str, Any]) -> None:
    for name in WORKERS:
        hc = services[name]["healthcheck"]
        port = flags(services[name])["--port"]
        assert hc["test"][0] == "CMD" and f"127.0.0.1:{port}/health" in " ".join(hc["test"])
        assert "start_period" in hc  # the first start downloads the model
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert "/-/ready" in " ".join(services["prometheus"]["healthcheck"]["test"])
    # the gateway's own is the image's HEALTHCHECK (test_dockerfile_*)
    assert "healthcheck" not in services["gateway"]


def test_start_order(services: dict[str, Any]) -> None:
    healthy = {"condition": "service_healthy"}
    assert services["gateway"]["depends_on"] == {
        "vllm-gen": healthy,
        "vllm-embed": healthy,
        "redis": {"condition": "service_started"},  # live traffic does not wait for Redis
    }
    assert services["vllm-embed"]["depends_on"] == {"vllm-gen": healthy}


def test_gateway_settings_name_the_redis_service(services: dict[str, Any]) -> None:
    cfg = yaml.safe_load((DEPLOY / "config" / "settings.yaml").read_text())
    url = urlsplit(cfg["redis"]["url"])
    assert url.scheme == "redis" and url.hostname == "redis" and url.port == 6379
    assert "redis" in services
    command = services["redis"]["command"]
    assert command[command.index("--appendonly") + 1] == "yes"


def test_workers_share_one_gpu(services: dict[str, Any]) -> None:
    gpu = (*WORKERS, "vllm-stt")
    devices = [services[n]["deploy"]["resources"]["reservations"]["devices"] for n in gpu]
    for (device,) in devices:
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert devices[0] == devices[1] == devices[2]  # the same GPU

    def share(svcs: dict[str, Any], names: tuple[str, ...]) -> float:
        return sum(float(flags(svcs[n])["--gpu-memory-utilization"]) for n in names)

    assert share(services, WORKERS) <= 0.87
    # With the voice profile, at the share the compose file's comments say for vllm-gen.
    voice = interpolate(raw_compose(), {**KEYS, "GEN_GPU_MEMORY": "0.62"})["services"]
    assert share(voice, gpu) <= 0.87
    assert services["vllm-stt"]["profiles"] == services["speech"]["profiles"] == ["voice"]


def test_worker_flags(services: dict[str, Any]) -> None:
    for name in WORKERS:
        f = flags(services[name])
        for flag in (
            "--model",
            "--served-model-name",
            "--max-model-len",
            "--max-num-batched-tokens",
            "--gpu-memory-utilization",
        ):
            assert f.get(flag), f"{name}: {flag}"
        assert f["--scheduling-policy"] == "priority"
        assert f["--host"] == "0.0.0.0"
    assert flags(services["vllm-embed"])["--runner"] == "pooling"
    assert "--runner" not in flags(services["vllm-gen"])


def test_default_models_and_missing_keys() -> None:
    raw = raw_compose()
    gen = flags(interpolate(raw, KEYS)["services"]["vllm-gen"])
    assert gen["--model"] == "Qwen/Qwen2.5-7B-Instruct-AWQ"
    assert (
        flags(interpolate(raw, {**KEYS, "GEN_MODEL": "x/y"})["services"]["vllm-gen"])["--model"]
        == "x/y"
    )
    with pytest.raises(KeyError, match="NOTES_KEY"):
        interpolate(raw, {**KEYS, "NOTES_KEY": ""})


def test_redis_persists(compose: dict[str, Any], services: dict[str, Any]) -> None:
    redis = services["redis"]
    cmd = redis["command"]
    assert cmd[0] == "redis-server" and cmd[cmd.index("--appendonly") + 1] == "yes"
    assert "redis-data:/data" in redis["volumes"]


def test_volumes_are_declared_and_mounted_files_exist(
    compose: dict[str, Any], services: dict[str, Any]
) -> None:
    declared = set(compose["volumes"])
    used = set()
    for name, svc in services.items():
        for mount in svc.get("volumes", []):
            source, _, rest = mount.partition(":")
            if source.startswith((".", "/")):
                assert (DEPLOY / source).exists(), f"{name}: {source} is not in the repo"
                assert rest.endswith(":ro"), f"{name}: {mount} should be read-only"
            else:
                used.add(source)
    assert used == declared


def test_the_gateway_mounts_its_settings_folder_not_a_file(services: dict[str, Any]) -> None:
    """A single-file bind mount keeps the old file when an editor saves a new one (the
    reload then sees nothing changed); the folder holds the settings and nothing else (the
    keys stay in .env)."""
    mounts = [m.split(":") for m in services["gateway"]["volumes"]]
    assert [m[1] for m in mounts] == ["/etc/hearthgate"]
    folder = DEPLOY / mounts[0][0]
    assert folder.is_dir()
    assert sorted(p.name for p in folder.iterdir()) == ["settings.yaml"]


def test_monitoring_is_an_optional_profile(services: dict[str, Any]) -> None:
    for name in MONITORING:
        assert services[name]["profiles"] == ["monitoring"]
    optional = (*MONITORING, *VOICE)
    assert all("profiles" not in s for n, s in services.items() if n not in optional)


def test_prometheus_scrapes_the_gateway_and_both_workers(services: dict[str, Any]) -> None:
    prom = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    targets = {
        t: job.get("metrics_path", "/metrics")
        for job in prom["scrape_configs"]
        for group in job["static_configs"]
        for t in group["targets"]
    }
    expected = {f"{n}:{flags(services[n])['--port']}" for n in WORKERS}
    expected.add("gateway:" + services["gateway"]["ports"][0].split(":")[-1])
    assert targets == dict.fromkeys(expected, "/metrics")


# ----- the settings compose mounts -----


def test_compose_settings_pass_hearthgate_check(
    compose_settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert hearthgate(["check", str(DEPLOY / "config" / "settings.yaml")]) == 0
    assert "ok (4 workers: gen0, emb0, stt0, tts0)" in capsys.readouterr().out
    assert compose_settings.listen.host == "0.0.0.0"


def test_compose_settings_agree_with_the_workers(
    compose_settings: Settings, services: dict[str, Any]
) -> None:
    s = compose_settings
    assert len({urlsplit(w.url).hostname for w in s.workers}) == len(s.workers)
    speech = [w for w in s.workers if w.role == "speech"]
    assert [urlsplit(w.url).hostname for w in speech] == ["speech"]  # not vLLM: no flags
    for w in s.workers:
        if w.role == "speech":
            continue
        url = urlsplit(w.url)
        assert url.hostname in (*WORKERS, "vllm-stt"), f"{w.name}: {w.url} names no worker"
        f = flags(services[url.hostname])
        assert str(url.port) == f["--port"]
        assert {w.upstream_model(m) for m in w.models} == {f["--served-model-name"]}
        assert w.priority_scheduling == (f.get("--scheduling-policy") == "priority")
        assert (w.role == "embeddings") == (f.get("--runner") == "pooling")
        # the same comparison `hearthgate check --live` makes with the running worker
        findings = check_context(
            w,
            int(f["--max-model-len"]),
            s.routing.long_prefill_min_tokens,
            s.tokens.default_max_tokens,
        )
        assert findings == []
        if w.role != "embeddings":
            assert w.limits.prefill_token_budget == int(f["--max-num-batched-tokens"])
    window = s.classes["embed"].batching_window()
    assert window.max_batch_tokens is not None
    assert window.max_batch_tokens <= int(flags(services["vllm-embed"])["--max-num-batched-tokens"])


def test_every_app_key_reaches_the_gateway(
    compose_settings: Settings, services: dict[str, Any]
) -> None:
    key_envs = {a.key_env for a in compose_settings.apps if a.key_env}
    assert key_envs and compose_settings.auth.admin_key_env is not None
    key_envs.add(compose_settings.auth.admin_key_env)
    assert key_envs == set(services["gateway"]["environment"])
    example = (DEPLOY / "keys.env.example").read_text()
    listed = {line.split("=")[0] for line in example.splitlines() if re.match(r"^\w+=", line)}
    assert listed == key_envs | {"GRAFANA_ADMIN_PASSWORD"}  # Grafana's, not the gateway's
    ignored = (REPO / ".gitignore").read_text().splitlines()
    assert "deploy/.env" in ignored  # compose reads the real keys from there


# ----- Dockerfile -----


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines, current = [], ""
    for raw in (DEPLOY / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        current += " " + line[:-1] if line.endswith("\\") else " " + line
        if not line.endswith("\\"):
            lines.append(current.strip())
            current = ""
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in lines]


def final_stage() -> list[tuple[str, str]]:
    instrs = dockerfile()
    last_from = max(i for i, (op, _) in enumerate(instrs) if op == "FROM")
    return instrs[last_from:]


def test_dockerfile_base_is_slim_python_meeting_requires_python(pyproject: dict[str, Any]) -> None:
    args = dict(a.split("=", 1) for op, a in dockerfile() if op == "ARG" and "=" in a)
    image = args["PYTHON_IMAGE"]
    m = re.fullmatch(r"python:(\d+)\.(\d+)-slim(-\w+)?", image)
    assert m, image
    need = re.fullmatch(r">=(\d+)\.(\d+)", pyproject["project"]["requires-python"])
    assert need and (int(m[1]), int(m[2])) >= (int(need[1]), int(need[2]))
    assert [a for op, a in dockerfile() if op == "FROM"] == [
        "${PYTHON_IMAGE} AS build",
        "${PYTHON_IMAGE}",
    ]


def test_dockerfile_installs_what_pyproject_declares(pyproject: dict[str, Any]) -> None:
    instrs = dockerfile()
    copied = {a.split()[0].rstrip("/") for op, a in instrs if op == "COPY" and "--from" not in a}
    copied |= {p for op, a in instrs if op == "COPY" and "--from" not in a for p in a.split()[:-1]}
    need = {"pyproject.toml", pyproject["project"]["readme"]}
    roots = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert roots == {"hearthgate"}, "one installed name"
    # hearthgate/ links the top-level folders: the build needs both the links and their targets
    links = [p for p in (REPO / "hearthgate").iterdir() if p.is_symlink()]
    assert {p.name for p in links} == {"gateway", "policies", "loadtests", "deploy"}
    need |= roots | {str(p.resolve().relative_to(REPO)) for p in links}
    assert need <= {p.rstrip("/") for p in copied}
    for pkg in need - {"pyproject.toml", "README.md"}:
        assert (REPO / pkg / "__init__.py").is_file()
    installs = [a for op, a in instrs if op == "RUN" and "pip install" in a]
    assert len(installs) == 1
    args = installs[0].split("pip install", 1)[1].split("&&")[0].split()
    assert args == ["."], "the package itself, without extras or editable mode"
    dev_tools = {
        re.split(r"[<>=\[]", d)[0] for d in pyproject["project"]["optional-dependencies"]["dev"]
    }
    text = (DEPLOY / "Dockerfile").read_text()
    assert not [t for t in dev_tools if re.search(rf"\b{re.escape(t)}\b", text)]


def test_dockerfile_runs_unprivileged_with_health_and_entrypoint(pyproject: dict[str, Any]) -> None:
    final = final_stage()
    users = [a for op, a in final if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    ops = [op for op, _ in final]
    assert ops.index("USER") < ops.index("ENTRYPOINT")
    (health,) = [a for op, a in final if op == "HEALTHCHECK"]
    assert "/readyz" in health and "CMD" in health
    (entry,) = [a for op, a in final if op == "ENTRYPOINT"]
    assert yaml.safe_load(entry) == [
        "hearthgate",
        "serve",
        "--config",
        "/etc/hearthgate/settings.yaml",
    ]
    assert "hearthgate" in pyproject["project"]["scripts"]
    assert any(op == "EXPOSE" and a == "8080" for op, a in final)


def test_image_listens_on_all_interfaces_and_keeps_the_files_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = dict(pair.split("=", 1) for op, a in final_stage() if op == "ENV" for pair in a.split())
    for key in [k for k in os.environ if k.startswith("HEARTHGATE_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        if key.startswith("HEARTHGATE_"):
            monkeypatch.setenv(key, value)
    settings = load_settings(DEPLOY / "config" / "settings.yaml", listen={"port": 9000})
    assert (settings.listen.host, settings.listen.port) == ("0.0.0.0", 9000)


def test_dockerignore_keeps_environments_and_models_out() -> None:
    ignored = {ln.strip().rstrip("/") for ln in (REPO / ".dockerignore").read_text().splitlines()}
    assert {".git", ".venv", ".venv-vllm", ".models", ".run", "deploy/.env"} <= ignored
    assert not ignored & {"gateway", "policies", "loadtests", "deploy", "pyproject.toml"}


# ----- where a Compose implementation is installed, it must accept the file -----


def test_compose_file_is_valid_for_docker_compose(tmp_path: Path) -> None:
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose is not installed here (the checks above still ran)")
    text = (DEPLOY / "compose.yaml").read_text()
    # docker-compose 1.x predates the top-level `name`; everything else is the Compose spec
    checked = tmp_path / "compose.yaml"
    checked.write_text(re.sub(r"(?m)^name: .*\n", "", text))
    env = tmp_path / "keys.env"
    env.write_text("".join(f"{k}={v}\n" for k, v in KEYS.items()))
    proc = subprocess.run(
        [
            "docker-compose",
            "--project-directory",
            str(DEPLOY),
            "--env-file",
            str(env),
            "-f",
            str(checked),
            "config",
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
