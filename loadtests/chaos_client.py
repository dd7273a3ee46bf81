"""Chaos soak, the client side: the planned arrivals and one request with a planned disconnect.

The plan is pure and seeded (``plan_arrivals``): Poisson arrivals per kind, and for a chosen
fraction of them a disconnect phase and the moment inside it. ``send`` runs one planned
request with aiohttp and, when a disconnect is planned, cancels the client task at that
moment; aiohttp then closes the connection (an unfinished response is never returned to the
pool), which is what a client going away looks like to the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from hearthgate.loadtests.chaos_outcomes import KIND_PHASES, RequestLog, observed_phase
from hearthgate.loadtests.prompts import build_text

GEN_MODEL = "tiny-llama"
EMBED_MODEL = "minilm"
CHAT_WORDS = (20, 40)
RAG_WORDS = 600
EMBED_WORDS = (8, 20)
_ERROR_LIMIT = 200


@dataclass(frozen=True)
class LoadShape:
    """Arrival rates (per second) and the request shapes of the soak."""

    chat_rate: float = 2.0
    rag_rate: float = 0.6  # half streaming, half not
    embed_rate: float = 0.5  # groups per second; a group arrives at once, so it coalesces
    voice_rate: float = 0.5  # streamed Responses API turns
    embed_group: int = 6
    output_tokens: int = 48
    # Every so often several long prompts at once (a notes app indexing documents): past the
    # gateway's RAG cap of two the last ones wait in its queue, and two of them are planned
    # to leave there: a streaming one and a non-streaming one. 0: no such groups.
    rag_burst_every_s: float = 30.0
    rag_burst_size: int = 4
    disconnect_fraction: float = 0.25
    # The random moments to disconnect at, in seconds from sending: queued (up to),
    # prefill (a range per kind: after the gateway forwarded the request, before the first
    # token would come), non-streaming (up to), embeddings (up to, inside the coalescing
    # window's minimum wait of the soak's settings). The prefill ranges end below the
    # fastest first tokens of the e2e soak on the tiny model (chat 12 ms, p10 16 ms; RAG 52
    # ms): with wider ones (up to 80 / 300 ms) most prefill disconnects came after the first
    # token, and a CI run whose outage took most of the load saw none at all.
    queued_within_s: float = 0.5
    chat_prefill_s: tuple[float, float] = (0.003, 0.012)
    rag_prefill_s: tuple[float, float] = (0.01, 0.045)
    non_streaming_within_s: float = 2.0
    embed_within_s: float = 0.02


@dataclass(frozen=True)
class Planned:
    """One request to send at ``at_s`` (seconds from the start of its phase of the run)."""

    id: int
    at_s: float
    kind: str
    disconnect: str | None = None
    delay_s: float = 0.0  # for queued, prefill, non_streaming and embed_window disconnects
    after_tokens: int = 0  # for mid_stream disconnects
    text_seed: int = 0
    burst: bool = False

    @property
    def stream(self) -> bool:
        return self.kind in ("chat", "rag_stream", "voice")


def _poisson(rate: float, horizon_s: float, rng: random.Random) -> list[float]:
    out: list[float] = []
    if rate <= 0:
        return out
    t = rng.expovariate(rate)
    while t < horizon_s:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def with_disconnect(p: Planned, shape: LoadShape, rng: random.Random) -> Planned:
    """``p`` with a disconnect phase and moment drawn for its kind."""
    phase = rng.choice(KIND_PHASES[p.kind])
    delay = 0.0
    after = 0
    if phase == "queued":
        delay = rng.uniform(0.0, shape.queued_within_s)
    elif phase == "prefill":
        short = p.kind in ("chat", "voice")
        delay = rng.uniform(*(shape.chat_prefill_s if short else shape.rag_prefill_s))
    elif phase == "mid_stream":
        after = rng.randint(1, max(1, shape.output_tokens - 1))
    elif phase == "non_streaming":
        delay = rng.uniform(0.0, shape.non_streaming_within_s)
    else:
        delay = rng.uniform(0.0, shape.embed_within_s)
    return Planned(p.id, p.at_s, p.kind, phase, round(delay, 4), after, p.text_seed, burst=p.burst)


def plan_arrivals(
    shape: LoadShape, horizon_s: float, seed: int, *, disconnects: bool = True, first_id: int = 0
) -> list[Planned]:
    """Every arrival up to ``horizon_s``, in time order (ties by id). Deterministic for a
    seed; each kind has its own generator, so changing one rate leaves the others alone."""
    base = random.Random(seed)
    kinds = ("chat", "rag", "embed", "cut", "voice")  # new kinds last: older plans stay
    streams = {k: random.Random(base.getrandbits(64)) for k in kinds}
    raw: list[tuple[float, str]] = []
    raw += [(t, "chat") for t in _poisson(shape.chat_rate, horizon_s, streams["chat"])]
    for t in _poisson(shape.rag_rate, horizon_s, streams["rag"]):
        raw.append((t, "rag_stream" if streams["rag"].random() < 0.5 else "rag_full"))
    for t in _poisson(shape.embed_rate, horizon_s, streams["embed"]):
        raw += [(t, "embed")] * shape.embed_group
    raw += [(t, "voice") for t in _poisson(shape.voice_rate, horizon_s, streams["voice"])]
    every = shape.rag_burst_every_s
    t = every / 2
    while every > 0 and t < horizon_s:
        plain = max(0, shape.rag_burst_size - 2)
        raw += [(t, "rag_stream")] * plain + [(t, "queued:rag_stream"), (t, "queued:rag_full")]
        t += every
    raw.sort(key=lambda x: x[0])  # stable: a group keeps its order
    cut = streams["cut"]
    out: list[Planned] = []
    for i, (at, kind) in enumerate(raw):
        queued, _, kind = kind.rpartition(":")
        p = Planned(first_id + i, round(at, 4), kind, text_seed=cut.getrandbits(32))
        if queued:
            if disconnects:
                phase = "queued" if kind == "rag_stream" else "non_streaming"
                delay = round(cut.uniform(0.05, shape.queued_within_s), 4)
                p = Planned(p.id, p.at_s, kind, phase, delay, 0, p.text_seed)
        elif disconnects and cut.random() < shape.disconnect_fraction:
            p = with_disconnect(p, shape, cut)
        out.append(p)
    return out


def kill_burst(first_id: int, at_s: float, seed: int) -> list[Planned]:
    """Requests sent just before a kill so that some are queued or in prefill when the
    worker dies: three long streaming prompts (past the soak's RAG cap of two: one waits in
    the gateway's queue), a long non-streaming one, two chats."""
    kinds = ("rag_stream", "rag_stream", "rag_stream", "rag_full", "chat", "chat")
    rng = random.Random(seed)
    return [
        Planned(first_id + i, at_s, k, text_seed=rng.getrandbits(32), burst=True)
        for i, k in enumerate(kinds)
    ]


def request_for(p: Planned, shape: LoadShape) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) of a planned request."""
    rng = random.Random(p.text_seed)
    if p.kind == "embed":
        n = rng.randint(1, 3)
        inputs = [build_text(rng.randint(*EMBED_WORDS), rng) for _ in range(n)]
        return "/v1/embeddings", {"model": EMBED_MODEL, "input": inputs}
    gen: dict[str, Any] = {
        "model": GEN_MODEL,
        "max_tokens": shape.output_tokens,
        "ignore_eos": True,
        "stream": p.stream,
    }
    if p.stream:
        gen["stream_options"] = {"include_usage": True}
    if p.kind == "chat":
        text = build_text(rng.randint(*CHAT_WORDS), rng)
        return "/v1/chat/completions", {**gen, "messages": [{"role": "user", "content": text}]}
    if p.kind == "voice":
        text = build_text(rng.randint(*CHAT_WORDS), rng)
        body = {"model": GEN_MODEL, "input": text, "max_output_tokens": shape.output_tokens}
        return "/v1/responses", {**body, "ignore_eos": True, "stream": True}
    return "/v1/completions", {**gen, "prompt": build_text(RAG_WORDS, rng)}


def new_log(p: Planned, sent_s: float, shape: LoadShape, warmup: bool = False) -> RequestLog:
    return RequestLog(
        id=p.id,
        kind=p.kind,
        stream=p.stream,
        expected_tokens=0 if p.kind == "embed" else shape.output_tokens,
        sent_s=round(sent_s, 4),
        planned=p.disconnect,
        burst=p.burst,
        warmup=warmup,
    )


# ---------------------------------------------------------------- one exchange


def _error_text(body: bytes) -> str:
    try:
        obj = json.loads(body)
    except ValueError:
        return body[:_ERROR_LIMIT].decode("utf-8", "replace")
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict):
        return str(err.get("message", err))[:_ERROR_LIMIT]
    return str(obj)[:_ERROR_LIMIT]


def is_token_event(obj: Mapping[str, Any]) -> bool:
    """A stream event that carries a token (not the chat role header, not the usage event)."""
    choices = obj.get("choices")
    if not choices or not isinstance(choices[0], dict):
        return False
    delta = choices[0].get("delta")
    if isinstance(delta, dict) and "role" in delta:
        return any(v for k, v in delta.items() if k != "role")
    return True


class _Exchange:
    """One HTTP exchange filling a RequestLog; ``headers`` and ``reached`` are set when the
    response headers arrive and when ``after_tokens`` tokens have."""

    def __init__(self, rec: RequestLog, clock: Callable[[], float], after_tokens: int) -> None:
        self.rec = rec
        self.clock = clock
        self.after_tokens = after_tokens
        self.headers = asyncio.Event()
        self.reached = asyncio.Event()

    def _event(self, payload: bytes) -> None:
        rec = self.rec
        if payload == b"[DONE]":
            rec.done = True
            return
        try:
            obj = json.loads(payload)
        except ValueError:
            rec.error = f"bad stream event: {payload[:80]!r}"
            return
        if not isinstance(obj, dict):
            return
        if isinstance(obj.get("type"), str):  # the Responses API's named events
            self._response_event(obj)
            return
        if "error" in obj and not obj.get("choices"):
            err = obj["error"]
            rec.error_event = str(err.get("message", err) if isinstance(err, dict) else err)[
                :_ERROR_LIMIT
            ]
            return
        if is_token_event(obj):
            self._token()
        usage = obj.get("usage")
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            rec.usage_tokens = int(usage["completion_tokens"])

    def _response_event(self, obj: Mapping[str, Any]) -> None:
        rec, kind = self.rec, obj["type"]
        if kind == "response.output_text.delta":
            self._token()
        elif kind in ("response.completed", "response.incomplete"):
            rec.done = True
            response = obj.get("response")
            usage = response.get("usage") if isinstance(response, dict) else None
            if isinstance(usage, dict) and usage.get("output_tokens") is not None:
                rec.usage_tokens = int(usage["output_tokens"])
        elif kind in ("error", "response.failed"):
            rec.error_event = str(obj.get("message") or obj)[:_ERROR_LIMIT]

    def _token(self) -> None:
        rec = self.rec
        rec.tokens += 1
        if rec.first_token_s is None:
            rec.first_token_s = round(self.clock(), 4)
        if self.after_tokens and rec.tokens >= self.after_tokens:
            self.reached.set()

    async def _read_stream(self, resp: aiohttp.ClientResponse) -> None:
        buf = b""
        async for data in resp.content.iter_any():
            buf += data
            *lines, buf = buf.split(b"\n")
            for line in lines:
                line = line.strip()
                if line.startswith(b"data:"):
                    self._event(line[5:].strip())
        if buf.strip().startswith(b"data:"):
            self._event(buf.strip()[5:].strip())

    async def run(
        self, session: aiohttp.ClientSession, url: str, body: dict[str, Any], timeout_s: float
    ) -> None:
        rec = self.rec
        try:
            async with session.post(
                url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                rec.status = resp.status
                rec.retry_after = resp.headers.get("Retry-After")
                rec.headers_s = round(self.clock(), 4)
                self.headers.set()
                if resp.status != 200:
                    rec.error = f"HTTP {resp.status}: {_error_text(await resp.read())}"
                elif rec.stream:
                    await self._read_stream(resp)
                else:
                    data = await resp.read()
                    obj = json.loads(data)
                    usage = obj.get("usage") if isinstance(obj, dict) else None
                    if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
                        rec.usage_tokens = int(usage["completion_tokens"])
                    rec.done = isinstance(obj, dict) and bool(obj.get("choices") or obj.get("data"))
        except TimeoutError:
            rec.error = f"timeout after {timeout_s:g} s"
        except (aiohttp.ClientError, OSError, ValueError) as err:
            rec.error = f"{type(err).__name__}: {err}"[:_ERROR_LIMIT]
        finally:
            if rec.end_s is None:
                rec.end_s = round(self.clock(), 4)


Where = Callable[[str], Awaitable[str | None]]
"""Asked, just before a client leaves before the first byte, where a request of this kind
is: ``queued`` or ``prefill`` (None: unknown). The driver answers from the gateway's
``/status`` (is anything of the request's class queued?)."""


async def send(
    session: aiohttp.ClientSession,
    base_url: str,
    p: Planned,
    rec: RequestLog,
    shape: LoadShape,
    clock: Callable[[], float],
    timeout_s: float,
    where: Where | None = None,
) -> RequestLog:
    """Send ``p``, disconnecting as planned; ``rec`` is filled in place and returned.
    Cancelling this coroutine cancels the request too (recorded as ``unfinished``)."""
    path, body = request_for(p, shape)
    after = {"mid_stream": p.after_tokens, "prefill": 1}.get(p.disconnect or "", 0)
    ex = _Exchange(rec, clock, after)
    task = asyncio.create_task(ex.run(session, base_url + path, body, timeout_s))
    try:
        if p.disconnect is not None:
            await _until_moment(p, ex, task)
            if not task.done():
                phase = observed_phase(rec)
                if phase == "queued" and where is not None:
                    # The client cannot see whether the gateway holds the request or has
                    # forwarded it (a stream answers only with its first event): ask.
                    phase = await where(p.kind) or phase
                    if task.done() or rec.headers_s is not None:
                        phase = observed_phase(rec)
                if not task.done():
                    rec.disconnected = phase
                    rec.end_s = round(clock(), 4)
                    task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                raise  # cancelled from outside, not by our planned disconnect
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if task.cancelled() and rec.disconnected is None:
            rec.error = "unfinished"  # the run ended (or was stopped) before the answer
    return rec


async def _until_moment(p: Planned, ex: _Exchange, task: asyncio.Task[None]) -> None:
    """Wait until the planned disconnect moment, or until the request finished. A prefill
    disconnect comes at its moment or at the first token, whichever is first."""
    if p.disconnect in ("mid_stream", "prefill"):
        timeout = p.delay_s if p.disconnect == "prefill" else None
        waiter = asyncio.ensure_future(ex.reached.wait())
        try:
            await asyncio.wait({task, waiter}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
    else:
        await asyncio.wait({task}, timeout=p.delay_s)
