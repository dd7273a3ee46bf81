"""deploy/systemd: the gateway's unit and the vLLM worker template.

The structural checks always run; `systemd-analyze verify` runs in its own test where the
binary exists (it does on the project's machines: systemd is installed, not running)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "deploy" / "systemd"
GATEWAY = UNITS / "hearthgate.service"
WORKER = UNITS / "vllm-worker@.service"
SECTIONS = {"Unit", "Service", "Install"}

Unit = dict[str, dict[str, list[str]]]


def parse_unit(text: str) -> Unit:
    """Sections -> key -> every value given (systemd allows repeating a key)."""
    unit: Unit = {}
    section: dict[str, list[str]] | None = None
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep and section is not None, f"not a unit file line: {raw!r}"
        assert re.fullmatch(r"[A-Z][A-Za-z0-9]*", key.strip()), f"bad key {key!r}"
        section.setdefault(key.strip(), []).append(value.strip())
    return unit


def one(unit: Unit, section: str, key: str) -> str:
    values = unit[section].get(key, [])
    assert len(values) == 1, f"[{section}] {key}: {values}"
    return values[0]


@pytest.fixture(scope="module")
def gateway() -> Unit:
    return parse_unit(GATEWAY.read_text())


@pytest.fixture(scope="module")
def worker() -> Unit:
    return parse_unit(WORKER.read_text())


def test_parser_reads_continuations_and_repeated_keys() -> None:
    unit = parse_unit(
        "# c\n[Service]\nExecStart=/bin/x \\\n  --flag\nEnvironment=A=1\nEnvironment=B=2\n"
    )
    assert unit == {"Service": {"ExecStart": ["/bin/x  --flag"], "Environment": ["A=1", "B=2"]}}
    with pytest.raises(AssertionError):
        parse_unit("[Service]\nno equals sign\n")


def test_gateway_unit_runs_hearthgate_serve_on_the_settings(gateway: Unit) -> None:
    assert set(gateway) == SECTIONS
    assert one(gateway, "Unit", "Description")
    argv = shlex.split(one(gateway, "Service", "ExecStart"))
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert Path(argv[0]).is_absolute() and Path(argv[0]).name in scripts
    assert argv[1:] == ["serve", "--config", "/etc/hearthgate/settings.yaml"]
    # no leading '-': a missing keys file stops the start instead of serving without keys
    assert one(gateway, "Service", "EnvironmentFile") == "/etc/hearthgate/keys.env"
    assert one(gateway, "Service", "Restart") == "on-failure"
    assert one(gateway, "Install", "WantedBy") == "multi-user.target"
    # `systemctl reload` is the gateway's settings reload (SIGHUP, gateway/serve.py)
    assert one(gateway, "Service", "ExecReload") == "/bin/kill -HUP $MAINPID"


def test_gateway_unit_is_hardened(gateway: Unit) -> None:
    svc = gateway["Service"]
    assert one(gateway, "Service", "DynamicUser") == "yes"
    assert "User" not in svc
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "PrivateDevices"):
        assert one(gateway, "Service", key) == "yes", key
    assert one(gateway, "Service", "ProtectSystem") == "strict"
    assert one(gateway, "Service", "CapabilityBoundingSet") == ""  # no capability at all
    assert "AF_INET" in one(gateway, "Service", "RestrictAddressFamilies")


def test_worker_template_reads_its_instance_env_file(worker: Unit) -> None:
    assert WORKER.name.endswith("@.service")
    assert set(worker) == SECTIONS
    assert "%i" in one(worker, "Unit", "Description")
    assert one(worker, "Service", "EnvironmentFile") == "/etc/hearthgate/vllm-%i.env"
    argv = shlex.split(one(worker, "Service", "ExecStart"))
    assert Path(argv[0]).is_absolute()
    assert argv[1:4] == ["-m", "vllm.entrypoints.openai.api_server", "--model"]
    assert argv[4:] == ["${VLLM_MODEL}", "$VLLM_ARGS"]  # one word; split into many
    assert one(worker, "Service", "Restart") == "on-failure"
    assert one(worker, "Install", "WantedBy") == "multi-user.target"


def test_worker_template_is_hardened_but_sees_the_gpu(worker: Unit) -> None:
    assert one(worker, "Service", "User") not in ("root", "0")
    assert one(worker, "Service", "NoNewPrivileges") == "yes"
    assert one(worker, "Service", "ProtectSystem") == "strict"
    assert one(worker, "Service", "StateDirectory") == "vllm"  # the model cache, writable
    assert "PrivateDevices" not in worker["Service"]  # would hide /dev/nvidia*
    env = " ".join(worker["Service"]["Environment"])
    assert "HF_HOME=/var/lib/vllm/" in env


def test_worker_example_args_are_the_compose_workers_flags() -> None:
    """The env-file example in the template's header recommends the same flags as compose."""
    example = next(
        line.split("=", 1)[1]
        for line in WORKER.read_text().splitlines()
        if line.startswith("#   VLLM_ARGS=")
    )
    compose = yaml.safe_load((REPO / "deploy" / "compose.yaml").read_text())
    # Compose's variables at their defaults (the systemd example has no variables).
    default = re.compile(r"\$\{\w+:-([^}]*)\}")
    cmd = [default.sub(r"\1", str(a)) for a in compose["services"]["vllm-gen"]["command"]]
    flags = {a: cmd[i + 1] for i, a in enumerate(cmd) if a.startswith("--") and a != "--model"}
    args = shlex.split(example)
    given = {a: args[i + 1] for i, a in enumerate(args) if a.startswith("--")}
    assert given.pop("--host") == "127.0.0.1"  # on a box without containers: loopback only
    flags.pop("--host")
    assert given == flags


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here (the structural checks still ran)")
    # verify also checks that ExecStart's program exists: point it at this checkout's
    gateway = GATEWAY.read_text().replace(
        "/opt/hearthgate/bin/hearthgate", str(Path(sys.executable).parent / "hearthgate")
    )
    worker = WORKER.read_text().replace("/opt/vllm/bin/python", sys.executable)
    (tmp_path / GATEWAY.name).write_text(gateway)
    (tmp_path / "vllm-worker@gen.service").write_text(worker)
    units = [str(tmp_path / GATEWAY.name), str(tmp_path / "vllm-worker@gen.service")]
    proc = subprocess.run(
        [analyze, "verify", "--man=no", *units],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    # Unknown keys and bad values are only warnings with exit code 0: fail on any line
    # about these units.
    ours = [ln for ln in out.splitlines() if "hearthgate" in ln or "vllm-worker" in ln]
    assert proc.returncode == 0 and not ours, out


def test_systemd_analyze_catches_a_bad_key(tmp_path: Path) -> None:
    """The verify test above would see a mistake: an unknown key is reported."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here")
    bad = tmp_path / "hearthgate-bad.service"
    bad.write_text("[Service]\nExecStart=/bin/true\nProtectSystm=strict\n")
    proc = subprocess.run(
        [analyze, "verify", "--man=no", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert "ProtectSystm" in proc.stdout + proc.stderr
