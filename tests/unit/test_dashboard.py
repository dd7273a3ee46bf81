"""The status page as served: self-contained (nothing fetched from anywhere but /status),
its Content-Security-Policy allowing exactly its own inline script and style, the operator
guard of /status, and the /status fields the page reads. The page in a real browser:
tests/integration/test_dashboard_browser.py."""

from __future__ import annotations

import base64
import hashlib
import os
import re
from typing import Any

import httpx
import pytest

from hearthgate.gateway import dashboard
from hearthgate.gateway.admission import AdmissionController
from hearthgate.gateway.app import create_app
from hearthgate.gateway.settings import load_settings
from hearthgate.policies.pacing import PacingCuts, PacingState

WORKERS = [{"name": "w", "url": "http://127.0.0.1:1", "models": ["m"]}]
ADMIN_ENV = "HG_DASHBOARD_TEST_ADMIN_KEY"
PAGE = dashboard.PAGE.decode()


@pytest.fixture(autouse=True)
def _no_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("HEARTHGATE_")]:
        monkeypatch.delenv(key)


def test_page_references_no_url_of_any_host() -> None:
    assert not re.search(r"(?i)\b(?:https?|wss?|ftp):", PAGE)
    # nothing loaded by markup or CSS: no src, no stylesheet or font links, no url() or @import
    assert not re.search(r"(?i)\ssrc\s*=", PAGE)
    assert re.findall(r"(?i)<link\b[^>]*>", PAGE) == ['<link rel="icon" href="data:,">']
    assert not re.search(r"(?i)url\(|@import|@font-face", PAGE)
    # the one request the script makes is the relative "status" (same origin, same prefix)
    assert re.findall(r"fetch\(([^,)]*)", PAGE) == ['"status"']
    assert not re.search(r"(?i)\b(?:XMLHttpRequest|WebSocket|EventSource|importScripts)\b", PAGE)


def _inline(tag: str) -> list[str]:
    return re.findall(rf"<{tag}>(.*?)</{tag}>", PAGE, flags=re.S)


def _hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def test_policy_allows_exactly_the_inline_script_and_style() -> None:
    csp = dict(d.split(" ", 1) for d in dashboard.CONTENT_SECURITY_POLICY.split("; "))
    (script,) = _inline("script")
    (style,) = _inline("style")
    assert csp["default-src"] == "'none'"
    assert csp["script-src"] == _hash(script)
    assert csp["style-src"] == _hash(style)
    assert csp["connect-src"] == "'self'"
    assert csp["frame-ancestors"] == "'none'" and csp["form-action"] == "'none'"
    assert "unsafe" not in dashboard.CONTENT_SECURITY_POLICY
    # no inline event handlers or style attributes (a hash does not cover them)
    assert not re.search(r"(?i)\son[a-z]+\s*=\s*\"", PAGE)
    assert not re.search(r"(?i)<[a-z][^>]*\sstyle\s*=", PAGE)
    # and the script never writes markup, only text
    assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write", script)


async def _get(settings: Any, path: str, client: str, **headers: str) -> httpx.Response:
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app, client=(client, 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        return await http.get(path, headers=headers)


@pytest.mark.parametrize("path", dashboard.PATHS)
async def test_served_on_this_machine_without_an_admin_key(path: str) -> None:
    got = await _get(load_settings(None, workers=WORKERS), path, "127.0.0.1")
    assert got.status_code == 200
    assert got.headers["content-type"] == "text/html; charset=utf-8"
    assert got.headers["content-security-policy"] == dashboard.CONTENT_SECURITY_POLICY
    assert got.headers["x-content-type-options"] == "nosniff"
    assert got.headers["cache-control"] == "no-store"
    assert got.content == dashboard.PAGE


async def test_refused_to_the_network_without_an_admin_key() -> None:
    got = await _get(load_settings(None, workers=WORKERS), "/", "192.0.2.7")
    assert got.status_code == 401
    assert got.headers["content-type"].startswith("text/html")
    assert "admin key" in got.text and "<script" not in got.text
    assert got.headers["content-security-policy"] == dashboard.CONTENT_SECURITY_POLICY


async def test_with_an_admin_key_the_page_is_open_and_its_data_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ADMIN_ENV, "sesame")
    s = load_settings(None, workers=WORKERS, auth={"admin_key_env": ADMIN_ENV})
    page = await _get(s, "/dashboard", "192.0.2.7")
    assert page.status_code == 200 and page.content == dashboard.PAGE
    assert (await _get(s, "/status", "192.0.2.7")).status_code == 401
    ok = await _get(s, "/status", "192.0.2.7", authorization="Bearer sesame")
    assert ok.status_code == 200


async def test_status_has_what_the_page_reads() -> None:
    got = (await _get(load_settings(None, workers=WORKERS), "/status", "127.0.0.1")).json()
    voice = got["queues"]["voice"]
    assert voice["interactive"] is True and voice["admitted"] == 0
    assert voice["ttft_target_s"] == 0.3 and voice["itl_target_s"] == 0.05
    assert got["queues"]["batch"]["ttft_target_s"] is None
    assert got["slo"] == {} and got["app_tokens"] == {}
    assert {"name", "up", "in_flight", "role", "served"} <= set(got["workers"][0])
    assert got["workers"][0]["flooding_apps"] == []
    assert got["workers"][0]["prefill_tokens_per_s"] == 4000  # the estimate before any
    assert got["batches"]["enabled"] is False


async def test_status_has_no_prefill_rate_for_an_embeddings_worker() -> None:
    embed = {"name": "e", "url": "http://127.0.0.1:2", "models": ["emb"], "role": "embeddings"}
    s = load_settings(None, workers=[*WORKERS, embed])
    got = (await _get(s, "/status", "127.0.0.1")).json()
    rates = {w["name"]: w["prefill_tokens_per_s"] for w in got["workers"]}
    assert rates == {"w": 4000, "e": None}


async def test_status_counts_targets_met_and_tokens_per_app() -> None:
    app = create_app(load_settings(None, workers=WORKERS, apps=[{"name": "notes"}]))
    gw = app.state.gateway
    m = gw.metrics
    m.slo.labels("voice", "both", "met").inc(3)
    m.slo.labels("voice", "both", "missed").inc(1)
    m.slo.labels("voice", "ttft", "met").inc(4)  # one target alone is not counted
    m.slo.labels("chat", "both", "met").inc(2)
    m.class_tokens.labels("rag", "notes", "prompt").inc(100)
    m.class_tokens.labels("batch", "notes", "prompt").inc(20)
    m.class_tokens.labels("rag", "notes", "completion").inc(7)
    m.class_tokens.labels("chat", "anonymous", "completion").inc(5)
    got = gw.status()
    assert got["slo"] == {"voice": {"met": 3, "missed": 1}, "chat": {"met": 2, "missed": 0}}
    assert got["app_tokens"] == {
        "notes": {"prompt": 120, "completion": 7},
        "anonymous": {"prompt": 0, "completion": 5},
    }


async def test_status_shows_each_workers_pacing_cuts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per paced worker, how often each of its levers was cut and why; a lever that is off
    (no prefill pacing: no duty) has no counts."""
    cuts = PacingCuts(background_gap=2, duty_late=5, app_gap=1)
    paced = {"w": PacingState(4, 6, 0.012, None, cuts, app_gap_s=0.00751)}
    monkeypatch.setattr(AdmissionController, "pacing_state", lambda self: paced)
    got = (await _get(load_settings(None, workers=WORKERS), "/status", "127.0.0.1")).json()
    pacing = got["workers"][0]["pacing"]
    assert (pacing["background_cap"], pacing["app_cap"], pacing["prefill_duty"]) == (4, 6, None)
    assert pacing["cuts"] == {"background_gap": 2, "background_late": 0, "app_gap": 1}
    assert pacing["app_gap_s"] == 0.0075  # the per-app cap's gap now (it may follow speed)


async def test_status_shows_the_gaps_pacing_holds() -> None:
    """The gaps the caps are moved against, from the settings; the per-app cap's only with
    per-app pacing on, none at all with pacing off."""
    got = (await _get(load_settings(None, workers=WORKERS), "/status", "127.0.0.1")).json()
    gaps = got["pacing_gaps"]
    # 0.3, 0.5 and 0.8 x the chat class's 50 ms itl; the per-app cap: background's gap.
    assert gaps == pytest.approx(
        {"decode_s": 0.015, "prefill_s": 0.025, "prefill_behind_s": 0.04, "app_s": 0.015}
    )
    own = load_settings(None, workers=WORKERS, scheduler={"pacing": {"app_target_fraction": 0.16}})
    assert (await _get(own, "/status", "127.0.0.1")).json()["pacing_gaps"]["app_s"] == (
        pytest.approx(0.008)
    )
    solo = load_settings(None, workers=WORKERS, scheduler={"pacing": {"per_app": False}})
    assert (await _get(solo, "/status", "127.0.0.1")).json()["pacing_gaps"]["app_s"] is None
    off = load_settings(None, workers=WORKERS, scheduler={"pacing": {"enabled": False}})
    assert (await _get(off, "/status", "127.0.0.1")).json()["pacing_gaps"] is None
