"""Gateway settings: one YAML file plus ``HEARTHGATE_*`` environment overrides.

Environment variables win over the file; nested keys use ``__``
(``HEARTHGATE_LISTEN__PORT=9000``). Every key is validated at start and unknown keys are
errors, so a typo is reported instead of silently ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict


class SettingsError(Exception):
    """The settings file or the environment holds a bad value; the message names the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Listen(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=1, le=65535)


class Limits(_Strict):
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)


class Upstream(_Strict):
    connect_timeout_s: float = Field(2.0, gt=0)
    read_timeout_s: float = Field(600.0, gt=0)
    max_connections: int = Field(1024, ge=1)


class Health(_Strict):
    interval_s: float = Field(1.0, gt=0)
    timeout_s: float = Field(1.0, gt=0)
    retry_after_s: int = Field(2, ge=1)


WorkerRole = Literal["general", "long_prefill", "embeddings"]


class Worker(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    url: str
    models: list[str] = Field(min_length=1)
    role: WorkerRole = "general"
    priority_scheduling: bool = False

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v.rstrip("/")


class Metrics(_Strict):
    recent_window: int = Field(256, ge=1)


class Settings(BaseSettings):
    """The whole gateway configuration (see ``deploy/settings.example.yaml``)."""

    model_config = SettingsConfigDict(
        env_prefix="HEARTHGATE_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    listen: Listen = Listen()
    limits: Limits = Limits()
    upstream: Upstream = Upstream()
    health: Health = Health()
    metrics: Metrics = Metrics()
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = False
    workers: list[Worker] = Field(min_length=1)

    @field_validator("workers")
    @classmethod
    def _unique_names(cls, v: list[Worker]) -> list[Worker]:
        names = [w.name for w in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"worker names must be unique, repeated: {', '.join(dup)}")
        return v

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The YAML file arrives as init values; the environment overrides it.
        return (env_settings, init_settings)

    def models(self) -> list[str]:
        """Every model name served by some worker, in settings order, without repeats."""
        seen: dict[str, None] = {}
        for w in self.workers:
            for m in w.models:
                seen.setdefault(m, None)
        return list(seen)


def _format_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"  {key}: {msg}")
    return "\n".join(lines)


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Read ``path`` (YAML), apply environment overrides, validate; raise SettingsError."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as exc:
            raise SettingsError(f"cannot read settings file {p}: {exc.strerror}") from exc
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SettingsError(f"settings file {p} is not valid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise SettingsError(f"settings file {p} must hold a mapping at the top level")
        data = loaded
    data.update(overrides)
    try:
        return Settings(**data)
    except ValidationError as exc:
        where = f" in {path}" if path is not None else ""
        raise SettingsError(f"invalid settings{where}:\n{_format_error(exc)}") from exc
