"""What the wrappers of child processes (vLLM workers, the gateway, Redis) share: the
child's handle, its pid, whether it still runs, and ``with`` blocks that stop it."""

from __future__ import annotations

import subprocess
import types
from typing import Self


class ChildProcess:
    """Base of a wrapper that starts one child process with ``start()`` and ends it with
    ``stop()``; ``with`` starts it (subclasses may wait until it is ready) and always
    stops it."""

    _proc: subprocess.Popen[bytes] | None = None

    def start(self) -> object:
        raise NotImplementedError

    def stop(self) -> int | None:
        raise NotImplementedError

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """True while the started process has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        self.stop()
