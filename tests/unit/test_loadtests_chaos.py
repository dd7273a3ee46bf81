"""The chaos soak's pure parts (plan, outcome classification, kill relations, checks, report)
and its client's disconnects against a small in-process server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from hearthgate.loadtests.chaos import SoakConfig, config_from_args, soak_settings
from hearthgate.loadtests.chaos_client import (
    LoadShape,
    Planned,
    is_token_event,
    kill_burst,
    new_log,
    plan_arrivals,
    request_for,
    send,
)
from hearthgate.loadtests.chaos_outcomes import (
    KIND_PHASES,
    Check,
    KillEvent,
    RequestLog,
    check_disconnects,
    check_kills,
    check_memory,
    check_no_error_before_streaming,
    check_status,
    check_unaffected,
    check_vllm,
    kill_relation,
    observed_phase,
    outcome,
    parse_gateway_counters,
    parse_vllm_gauges,
    parse_vmrss_kb,
    summarize_log,
)
from hearthgate.loadtests.chaos_report import (
    SoakResult,
    disconnect_table,
    outcome_table,
    relation_table,
    render,
)
from hearthgate.loadtests.cli import build_parser
from tests.inprocess import until


def rec(kind: str = "chat", **kw: object) -> RequestLog:
    stream = kind in ("chat", "rag_stream")
    base = RequestLog(id=1, kind=kind, stream=stream, expected_tokens=48, sent_s=10.0)
    if kind == "embed":
        base.expected_tokens = 0
    for k, v in kw.items():
        setattr(base, k, v)
    return base


def completed(kind: str = "chat", **kw: object) -> RequestLog:
    fields: dict[str, object] = {
        "status": 200,
        "headers_s": 10.01,
        "done": True,
        "end_s": 11.0,
        "usage_tokens": None if kind == "embed" else 48,
    }
    if kind in ("chat", "rag_stream"):
        fields |= {"first_token_s": 10.1, "tokens": 48}
    return rec(kind, **(fields | kw))


# ---------------------------------------------------------------- outcomes


def test_outcome_labels() -> None:
    assert outcome(completed()) == "completed"
    assert outcome(completed("rag_full")) == "completed"
    assert outcome(completed("embed")) == "completed"
    assert outcome(completed(disconnected="prefill")) == "disconnected:prefill"
    assert outcome(rec(status=503, retry_after="2")) == "http_503_retry_after"
    assert outcome(rec(status=503)) == "http_503_no_retry_after"
    assert outcome(rec(status=429, retry_after="1")) == "http_429_retry_after"
    assert outcome(rec(status=502)) == "http_502"
    assert outcome(completed(error_event="worker failed mid-stream")) == "stream_error_event"
    assert outcome(completed(done=False)) == "stream_broken"
    assert outcome(completed(error="ClientPayloadError: x")) == "stream_broken"
    assert outcome(completed("rag_full", done=False)) == "body_broken"
    assert outcome(completed(usage_tokens=20)) == "short"
    assert outcome(rec(error="timeout after 150 s")) == "timeout"
    assert outcome(rec(error="ClientConnectorError: refused")) == "connection_error"
    assert outcome(completed(error="unfinished", done=False)) == "unfinished"


def test_observed_phase_follows_what_the_client_saw() -> None:
    assert observed_phase(rec()) == "queued"
    assert observed_phase(rec(headers_s=1.0)) == "prefill"
    assert observed_phase(rec(headers_s=1.0, tokens=3)) == "mid_stream"
    assert observed_phase(rec("rag_full")) == "non_streaming"
    assert observed_phase(rec("embed")) == "embed_window"


KILL = KillEvent(killed_s=20.0, restarted_s=21.0, ready_s=70.0, gateway_up_s=71.0)


def test_kill_relation() -> None:
    # open at the kill, first token before it
    assert kill_relation(completed(sent_s=19.0, first_token_s=19.5, end_s=25.0), [KILL], 5) == (
        "streaming_at_kill"
    )
    # a token that reaches the client while the worker is down was produced before the kill
    assert kill_relation(completed(sent_s=19.0, first_token_s=20.02, end_s=20.5), [KILL], 5) == (
        "streaming_at_kill"
    )
    # held in the queue through the outage and served by the new worker: no token at the kill
    assert kill_relation(completed(sent_s=19.0, first_token_s=71.0, end_s=72.0), [KILL], 5) == (
        "in_flight_no_token"
    )
    # open at the kill, no token yet (queued, prefill, non-streaming)
    assert kill_relation(rec(sent_s=19.9, end_s=20.5, status=200), [KILL], 5) == (
        "in_flight_no_token"
    )
    assert kill_relation(rec("rag_full", sent_s=19.0, end_s=None), [KILL], 5) == (
        "in_flight_no_token"
    )
    # sent while down, or within the grace after the gateway saw it up
    assert kill_relation(rec(sent_s=40.0, end_s=40.1), [KILL], 5) == "sent_during_outage"
    assert kill_relation(rec(sent_s=75.5, end_s=76.0), [KILL], 5) == "sent_during_outage"
    assert kill_relation(rec(sent_s=77.0, end_s=78.0), [KILL], 5) == "unaffected"
    assert kill_relation(rec(sent_s=5.0, end_s=6.0), [KILL], 5) == "unaffected"
    # embeddings run on another worker
    assert kill_relation(rec("embed", sent_s=19.0, end_s=21.0), [KILL], 5) == "unaffected"
    # a worker that never came back: everything after the kill is in the outage
    never = KillEvent(killed_s=20.0)
    assert kill_relation(rec(sent_s=500.0, end_s=501.0), [never], 5) == "sent_during_outage"


# ---------------------------------------------------------------- checks


def test_check_status_clean_and_held() -> None:
    clean = {
        "queued": 0,
        "in_flight": 0,
        "queues": {"chat": {"depth": 0}},
        "workers": [{"name": "gen0", "admitted": 0, "in_flight": 0}],
    }
    c = check_status(clean)
    assert c.ok and "no leases object" in c.detail
    held = {
        **clean,
        "queued": 1,
        "workers": [{"name": "gen0", "admitted": 2, "in_flight": 0}],
        "leases": {"open": 3, "queued": 0, "admitted": 2},
    }
    c = check_status(held)
    assert not c.ok
    assert "queued=1" in c.detail and "gen0.admitted=2" in c.detail
    assert "leases.open=3" in c.detail and "leases.admitted=2" in c.detail
    assert check_status({**clean, "leases": {"open": 0, "queued": 0, "admitted": 0}}).ok
    assert not check_status(None).ok


def test_check_vllm_and_memory() -> None:
    assert check_vllm({"gen0": {"running": 0, "waiting": 0}, "emb0": {"running": 0.0}}).ok is False
    assert check_vllm({"gen0": {"running": 0, "waiting": 0}}).ok
    assert not check_vllm({"gen0": {"running": 1, "waiting": 0}}).ok
    assert not check_vllm({"gen0": None}).ok
    assert check_memory(100_000, 109_000, 0.10).ok
    assert check_memory(100_000, 92_000, 0.10).ok
    assert not check_memory(100_000, 111_000, 0.10).ok
    assert not check_memory(None, 100, 0.1).ok


def test_check_no_error_before_streaming() -> None:
    ok = [
        completed(sent_s=19.0, end_s=72.0, first_token_s=71.5),  # held until back, then served
        rec(sent_s=30.0, end_s=30.1, status=503, retry_after="2"),
        # started streaming before the kill: an error event is allowed
        completed(sent_s=19.0, first_token_s=19.2, error_event="broke", end_s=20.1),
        # our own disconnect is not the gateway's error
        rec(sent_s=19.9, end_s=20.5, disconnected="prefill", headers_s=19.95),
        rec(sent_s=1.0, end_s=2.0, status=503, retry_after="2", warmup=True),
    ]
    assert check_no_error_before_streaming(ok, [KILL], 5).ok
    bad = [
        *ok,
        completed(sent_s=19.9, first_token_s=None, tokens=0, error_event="broke", end_s=20.1),
        rec(sent_s=30.0, end_s=30.1, status=503),
        rec(sent_s=30.0, end_s=30.1, status=500),
    ]
    c = check_no_error_before_streaming(bad, [KILL], 5)
    assert not c.ok
    assert "3 of" in c.detail and "stream_error_event=1" in c.detail
    # no kill: nothing to check; kills but no request touched: fails (nothing was tested)
    assert check_no_error_before_streaming(bad, [], 5).ok
    assert not check_no_error_before_streaming([completed(sent_s=1.0, end_s=2.0)], [KILL], 5).ok


def test_check_unaffected_kills_and_disconnects() -> None:
    assert check_unaffected([completed(sent_s=1, end_s=2)], [KILL], 5).ok
    c = check_unaffected(
        [completed(sent_s=1, end_s=2), rec(sent_s=3, end_s=4, status=500)], [KILL], 5
    )
    assert not c.ok and "http_500=1" in c.detail
    assert check_kills([KILL, KILL], 2).ok
    assert not check_kills([KILL, KillEvent(killed_s=90.0, ready_s=None)], 2).ok
    assert not check_kills([KILL], 2).ok
    hits = [rec(disconnected=p) for p in ("queued", "prefill", "mid_stream")]
    assert check_disconnects(hits, ("queued", "prefill", "mid_stream")).ok
    c = check_disconnects(hits, ("queued", "embed_window"))
    assert not c.ok and "missing embed_window" in c.detail
    assert check_disconnects([], ()).ok


# ---------------------------------------------------------------- probes and log


def test_parse_vllm_gauges_sums_label_sets() -> None:
    text = (
        "# HELP vllm:num_requests_running Number of requests\n"
        'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 2.0\n'
        'vllm:num_requests_running{engine="1",model_name="tiny-llama"} 1.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 0.0\n'
        'vllm:num_requests_waiting_by_reason{reason="capacity"} 7.0\n'
    )
    assert parse_vllm_gauges(text) == {"running": 3.0, "waiting": 0.0}
    assert parse_vllm_gauges("") == {}


def test_parse_gateway_counters() -> None:
    text = (
        "# TYPE hearthgate_requests_total counter\n"
        'hearthgate_requests_total{model="tiny-llama",route="/v1/completions",status="200"} 12.0\n'
        'hearthgate_requests_total{model="tiny-llama",route="/v1/completions",status="502"} 0.0\n'
        'hearthgate_rejected_total{cls="rag",reason="disconnected"} 3.0\n'
        'hearthgate_requests_created{model="x"} 1.7e9\n'
    )
    assert parse_gateway_counters(text) == {
        'hearthgate_requests_total{model="tiny-llama",route="/v1/completions",status="200"}': 12.0,
        'hearthgate_rejected_total{cls="rag",reason="disconnected"}': 3.0,
    }


def test_parse_vmrss() -> None:
    text = "Name:\tpython\nVmPeak:\t  9 kB\nVmRSS:\t   81234 kB\nThreads:\t4\n"
    assert parse_vmrss_kb(text) == 81234
    assert parse_vmrss_kb("Name: x\n") is None


def test_summarize_log_groups_by_message() -> None:
    lines = [
        "2026-01-01 10:00:00,123 WARNING hearthgate.proxy: stream from gen0 broke: reset 12",
        "2026-01-01 10:00:01,456 WARNING hearthgate.proxy: stream from gen0 broke: reset 13",
        "2026-01-01 10:00:02,000 INFO hearthgate: fine",
        "2026-01-01 10:00:03,000 ERROR hearthgate: unexpected error on /v1/completions",
        "Traceback (most recent call last):",
    ]
    got = dict(summarize_log(lines))
    assert got["WARNING hearthgate.proxy: stream from gen0 broke: reset N"] == 2
    assert got["ERROR hearthgate: unexpected error on /v1/completions"] == 1
    assert got["Traceback (most recent call last)"] == 1
    assert len(got) == 3


# ---------------------------------------------------------------- tables and report


def test_tables() -> None:
    records = [
        completed(),
        completed("embed"),
        rec(disconnected="queued", planned="queued"),
        completed(planned="mid_stream"),  # finished before the planned moment
        rec(sent_s=30.0, end_s=30.1, status=503, retry_after="2"),
    ]
    rows = outcome_table(records)
    assert rows[0] == [
        "kind",
        "completed",
        "disconnected:queued",
        "http_503_retry_after",
        "total",
    ]
    assert rows[-1] == ["**all**", "3", "1", "1", "5"]
    rel = {r[0]: r for r in relation_table(records, [KILL], 5)[1:]}
    assert rel["sent_during_outage"][-1] == "1"
    dis = disconnect_table(records)
    assert dis[0][:2] == ["planned \\ observed", "queued"]
    assert any("not disconnected (completed)" in c for c in dis[0])


def test_render_report() -> None:
    records = [completed(), rec(sent_s=30.0, end_s=30.1, status=500, error="HTTP 500: boom")]
    checks = [
        Check("a check", True, "fine"),
        Check("b check", False, "1 of 2: http_500=1"),
    ]
    result = SoakResult(
        command="hearthgate bench chaos --duration 60",
        started="2026-01-01 10:00:00 UTC",
        seed=1,
        params={"duration_s": 60, "warmup_s": 5, "chat/s": 2.0},
        layout={"gateway": "core 1"},
        records=records,
        kills=[KILL],
        checks=checks,
        rss_warm_kb=100 * 1024,
        rss_end_kb=102 * 1024,
        rss_samples=[(1.0, 100 * 1024), (6.0, 104 * 1024)],
        status_end={"queued": 0, "in_flight": 0, "workers": [{"name": "gen0", "admitted": 0}]},
        gauges_end={"gen0": {"running": 0.0, "waiting": 0.0}, "emb0": None},
        settle_s=5.5,
        log_summary=[("WARNING x: y", 3)],
        gateway_counters={'hearthgate_rejected_total{cls="rag",reason="disconnected"}': 2.0},
    )
    assert not result.ok
    text = render(result)
    assert text.startswith("# Chaos soak: FAIL")
    assert "`hearthgate bench chaos --duration 60`" in text
    assert "| b check | **FAIL** | 1 of 2: http_500=1 |" in text
    assert "100.0 MiB" in text and "102.0 MiB" in text and "max 104.0 MiB" in text
    assert "HTTP 500: boom" in text  # the problem examples
    assert "emb0: unreachable" in text
    assert "| 3 | WARNING x: y |" in text
    assert '| `hearthgate_rejected_total{cls="rag",reason="disconnected"}` | 2 |' in text
    assert json.loads(json.dumps(result.to_json()))["ok"] is False


# ---------------------------------------------------------------- plan and bodies


def test_plan_is_deterministic_and_shaped() -> None:
    shape = LoadShape(chat_rate=5, rag_rate=2, embed_rate=1, embed_group=4, rag_burst_every_s=0.0)
    shape = LoadShape(**{**shape.__dict__, "disconnect_fraction": 0.5})
    a = plan_arrivals(shape, 60, seed=7)
    assert a == plan_arrivals(shape, 60, seed=7)
    assert a != plan_arrivals(shape, 60, seed=8)
    assert [p.at_s for p in a] == sorted(p.at_s for p in a)
    assert len({p.id for p in a}) == len(a)
    kinds = {k: sum(p.kind == k for p in a) for k in ("chat", "rag_stream", "rag_full", "embed")}
    assert 200 < kinds["chat"] < 400 and 60 < kinds["rag_stream"] + kinds["rag_full"] < 180
    assert kinds["embed"] % 4 == 0
    cut = [p for p in a if p.disconnect]
    assert 0.35 < len(cut) / len(a) < 0.65
    for p in cut:
        assert p.disconnect in KIND_PHASES[p.kind]
        if p.disconnect == "mid_stream":
            assert 1 <= p.after_tokens < shape.output_tokens
        elif p.disconnect == "embed_window":
            assert 0 <= p.delay_s <= shape.embed_within_s
    assert not any(p.disconnect for p in plan_arrivals(shape, 60, seed=7, disconnects=False))
    # a later start of ids, and the same times
    b = plan_arrivals(shape, 60, seed=7, first_id=1000)
    assert [p.id - 1000 for p in b] == [p.id for p in a]


def test_rag_bursts_plan_queued_disconnects() -> None:
    shape = LoadShape(
        chat_rate=0,
        rag_rate=0,
        embed_rate=0,
        voice_rate=0,
        rag_burst_every_s=10.0,
        rag_burst_size=4,
        disconnect_fraction=0.0,
    )
    plan = plan_arrivals(shape, 60, seed=2)
    assert [p.at_s for p in plan[::4]] == [5.0, 15.0, 25.0, 35.0, 45.0, 55.0]
    for i in range(0, len(plan), 4):
        group = plan[i : i + 4]
        assert len({p.at_s for p in group}) == 1
        assert [p.kind for p in group] == ["rag_stream"] * 3 + ["rag_full"]
        assert [p.disconnect for p in group] == [None, None, "queued", "non_streaming"]
        assert all(0.05 <= p.delay_s <= shape.queued_within_s for p in group[2:])
    assert not any(p.disconnect for p in plan_arrivals(shape, 60, seed=2, disconnects=False))


def test_request_bodies() -> None:
    shape = LoadShape()
    path, body = request_for(Planned(1, 0.0, "chat", text_seed=3), shape)
    assert path == "/v1/chat/completions"
    assert body["stream"] is True and body["ignore_eos"] is True and body["max_tokens"] == 48
    assert body["stream_options"] == {"include_usage": True}
    assert 20 <= len(body["messages"][0]["content"].split()) <= 40
    path, body = request_for(Planned(2, 0.0, "rag_full", text_seed=3), shape)
    assert path == "/v1/completions" and body["stream"] is False
    assert len(body["prompt"].split()) == 600 and "stream_options" not in body
    path, body = request_for(Planned(3, 0.0, "embed", text_seed=3), shape)
    assert path == "/v1/embeddings" and body["model"] == "minilm"
    assert 1 <= len(body["input"]) <= 3
    burst = kill_burst(500, 0.0, seed=1)
    assert [p.id for p in burst] == [500, 501, 502, 503, 504, 505] and all(p.burst for p in burst)
    assert is_token_event({"choices": [{"text": "a"}]})
    assert not is_token_event({"choices": [{"delta": {"role": "assistant"}}]})
    assert is_token_event({"choices": [{"delta": {"role": "assistant", "content": "x"}}]})
    assert not is_token_event({"choices": [], "usage": {"completion_tokens": 3}})


def test_cli_parses_into_config(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        [
            "chaos",
            "--duration",
            "90",
            "--kills",
            "1",
            "--kill-at",
            "15",
            "--seed",
            "4",
            "--disconnect-fraction",
            "0.4",
            "--gateway-core",
            "-1",
            "--out",
            str(tmp_path / "r.md"),
        ]
    )
    cfg = config_from_args(args, "cmd")
    assert cfg.duration_s == 90 and cfg.kills == 1 and cfg.kill_at_s == (15.0,)
    assert cfg.seed == 4 and cfg.shape.disconnect_fraction == 0.4
    assert cfg.gateway_core is None and cfg.command == "cmd"
    assert cfg.kill_times() == [15.0]
    assert SoakConfig(duration_s=300, kills=2).kill_times() == [100.0, 200.0]
    settings = soak_settings("http://127.0.0.1:1", "http://127.0.0.1:2")
    from hearthgate.gateway.settings import Settings

    Settings(**settings)  # valid settings


# ---------------------------------------------------------------- the client's disconnects


class Fake:
    """A tiny upstream: holds the headers ``queue_s``, then waits ``prefill_s``, then sends
    ``tokens`` events ``gap_s`` apart; records which requests the client left early."""

    def __init__(self) -> None:
        self.queue_s = 0.0
        self.prefill_s = 0.0
        self.gap_s = 0.0
        self.tokens = 48
        self.gone: list[str] = []

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        try:
            await asyncio.sleep(self.queue_s)
            if not body.get("stream"):
                await asyncio.sleep(self.prefill_s)
                usage = {"completion_tokens": body["max_tokens"]}
                return web.json_response({"choices": [{"text": "x"}], "usage": usage})
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await asyncio.sleep(self.prefill_s)
            for _ in range(self.tokens):
                await resp.write(b'data: {"choices": [{"text": "a"}]}\n\n')
                await asyncio.sleep(self.gap_s)
            usage = {"choices": [], "usage": {"completion_tokens": self.tokens}}
            await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
            return resp
        except (asyncio.CancelledError, ConnectionResetError):
            self.gone.append(request.path)
            raise

    async def embeddings(self, request: web.Request) -> web.Response:
        try:
            await asyncio.sleep(self.queue_s)
        except asyncio.CancelledError:
            self.gone.append(request.path)
            raise
        return web.json_response({"data": [{"embedding": [0.0]}]})


@pytest.fixture
async def fake() -> AsyncIterator[tuple[Fake, str]]:
    f = Fake()
    app = web.Application(handler_args={"handler_cancellation": True})
    app.router.add_post("/v1/completions", f.completions)
    app.router.add_post("/v1/chat/completions", f.completions)
    app.router.add_post("/v1/embeddings", f.embeddings)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def _send(
    url: str, p: Planned, r: RequestLog | None = None, where: str | None = None
) -> RequestLog:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    shape = LoadShape()
    r = r if r is not None else new_log(p, 0.0, shape)
    asked: list[str] = []

    async def probe(kind: str) -> str | None:
        asked.append(kind)
        return where

    async with aiohttp.ClientSession() as session:
        await send(session, url, p, r, shape, lambda: loop.time() - t0, 10.0, probe)
    assert len(asked) <= 1
    return r


async def _wait_gone(f: Fake, n: int) -> None:
    for _ in range(500):  # up to 5 s: a busy CI box is slow to see a connection close
        if len(f.gone) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the server saw {len(f.gone)} disconnects, not {n}")


async def test_send_completes(fake: tuple[Fake, str]) -> None:
    f, url = fake
    r = await _send(url, Planned(1, 0.0, "rag_stream"))
    assert outcome(r) == "completed" and r.tokens == 48 and r.usage_tokens == 48
    r = await _send(url, Planned(2, 0.0, "rag_full"))
    assert outcome(r) == "completed"
    r = await _send(url, Planned(3, 0.0, "embed"))
    assert outcome(r) == "completed"
    assert f.gone == []


@pytest.mark.parametrize(
    ("kind", "phase", "delay", "after"),
    [
        ("chat", "queued", 0.05, 0),
        ("rag_stream", "prefill", 0.02, 0),
        ("chat", "mid_stream", 0.0, 5),
        ("rag_full", "non_streaming", 0.05, 0),
        ("embed", "embed_window", 0.02, 0),
    ],
)
async def test_send_disconnects_at_the_planned_phase(
    fake: tuple[Fake, str], kind: str, phase: str, delay: float, after: int
) -> None:
    f, url = fake
    f.queue_s = 0.3 if phase in ("queued", "embed_window") else 0.0
    f.prefill_s = 0.3 if phase in ("prefill", "non_streaming") else 0.0
    f.gap_s = 0.02
    r = await _send(url, Planned(1, 0.0, kind, phase, delay, after))
    assert r.disconnected == phase and outcome(r) == f"disconnected:{phase}"
    if phase == "mid_stream":
        assert r.tokens == after
    await _wait_gone(f, 1)


@pytest.mark.parametrize("where", ["queued", "prefill", None])
async def test_send_before_the_first_byte_asks_where_the_request_is(
    fake: tuple[Fake, str], where: str | None
) -> None:
    f, url = fake
    f.queue_s = 0.5  # like a gateway that answers a stream only with its first event
    r = await _send(url, Planned(1, 0.0, "rag_stream", "prefill", 0.05), where=where)
    assert r.disconnected == (where or "queued")
    await _wait_gone(f, 1)


async def test_send_prefill_disconnect_at_the_first_token_at_the_latest(
    fake: tuple[Fake, str],
) -> None:
    f, url = fake
    f.gap_s = 0.05
    r = await _send(url, Planned(1, 0.0, "chat", "prefill", 1.0))
    assert r.disconnected == "mid_stream" and r.tokens == 1
    await _wait_gone(f, 1)


async def test_send_planned_disconnect_after_the_answer_is_no_disconnect(
    fake: tuple[Fake, str],
) -> None:
    f, url = fake
    r = await _send(url, Planned(1, 0.0, "rag_full", "non_streaming", 1.0))
    assert r.disconnected is None and outcome(r) == "completed"
    assert f.gone == []


async def test_send_cancelled_from_outside_is_unfinished(fake: tuple[Fake, str]) -> None:
    f, url = fake
    f.prefill_s = 5.0
    p = Planned(1, 0.0, "rag_stream")
    r = new_log(p, 0.0, LoadShape())
    task = asyncio.create_task(_send(url, p, r))
    # The stream's headers arrived: the server holds the request in its 5 s prefill.
    await until(lambda: r.headers_s is not None or task.done())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert outcome(r) == "unfinished" and r.disconnected is None
    await _wait_gone(f, 1)


def test_voice_turns_are_streamed_responses_and_leave_the_other_plans_alone() -> None:
    from hearthgate.loadtests.chaos_client import request_for

    shape = LoadShape(disconnect_fraction=0.0)
    plan = plan_arrivals(shape, 60, seed=3)
    voice = [p for p in plan if p.kind == "voice"]
    assert voice and all(p.stream for p in voice)
    path, body = request_for(voice[0], shape)
    assert path == "/v1/responses" and body["stream"] and body["input"]
    # The other kinds' arrivals are those of a plan without voice turns.
    quiet = plan_arrivals(LoadShape(disconnect_fraction=0.0, voice_rate=0), 60, seed=3)
    assert [p.at_s for p in plan if p.kind != "voice"] == [p.at_s for p in quiet]
