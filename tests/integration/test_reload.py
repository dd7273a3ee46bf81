"""Settings reload (``POST /reload``, what SIGHUP and ``hearthgate reload`` do), in-process:
the real app and its lifespan, a settings file on disk read again by ``load_settings``, a
FakeUpstream standing in for the workers. The same under real load, with real vLLM and the
signal, is in tests/e2e/test_reload_vllm.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from hearthgate.gateway.app import create_app
from hearthgate.gateway.settings import load_settings
from hearthgate.gateway.upstream import UpstreamResponse
from tests.inprocess import FakeResponse, FakeUpstream, until

CHAT = "/v1/chat/completions"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def answer(text: str) -> FakeResponse:
    body = {
        "id": "x",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    return FakeResponse(200, [json.dumps(body).encode()])


class Gate:
    """Answers at once, except the calls whose content starts with "hold" while closed.
    Records (worker, content) of every call in the order they reached the workers."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.calls: list[tuple[str, str]] = []
        self.holding = 0

    async def __call__(self, worker: str, path: str, body: dict[str, Any]) -> UpstreamResponse:
        content = str(body["messages"][-1]["content"])
        self.calls.append((worker, content))
        if content.startswith("hold") and not self.opened.is_set():
            self.holding += 1
            try:
                await self.opened.wait()
            finally:
                self.holding -= 1
        return answer("re: " + content)

    def order(self) -> list[str]:
        return [c for _, c in self.calls]


def base(**extra: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "workers": [
            {"name": "w0", "url": "http://w0", "models": ["m"], "limits": {"max_in_flight": 1}}
        ],
        "health": {"interval_s": 60},
        "scheduler": {"tick_ms": 5},
        "apps": [{"name": "home", "may_choose_class": ["chat", "rag"]}],
    }
    s.update(extra)
    return s


@dataclass
class Running:
    http: httpx.AsyncClient
    file: Path
    gate: Gate
    upstream: FakeUpstream

    def write(self, settings: dict[str, Any]) -> None:
        self.file.write_text(yaml.safe_dump(settings))

    async def reload(self) -> httpx.Response:
        return await self.http.post("/reload")

    async def chat(self, content: str, cls: str | None = None, key: str | None = None) -> Any:
        headers = {}
        if cls is not None:
            headers["x-hearthgate-class"] = cls
        if key is not None:
            headers["authorization"] = f"Bearer {key}"
        body = {"model": "m", "messages": [{"role": "user", "content": content}]}
        return await self.http.post(CHAT, json=body, headers=headers)

    async def status(self) -> dict[str, Any]:
        r = await self.http.get("/status")
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def running(tmp_path: Path, settings: dict[str, Any]) -> AsyncIterator[Running]:
    file = tmp_path / "settings.yaml"
    file.write_text(yaml.safe_dump(settings))
    gate = Gate()
    upstream = FakeUpstream(gate)
    app = create_app(
        load_settings(file), upstream=upstream, source=lambda: load_settings(file), path=str(file)
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            yield Running(http, file, gate, upstream)


async def wait_queued(gw: Running, n: int) -> None:
    for _ in range(500):
        s = await gw.status()
        if sum(q["depth"] for q in s["queues"].values()) == n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{n} requests never queued")


async def behind_a_held_chat(gw: Running, *contents: str) -> list[asyncio.Task[Any]]:
    """Take w0's only slot with a held chat, then queue one request per content, in
    order (those starting with "rag" in the rag class); the held one's task first."""
    tasks = [asyncio.create_task(gw.chat("hold"))]
    await until(lambda: gw.gate.holding == 1, what="the slot is taken")
    for n, content in enumerate(contents, 1):
        cls = "rag" if content.startswith("rag") else None
        tasks.append(asyncio.create_task(gw.chat(content, cls=cls)))
        await wait_queued(gw, n)
    return tasks


async def test_a_new_priority_applies_to_requests_already_queued(tmp_path: Path) -> None:
    async with running(tmp_path, base()) as gw:
        held, rag, chat = await behind_a_held_chat(gw, "rag-1", "chat-1")
        classes = {
            "voice": {"priority": 1, "interactive": True},
            "chat": {"priority": 1, "interactive": True},
            "rag": {"priority": 0},
            "embed": {"priority": 3},
            "batch": {"priority": 4},
        }
        gw.write(base(classes=classes))
        r = await gw.reload()
        assert r.status_code == 200, r.text
        assert r.json()["ok"] is True and "classes" in r.json()["changed"]
        gw.gate.opened.set()
        for t in (held, rag, chat):
            assert (await t).status_code == 200
        assert gw.gate.order() == ["hold", "rag-1", "chat-1"]  # rag now goes first
        assert (await gw.status())["settings"]["last_reload"]["ok"] is True


async def test_without_the_reload_chat_goes_first(tmp_path: Path) -> None:
    """The control of the test above: same requests, no reload."""
    async with running(tmp_path, base()) as gw:
        held, rag, chat = await behind_a_held_chat(gw, "rag-1", "chat-1")
        gw.gate.opened.set()
        for t in (held, rag, chat):
            assert (await t).status_code == 200
        assert gw.gate.order() == ["hold", "chat-1", "rag-1"]


async def test_a_new_key_replaces_the_old_one_at_once(tmp_path: Path) -> None:
    apps = [{"name": "home", "key_sha256": digest("old-key")}]
    async with running(tmp_path, base(apps=apps)) as gw:
        assert (await gw.chat("a", key="old-key")).status_code == 200
        gw.write(base(apps=[{"name": "home", "key_sha256": digest("new-key")}]))
        assert (await gw.reload()).status_code == 200
        r = await gw.chat("b", key="old-key")
        assert r.status_code == 401 and r.json()["error"]["message"] == "invalid API key"
        assert (await gw.chat("c", key="new-key")).status_code == 200


async def test_an_invalid_file_keeps_the_running_settings(tmp_path: Path) -> None:
    apps = [{"name": "home", "key_sha256": digest("k")}]
    async with running(tmp_path, base(apps=apps)) as gw:
        before = (await gw.status())["settings"]
        assert before["path"] == str(gw.file) and before["last_reload"] is None
        gw.file.write_text("classes: {chat: {priority: high}}\nworkers: [")
        r = await gw.reload()
        assert r.status_code == 400
        assert r.json()["ok"] is False and "settings.yaml" in r.json()["error"]
        gw.write(base(apps=apps, classes={"chat": {"priority": "high"}}))
        r = await gw.reload()
        assert r.status_code == 400 and "classes.chat.priority" in r.json()["error"]
        after = (await gw.status())["settings"]
        assert after["loaded_at"] == before["loaded_at"]
        assert after["last_reload"]["ok"] is False
        assert (await gw.chat("still", key="k")).status_code == 200


async def test_removing_a_class_with_queued_requests_waits_until_it_is_idle(
    tmp_path: Path,
) -> None:
    async with running(tmp_path, base()) as gw:
        held, rag = await behind_a_held_chat(gw, "rag-1")
        classes = {
            "voice": {"priority": 0, "interactive": True},
            "chat": {"priority": 1, "interactive": True},
            "embed": {"priority": 3},
            "batch": {"priority": 4},
        }
        gw.write(base(classes=classes, apps=[{"name": "home"}]))
        r = await gw.reload()
        assert r.status_code == 400 and "class rag still has requests" in r.json()["error"]
        assert "rag" in (await gw.status())["queues"]
        gw.gate.opened.set()
        assert (await held).status_code == 200 and (await rag).status_code == 200
        r = await gw.reload()
        assert r.status_code == 200, r.text
        assert "rag" not in (await gw.status())["queues"]


async def test_workers_can_be_added_and_removed_while_requests_run(tmp_path: Path) -> None:
    w0 = {"name": "w0", "url": "http://w0", "models": ["m"], "limits": {"max_in_flight": 1}}
    w1 = {"name": "w1", "url": "http://w1", "models": ["m"]}
    async with running(tmp_path, base()) as gw:
        held = asyncio.create_task(gw.chat("hold"))
        await until(lambda: gw.gate.holding == 1, what="the request runs on w0")
        gw.write(base(workers=[w1]))  # w0 leaves while a request runs on it
        r = await gw.reload()
        assert r.status_code == 200 and r.json()["changed"] == ["workers"]
        names = [w["name"] for w in (await gw.status())["workers"]]
        assert names == ["w1"]
        assert (await gw.chat("next")).status_code == 200
        assert gw.gate.calls[-1] == ("w1", "next")
        gw.gate.opened.set()
        assert (await held).status_code == 200  # the request on the removed worker ended well
        gw.write(base(workers=[w0, w1]))
        assert (await gw.reload()).status_code == 200
        status = await gw.status()
        assert [w["name"] for w in status["workers"]] == ["w0", "w1"]
        for _ in range(200):
            if all(w["up"] for w in (await gw.status())["workers"]):
                break
            await asyncio.sleep(0.01)
        assert all(w["up"] for w in (await gw.status())["workers"]), "w0 was not checked"


async def test_restart_only_changes_are_reported_not_applied(tmp_path: Path) -> None:
    async with running(tmp_path, base()) as gw:
        gw.write(base(listen={"port": 9999}, limits={"max_body_bytes": 4096}))
        r = await gw.reload()
        assert r.status_code == 200
        assert r.json()["changed"] == ["limits"] and r.json()["at_restart"] == ["listen"]
        big = {"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]}
        r = await gw.http.post(CHAT, json=big)
        assert r.status_code == 413  # the new limit applies at once


async def test_without_a_settings_file_reload_is_refused(tmp_path: Path) -> None:
    s = load_settings(None, **base())
    app = create_app(s, upstream=FakeUpstream(Gate()))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            r = await http.post("/reload")
    assert r.status_code == 400 and "not started from a settings file" in r.json()["error"]


async def test_reload_is_an_operator_page(tmp_path: Path) -> None:
    """Like /status: from another machine without the admin key it is 401."""
    async with running(tmp_path, base()) as gw:
        app = gw.http._transport.app  # type: ignore[attr-defined]
        transport = httpx.ASGITransport(app=app, client=("192.168.1.20", 5000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as remote:
            r = await remote.post("/reload")
        assert r.status_code == 401
