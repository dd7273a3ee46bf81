"""The wheel, installed into a clean virtual environment as a NAS would install it: one
top-level name (``hearthgate``), the runtime dependencies only, and a working command.

Builds from a copy of the sources (so the checkout gets no build/ folder) and needs PyPI or
pip's cache for the dependencies, as ``make test`` does anyway.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

from tests.support import REPO

# What uvicorn[standard] would add and the gateway does not use (pyproject.toml says why;
# its python-dotenv comes in anyway, as a dependency of pydantic-settings).
NOT_USED = {"uvloop", "watchfiles", "websockets"}


def _names(reqs: list[str]) -> set[str]:
    return {re.split(r"[<>=\[;! ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in reqs}


def _run(cmd: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean venv with the wheel installed; returns the venv's directory."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    skip = shutil.ignore_patterns("__pycache__", "results", "*.egg-info")
    for name in ("gateway", "policies", "loadtests", "deploy"):
        shutil.copytree(REPO / name, src / name, ignore=skip)
    shutil.copytree(REPO / "hearthgate", src / "hearthgate", symlinks=True, ignore=skip)
    wheels = root / "dist"
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), "."], src
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("hearthgate-*.whl")
    env = root / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    done = _run([str(env / "bin" / "pip"), "install", "-q", str(wheel)], root)
    assert done.returncode == 0, done.stderr[-3000:]
    return env


def _site_packages(env: Path) -> Path:
    (site,) = env.glob("lib/python3*/site-packages")
    return site


def test_the_wheel_installs_one_top_level_name(installed: Path) -> None:
    site = _site_packages(installed)
    (record,) = site.glob("hearthgate-*.dist-info/RECORD")
    tops = {line.split(",")[0].split("/")[0] for line in record.read_text().splitlines()}
    assert {t for t in tops if not t.endswith(".dist-info") and t != ".."} == {"hearthgate"}
    for name in ("gateway", "policies", "loadtests", "deploy"):
        assert not (site / name).exists()
        assert (site / "hearthgate" / name / "__init__.py").is_file()
    assert (site / "hearthgate" / "loadtests" / "scenarios" / "home-mix.yaml").is_file()
    for asset in ("status.css", "status-body.html", "status.js"):  # the status page
        assert (site / "hearthgate" / "gateway" / "static" / asset).is_file()


def test_the_install_pulls_only_runtime_dependencies(installed: Path) -> None:
    listed = _run([str(installed / "bin" / "pip"), "list", "--format", "json"], installed)
    have = {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert _names(project["dependencies"]) <= have
    extras = project["optional-dependencies"]
    unwanted = (_names(extras["dev"]) | _names(extras["bench"]) | NOT_USED) - _names(
        project["dependencies"]
    )
    assert have & unwanted == set()


def test_the_installed_command_checks_settings_and_serves_nothing_it_lacks(
    installed: Path, tmp_path: Path
) -> None:
    cmd = str(installed / "bin" / "hearthgate")
    example = REPO / "deploy" / "settings.example.yaml"
    checked = _run([cmd, "check", str(example)], tmp_path, timeout=60)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith(f"{example}: ok")
    # The old top-level names are gone from the installed environment.
    old = _run([str(installed / "bin" / "python"), "-c", "import gateway"], tmp_path, 60)
    assert "ModuleNotFoundError" in old.stderr
    # The load tester's extras are not installed: a clear message, not a traceback.
    fuzz = _run([cmd, "bench", "fuzz", "--url", "http://127.0.0.1:9"], tmp_path, timeout=60)
    assert fuzz.returncode == 2
    assert "pip install 'hearthgate[bench]'" in fuzz.stderr
    assert "Traceback" not in fuzz.stderr
