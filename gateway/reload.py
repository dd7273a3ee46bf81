"""Settings reload without a restart (SIGHUP, ``POST /reload``, ``hearthgate reload``).

The file is read and validated again; if it is invalid, or would leave the gateway open to
the network without keys, or removes a class that still has requests, the old settings stay
and the reason is logged and answered. Otherwise classes, apps and keys, rules, limits,
workers, health, routing, scheduler weights and pacing apply at once, to queued requests
too, while requests in flight carry on. A few sections hold sockets, pools or tasks built
at start (``RESTART_ONLY``): a change there is reported and takes effect at the next start.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hearthgate.gateway.settings import Settings, SettingsError

log = logging.getLogger("hearthgate.reload")

RESTART_ONLY = (
    "listen",
    "upstream",
    "tokens",
    "metrics",
    "log_level",
    "access_log",
    "redis",
    "batch",
)
"""Top-level sections a reload reports but does not apply (they take effect at the next
start): the listening socket, the connection pool, the tokenizer, the metric windows,
logging, and the Batch API's Redis client and runner."""


@dataclass(frozen=True)
class Plan:
    """What a reload would do: the settings to apply (restart-only sections kept from the
    running ones), the sections that change now, and those left for the next start."""

    settings: Settings
    changed: list[str]
    at_restart: list[str]


def _sections(s: Settings) -> dict[str, Any]:
    return s.model_dump(mode="json", by_alias=True)


def plan_reload(old: Settings, new: Settings) -> Plan:
    """Compare two valid settings; raise ValueError when ``new`` cannot be applied while
    running (then nothing changes). Pure: no I/O, no clock."""
    before, after = _sections(old), _sections(new)
    at_restart = [k for k in RESTART_ONLY if before[k] != after[k]]
    changed = [k for k in after if k not in RESTART_ONLY and before[k] != after[k]]
    if old.scheduler.tick_ms != new.scheduler.tick_ms:
        at_restart.append("scheduler.tick_ms")
    keep: dict[str, Any] = {k: getattr(old, k) for k in at_restart if "." not in k}
    if "scheduler.tick_ms" in at_restart:
        keep["scheduler"] = new.scheduler.model_copy(update={"tick_ms": old.scheduler.tick_ms})
    effective = new.model_copy(update=keep) if keep else new
    problem = effective.exposure_problem()
    if problem is not None:
        raise ValueError(problem)
    if old.redis.url is not None and old.batch.class_ not in effective.classes:
        raise ValueError(
            f"batch.class {old.batch.class_!r} is not a class of the new file; background "
            "jobs run in it (keep the class, or change batch.class and restart)"
        )
    return Plan(effective, changed, at_restart)


@dataclass
class Outcome:
    """The result of one reload, as /status and ``POST /reload`` show it."""

    ok: bool
    at: float  # wall clock
    changed: list[str] = field(default_factory=list)
    at_restart: list[str] = field(default_factory=list)
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "at": self.at,
            "changed": self.changed,
            "at_restart": self.at_restart,
            "error": self.error,
        }


class Reloader:
    """Reads the settings again from ``source`` and hands valid ones to ``apply``.

    ``source``: how the running settings were made (the file, plus command-line
    overrides); None when the gateway was built from settings in code (tests, embedding),
    then a reload is refused with a clear message. ``apply`` may raise ValueError to refuse
    (nothing must have changed then)."""

    def __init__(
        self,
        settings: Settings,
        apply: Callable[[Settings], None],
        source: Callable[[], Settings] | None = None,
        path: str | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._apply = apply
        self._source = source
        self.path = path
        self._wall = wall_clock
        self.loaded_at = wall_clock()
        self.last: Outcome | None = None

    def reload(self) -> Outcome:
        """Re-read, check and apply; never raises. The outcome is also logged."""
        now = self._wall()
        try:
            if self._source is None:
                raise ValueError("this gateway was not started from a settings file")
            new = self._source()
            plan = plan_reload(self.settings, new)
            self._apply(plan.settings)
        except (SettingsError, ValueError) as exc:
            self.last = Outcome(False, now, error=str(exc))
            log.error("settings reload refused, the running settings stay: %s", exc)
            return self.last
        self.settings = plan.settings
        self.loaded_at = now
        self.last = Outcome(True, now, plan.changed, plan.at_restart)
        log.info(
            "settings reloaded from %s: %s",
            self.path or "code",
            ", ".join(plan.changed) or "nothing changed",
        )
        if plan.at_restart:
            log.warning(
                "settings reload: %s changed in the file but take effect at the next start",
                ", ".join(plan.at_restart),
            )
        return self.last

    def status(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "loaded_at": self.loaded_at,
            "last_reload": None if self.last is None else self.last.as_json(),
        }
