"""The status page (``GET /``) in a real browser: Debian's headless Chromium driven by
Playwright, against a real gateway process in front of the instant upstream.

What a person would check: the page shows a headline and the workers at desktop and at
phone width (360 px, no sideways scrolling), its numbers move when requests arrive, it asks
for the admin key when /status wants one and works once it is given, its script and style
run under its Content-Security-Policy (no violation reported), and it fetches nothing but
itself and /status. The screenshot under load is kept in ``.run/tests/status-page.png``;
``UPDATE_SCREENSHOTS=1`` (or a missing file) also writes it to ``docs/status-page.png``,
the README's picture, so a test run does not change the checkout.

`make setup` installs /usr/bin/chromium; `playwright install` is never needed.
"""

from __future__ import annotations

import concurrent.futures
import copy
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import (
    Browser,
    ConsoleMessage,
    Page,
    Route,
    ViewportSize,
    expect,
    sync_playwright,
)

from hearthgate.deploy.gateway_process import GatewayProcess
from tests.inprocess import until_sync
from tests.support import REPO, RUN_DIR, instant_upstream

CHROMIUM = Path("/usr/bin/chromium")
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
PHONE: ViewportSize = {"width": 360, "height": 740}
DESKTOP: ViewportSize = {"width": 1280, "height": 900}
SCREENSHOT = REPO / "docs" / "status-page.png"
ADMIN_ENV = "HG_DASHBOARD_ADMIN_KEY"
ADMIN = "the-dashboard-admin-key"
DELAY_MS = 30  # between the upstream's tokens (below voice's 50 ms target): 100 take 3 s

# The apps of deploy/settings.example.yaml, each with its class and a key of its own.
APPS = {"assistant": "voice", "family-chat": "chat", "notes": "rag", "summaries": "batch"}


def _key(app: str) -> str:
    return f"key-of-{app}"


def _settings(upstream: str, **extra: Any) -> dict[str, Any]:
    apps = [
        {"name": a, "key_sha256": hashlib.sha256(_key(a).encode()).hexdigest(), "default_class": c}
        for a, c in APPS.items()
    ]
    # Two requests at a time on the worker, so that more wait in their class queues; decode
    # and prefill pacing aim above the upstream's gaps (prefill: 1.0 x voice's 50 ms itl),
    # so they leave background requests both places.
    worker = {"name": "gpu0", "url": upstream, "models": ["m"], "limits": {"max_in_flight": 2}}
    return {
        "workers": [worker],
        "apps": apps,
        "health": {"interval_s": 0.2},
        "scheduler": {"pacing": {"target_gap_ms": 100, "prefill_fraction": 1.0}},
        **extra,
    }


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make setup` installs it (Debian package chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with instant_upstream(delay_ms=DELAY_MS) as url:
        yield url


@pytest.fixture(scope="module")
def gw(upstream: str) -> Iterator[str]:
    with GatewayProcess(_settings(upstream), run_dir=RUN_DIR, name="dashboard") as g:
        yield g.url


@pytest.fixture(scope="module")
def keyed_gw(upstream: str) -> Iterator[str]:
    os.environ[ADMIN_ENV] = ADMIN  # GatewayProcess passes the environment on
    try:
        settings = _settings(upstream, auth={"admin_key_env": ADMIN_ENV})
        with GatewayProcess(settings, run_dir=RUN_DIR, name="dashboard-keyed") as g:
            yield g.url
    finally:
        os.environ.pop(ADMIN_ENV, None)


class Watched:
    """A page with what it logged as errors (CSP violations included) and every URL it
    asked for."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.errors: list[str] = []
        self.requests: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        page.on("request", lambda req: self.requests.append(req.url))

    def _console(self, msg: ConsoleMessage) -> None:
        if msg.type == "error":
            self.errors.append(msg.text)

    def paths(self, base: str) -> set[str]:
        """The paths asked for; AssertionError for any URL of another origin."""
        out = set()
        for url in self.requests:
            assert url.startswith(base + "/"), f"the page fetched {url}"
            out.add(urlsplit(url).path)
        return out


def _open(browser: Browser, url: str, viewport: ViewportSize, phone: bool) -> Watched:
    context = browser.new_context(
        viewport=viewport, device_scale_factor=1, is_mobile=phone, has_touch=phone
    )
    page = context.new_page()
    watched = Watched(page)
    page.goto(url)
    return watched


def _no_sideways_scroll(page: Page) -> None:
    width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], f"page is {width[0]} px wide in a {width[1]} px window"


def _stream(gw: str, app: str, max_tokens: int) -> int:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": f"hello from {app}"}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {_key(app)}"}
    with httpx.stream(
        "POST", gw + "/v1/chat/completions", json=body, headers=headers, timeout=60
    ) as r:
        for _ in r.iter_bytes():
            pass
        return r.status_code


def _status(gw: str) -> dict[str, Any]:
    got: dict[str, Any] = httpx.get(gw + "/status", timeout=5).json()
    return got


def test_desktop_shows_headline_workers_and_classes(browser: Browser, gw: str) -> None:
    w = _open(browser, gw + "/", DESKTOP, phone=False)
    page = w.page
    expect(page.locator("#headline")).to_have_text(re.compile(r"^(Idle|Busy|Answering)"))
    row = page.locator('[data-worker="gpu0"]')
    expect(row).to_be_visible()
    expect(row.locator(".badge")).to_have_text("up")
    expect(row.locator('[data-role="stats"]')).to_contain_text("in flight 0")
    expect(page.locator("#queues [data-cls]")).to_have_count(5)
    expect(page.locator("#workers-up")).to_have_text("1/1")
    expect(page.locator("#jobs-card")).to_be_hidden()  # no Redis: no Batch API
    expect(page.locator("footer")).to_contain_text("settings loaded ")
    # it polls: a second /status within a few seconds
    page.wait_for_function(
        "n => performance.getEntriesByType('resource')"
        ".filter(e => e.name.endsWith('/status')).length >= n",
        arg=2,
        timeout=6000,
    )
    page.goto(gw + "/dashboard")
    expect(page.locator('[data-worker="gpu0"]')).to_be_visible()
    assert w.paths(gw) == {"/", "/dashboard", "/status"}
    assert w.errors == []  # no script error, no CSP violation
    page.context.close()


def test_phone_under_load(browser: Browser, gw: str) -> None:
    w = _open(browser, gw + "/", PHONE, phone=True)
    page = w.page
    headline = page.locator("#headline")
    expect(headline).to_have_text("Idle", timeout=10_000)
    expect(page.locator('[data-worker="gpu0"]')).to_be_visible()
    assert page.evaluate("window.innerWidth") == PHONE["width"]
    _no_sideways_scroll(page)

    # Finished streams, seen by three polls, give the "on target" chart its first points.
    for n in (1, 2, 3):
        for app in ("assistant", "family-chat"):
            assert _stream(gw, app, 4) == 200
        expect(page.locator("#legend")).to_contain_text(f"voice: 100% of {n} ", timeout=10_000)
    expect(page.locator("#chart polyline")).to_have_count(2)
    expect(page.locator('#apps [data-app="assistant"]')).to_contain_text("tokens")

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        # Two long background summaries take both of the worker's places ...
        jobs = [pool.submit(_stream, gw, "summaries", 250) for _ in range(2)]
        until_sync(
            lambda: _status(gw)["queues"]["batch"]["admitted"] == 2,
            timeout=10,
            what="the summaries admitted",
        )
        # ... so the notes app, the assistant and the chat wait behind them.
        jobs += [pool.submit(_stream, gw, app, 20) for app in ("notes", "family-chat")]
        jobs += [pool.submit(_stream, gw, "assistant", 20) for _ in range(2)]
        page.wait_for_function(
            "() => Number(document.getElementById('inflight').textContent) > 0"
            " || /^Busy/.test(document.getElementById('headline').textContent)",
            timeout=10_000,
        )
        expect(headline).to_have_text("Busy: voice and chat waiting", timeout=10_000)
        expect(page.locator('#queues [data-cls="voice"]')).to_have_class(re.compile("waiting"))
        expect(page.locator('#queues [data-cls="voice"]')).to_contain_text("interactive")
        expect(page.locator("#inflight")).to_have_text("2")
        _no_sideways_scroll(page)
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        shot = RUN_DIR / "status-page.png"
        page.screenshot(path=str(shot), full_page=True)
        if os.environ.get("UPDATE_SCREENSHOTS") == "1" or not SCREENSHOT.exists():
            SCREENSHOT.parent.mkdir(exist_ok=True)
            shutil.copyfile(shot, SCREENSHOT)
        assert [j.result() for j in jobs] == [200] * len(jobs)

    # and back to idle once the load is over, without reloading
    expect(headline).to_have_text("Idle", timeout=10_000)
    expect(page.locator("#inflight")).to_have_text("0")
    assert w.paths(gw) == {"/", "/status"}
    assert w.errors == []
    page.context.close()


def test_admin_key_form(browser: Browser, keyed_gw: str) -> None:
    w = _open(browser, keyed_gw + "/", PHONE, phone=True)
    page = w.page
    form = page.locator("#auth")
    expect(form).to_be_visible()
    expect(page.locator("#auth-msg")).to_contain_text("missing admin key")
    expect(page.locator("#content")).to_be_hidden()
    _no_sideways_scroll(page)

    page.fill("#key", "not-the-key")
    page.click("#key-form button")
    expect(page.locator("#auth-msg")).to_have_text(re.compile("not accepted"))
    assert page.evaluate("sessionStorage.getItem('hearthgate-admin-key')") is None

    page.fill("#key", ADMIN)
    page.press("#key", "Enter")
    expect(form).to_be_hidden()
    expect(page.locator("#headline")).to_have_text("Idle")
    expect(page.locator('[data-worker="gpu0"]')).to_be_visible()
    # kept for the tab: a reload needs no key
    page.reload()
    expect(page.locator('[data-worker="gpu0"]')).to_be_visible()
    expect(form).to_be_hidden()
    # and forgotten on request
    page.click("#forget")
    expect(form).to_be_visible()
    assert w.paths(keyed_gw) == {"/", "/status"}
    page.context.close()


def _fake_status(real: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> str:
    s = copy.deepcopy(real)
    change(s)
    return json.dumps(s)


def test_states_the_load_test_does_not_reach(browser: Browser, gw: str) -> None:
    """Background jobs, a worker down, long names: a real /status, edited on its way to
    the page (Playwright's request routing)."""
    real = _status(gw)
    long_name = "a-worker-with-a-rather-long-name-" * 3

    def jobs_and_trouble(s: dict[str, Any]) -> None:
        s["batches"] = {
            "enabled": True,
            "redis": "up",
            "batches": [
                {"id": "batch_1", "app": "summaries", "status": "in_progress", "total": 120},
                {"id": "batch_2", "app": "notes", "status": "in_progress", "total": 10},
            ],
        }
        s["batches"]["batches"][0].update(done=30, running_here=2, eta_s=95.0)
        s["batches"]["batches"][1].update(done=0, running_here=0, eta_s=None)
        down = copy.deepcopy(s["workers"][0])
        down.update(name=long_name, up=False, last_error="connection refused " + "x" * 200)
        s["workers"].append(down)
        s["queues"]["rag"].update(depth=3, oldest_wait_s=12.3)
        s["queued"] = 3

    body = _fake_status(real, jobs_and_trouble)

    def fulfil(route: Route) -> None:
        route.fulfill(status=200, content_type="application/json", body=body)

    context = browser.new_context(viewport=PHONE, device_scale_factor=1, is_mobile=True)
    page = context.new_page()
    page.route("**/status", fulfil)
    page.goto(gw + "/")
    expect(page.locator("#headline")).to_have_text("Busy with background work")
    expect(page.locator("#subline")).to_contain_text("1 of 2 workers down")
    job = page.locator('[data-batch="batch_1"]')
    expect(job).to_contain_text("30 / 120")
    expect(job).to_contain_text("about 2 min left")
    assert job.locator(".fill").evaluate("e => parseFloat(e.style.width)") == 25
    expect(page.locator('[data-batch="batch_2"]')).to_contain_text("finish time not known")
    expect(page.locator(f'[data-worker="{long_name}"] .badge')).to_have_text("down")
    expect(page.locator('#queues [data-cls="rag"]')).to_contain_text("12 s")
    _no_sideways_scroll(page)

    # voice waiting is what the headline says first
    def voice_waits(s: dict[str, Any]) -> None:
        s["queues"]["voice"].update(depth=1, oldest_wait_s=0.4)
        s["queues"]["chat"].update(admitted=1)

    body = _fake_status(real, voice_waits)
    expect(page.locator("#headline")).to_have_text("Busy: voice waiting", timeout=6000)
    expect(page.locator("#subline")).to_contain_text("0.4 s")

    # the gateway gone: said so, the last numbers kept
    page.unroute("**/status")
    page.route("**/status", lambda route: route.abort())
    expect(page.locator("#headline")).to_have_text("Can't reach the gateway", timeout=6000)
    context.close()
