"""API keys: the apps' keys and the admin key that guards /status and /metrics.

Keys are held and compared as SHA-256 digests: a key from the environment is hashed once at
start, a key the settings give as ``key_sha256`` is used as it is, and a presented key is
hashed and compared with every configured digest in constant time, so neither the time nor
the key's length tells which (or whether any) matched.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from collections.abc import Mapping
from urllib.parse import urlsplit

from hearthgate.gateway.errors import Unauthorized
from hearthgate.gateway.settings import App, Settings, is_loopback

log = logging.getLogger("hearthgate.auth")


def key_digest(key: str) -> bytes:
    """The SHA-256 of ``key`` (UTF-8), what ``key_sha256`` holds in hex."""
    return hashlib.sha256(key.encode()).digest()


def bearer_key(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header; None when there is none."""
    if not authorization:
        return None
    scheme, _, key = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return key.strip() or None


def _digest(
    env_name: str | None, sha256_hex: str | None, environ: Mapping[str, str], what: str
) -> bytes | None:
    """The configured key's digest; None (with a warning) when its variable is empty."""
    if sha256_hex is not None:
        return bytes.fromhex(sha256_hex)
    if env_name is None:
        return None
    key = environ.get(env_name, "").strip()
    if not key:
        log.warning(
            "%s: environment variable %s is not set; it cannot authenticate", what, env_name
        )
        return None
    return key_digest(key)


class AppKeys:
    """The apps' keys; :meth:`find` names the app a presented key belongs to."""

    def __init__(self, settings: Settings, environ: Mapping[str, str] = os.environ) -> None:
        self._table: list[tuple[bytes, App]] = []
        for app in settings.apps:
            digest = _digest(app.key_env, app.key_sha256, environ, f"app {app.name}")
            if digest is None:
                continue
            same = next((a for d, a in self._table if d == digest), None)
            if same is not None:
                log.warning(
                    "apps %s and %s have the same key; requests with it count as %s",
                    same.name,
                    app.name,
                    same.name,
                )
            self._table.append((digest, app))

    def __len__(self) -> int:
        return len(self._table)

    def find(self, key: str) -> App | None:
        given = key_digest(key)
        found: App | None = None
        for digest, app in self._table:  # every digest, always: the time does not tell which
            if hmac.compare_digest(given, digest) and found is None:
                found = app
        return found


def loopback_host(host: str) -> bool:
    """Whether a ``Host`` header names this machine's loopback (``localhost``, 127.x,
    ``[::1]``), with or without a port."""
    name = urlsplit("//" + host).hostname
    return name is not None and is_loopback(name)


def same_origin(origin: str, host: str) -> bool:
    """Whether an ``Origin`` header is the gateway's own (``http(s)://<Host>``)."""
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()


class AdminGuard:
    """Who may read /status and /metrics (and other operator pages).

    With an admin key configured (``auth.admin_key_env`` or ``auth.admin_key_sha256``):
    whoever presents it as a bearer token, from anywhere. Without one: clients on the
    gateway's own machine (loopback) only, whatever else the settings say, so an app's key
    or anonymous access never opens the operator pages to the network. ``/healthz`` and
    ``/readyz`` are not guarded (container and load-balancer health checks).
    """

    def __init__(self, settings: Settings, environ: Mapping[str, str] = os.environ) -> None:
        a = settings.auth
        self._digest = _digest(a.admin_key_env, a.admin_key_sha256, environ, "admin key")
        if self._digest is None and not is_loopback(settings.listen.host):
            log.info(
                "no admin key: /status and /metrics answer only clients on this machine "
                "(set auth.admin_key_env or auth.admin_key_sha256 to read them from the network)"
            )

    @property
    def has_key(self) -> bool:
        return self._digest is not None

    def check(
        self,
        authorization: str | None,
        client_host: str | None,
        host: str | None = None,
        origin: str | None = None,
    ) -> None:
        """Return if the request may read the operator pages; raise 401 otherwise.

        Without an admin key a loopback client must also name a loopback address in its
        ``Host`` header (a page whose DNS name was rebound to 127.0.0.1 names its own) and
        send no ``Origin`` of another site (a cross-origin form post from a page open in a
        browser on this machine); ``host`` None: not checked (a caller without headers)."""
        if self._digest is None:
            if client_host is not None and is_loopback(client_host):
                if host is not None and not loopback_host(host):
                    raise Unauthorized(
                        f"Host {host!r} is not this machine's loopback address: open the "
                        "gateway as http://127.0.0.1 or http://localhost, or set an admin key"
                    )
                if host is not None and origin is not None and not same_origin(origin, host):
                    raise Unauthorized(
                        f"a page from {origin} may not use the operator endpoints; set an "
                        "admin key to use them from elsewhere"
                    )
                return
            raise Unauthorized(
                "this page answers only on the gateway's own machine: set an admin key "
                "(auth.admin_key_env or auth.admin_key_sha256) to read it from the network"
            )
        key = bearer_key(authorization)
        if key is None:
            raise Unauthorized("missing admin key: send 'Authorization: Bearer <admin key>'")
        if not hmac.compare_digest(key_digest(key), self._digest):
            raise Unauthorized("invalid admin key")


def warn_if_anonymous(settings: Settings) -> None:
    """Log, at start, that anyone on the network may use the gateway without a key
    (``auth.allow_anonymous`` on a network address): allowed, never silent."""
    host = settings.listen.host
    if settings.auth.allow_anonymous and not settings.has_app_keys() and not is_loopback(host):
        log.warning(
            "auth.allow_anonymous: anyone who can reach %s:%d may use the gateway without a key",
            host,
            settings.listen.port,
        )
