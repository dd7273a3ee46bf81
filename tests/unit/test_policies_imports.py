"""``policies`` imports only the standard library (minus clocks, event loops, threads and
sockets) and itself."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

POLICIES = Path(__file__).resolve().parents[2] / "policies"
FORBIDDEN = {"time", "asyncio", "threading", "socket"}
ALLOWED = (set(sys.stdlib_module_names) - FORBIDDEN) | {"hearthgate.policies"}


def root(module: str) -> str:
    """The top-level module, or ``hearthgate.<part>`` for the project's own parts."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "hearthgate" else parts[0]


def imported_roots(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, root(alias.name)) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, root(node.module)))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            out.append((node.lineno, "__import__()"))  # dynamic imports are not allowed
    return out


def test_policies_import_only_the_standard_library() -> None:
    files = sorted(POLICIES.rglob("*.py"))
    assert len(files) > 5
    bad = [
        f"{path.relative_to(POLICIES.parent)}:{line}: {name}"
        for path in files
        for line, name in imported_roots(path)
        if name not in ALLOWED
    ]
    assert bad == []


def test_the_check_catches_forbidden_imports(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import time\nfrom pydantic import BaseModel\nfrom . import x\nimport json\n"
        "from hearthgate.policies.types import Band\nfrom hearthgate.gateway.core import Gateway\n"
    )
    bad = [n for _, n in imported_roots(sample) if n not in ALLOWED]
    assert bad == ["time", "pydantic", "hearthgate.gateway"]
