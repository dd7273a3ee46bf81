"""The status page (``GET /`` and ``GET /dashboard``): one self-contained HTML page that
polls ``/status`` every 2 s and shows, in plain words, whether the box is busy, what waits,
which app uses how much, each worker's state, how often the classes met their targets, and
the background jobs.

Everything is inline (no build step, nothing fetched but ``/status``, no external fonts), so
the page works on a NAS with no internet; its style, body and script live in ``static/`` as
plain files, read once at import into the one page. It is served with a
Content-Security-Policy that allows exactly the page's own script and style, by their
SHA-256 hashes (computed here at import), and nothing else: no other script, style, frame,
form target or host. Hashes rather than ``'unsafe-inline'`` because the page shows strings
from the settings and the workers (app and worker names, a worker's last error); it writes
them as text only, and should that ever slip, injected markup still could not run script.
Values are set on elements through the DOM (``el.style.width``), which the policy allows,
never as ``style`` attributes.

Who may open it is who may read ``/status`` (gateway.auth.AdminGuard). Without an admin key
the page answers clients on the gateway's own machine only. With an admin key the page
itself holds no data and is served to anyone; its calls to ``/status`` need the key, which
the page asks for after a 401 and keeps in the tab's ``sessionStorage``.
"""

from __future__ import annotations

import base64
import hashlib
import html
from importlib.resources import files

from starlette.responses import Response

from hearthgate.gateway.auth import AdminGuard
from hearthgate.gateway.errors import Unauthorized

PATHS = ("/", "/dashboard")


def _asset(name: str) -> str:
    """One of the page's parts, kept as a file beside this module (``static/``) so the CSS
    and JavaScript can be read and edited as what they are."""
    return (files("hearthgate.gateway") / "static" / name).read_text(encoding="utf-8")


_CSS = _asset("status.css")
_BODY = _asset("status-body.html")
_JS = _asset("status.js")


def _source_hash(text: str) -> str:
    """A CSP source expression allowing the inline element whose content is ``text``."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


PAGE = (
    '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
    '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
    '<meta name="color-scheme" content="light dark">\n'
    '<meta name="referrer" content="no-referrer">\n'
    "<title>hearthgate status</title>\n"
    '<link rel="icon" href="data:,">\n'
    f"<style>{_CSS}</style>\n</head>\n<body>{_BODY}<script>{_JS}</script>\n</body>\n</html>\n"
).encode()

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        f"script-src {_source_hash(_JS)}",
        f"style-src {_source_hash(_CSS)}",
        "connect-src 'self'",
        "img-src data:",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)

HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def status_page(admin: AdminGuard, client_host: str | None) -> Response:
    """The page for a client at ``client_host``: to anyone when an admin key is set (its
    data then needs the key), else to clients on this machine only (401 page otherwise)."""
    if not admin.has_key:
        try:
            admin.check(None, client_host)
        except Unauthorized as exc:
            refusal = (
                '<!doctype html>\n<html lang="en"><meta charset="utf-8">'
                '<meta name="viewport" content="width=device-width, initial-scale=1">'
                f"<title>hearthgate status</title><p>{html.escape(exc.message)}</p></html>\n"
            )
            return Response(refusal, 401, HEADERS, media_type="text/html; charset=utf-8")
    return Response(PAGE, 200, HEADERS, media_type="text/html; charset=utf-8")
