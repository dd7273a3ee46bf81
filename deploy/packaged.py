"""Files that ship inside a package of another environment (the embeddings model in the
vLLM venv, the Piper voice in the TTS venv), found without importing the package here.
Standard library only: the gateway environment imports it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from hearthgate.deploy.server_process import WorkerError


def find_in_package(python: Path, package: str, relative: str, marker: str) -> Path:
    """``<site-packages>/<package>/<relative>`` of the environment of ``python`` (a model
    or voice that ships inside a package), when ``<that path><marker>`` exists too (the
    model's ``/config.json``, a voice's ``.json``).

    Globs the venv next to ``python`` first (no process); falls back to asking that
    interpreter where the package is, without importing it here. WorkerError if missing.
    """

    def complete(path: Path) -> bool:
        return path.exists() and Path(str(path) + marker).is_file()

    venv = python.parent.parent
    for candidate in sorted(venv.glob(f"lib/python3*/site-packages/{package}/{relative}")):
        if complete(candidate):
            return candidate
    code = (
        f"import importlib.util as u; s = u.find_spec({package!r}); "
        "print(list(s.submodule_search_locations)[0] if s else '')"
    )
    try:
        found = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, timeout=60, check=False
        ).stdout.strip()
    except OSError as exc:
        raise WorkerError(f"cannot run {python} to find {package}: {exc}") from exc
    path = Path(found) / relative if found else None
    if path is None or not complete(path):
        raise WorkerError(f"{relative} of package {package} not found for {python}")
    return path
