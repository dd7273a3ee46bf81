"""Chaos soak, the pure part: what happened to each request and the end-state checks.

No I/O and no clock here: the driver (``loadtests/chaos_driver.py``) fills ``RequestLog``
values as requests run; ``loadtests/chaos_report.py`` renders the result.

A request's *outcome* is one label (``outcome``). Its *relation to a worker kill*
(``kill_relation``) says whether it had started streaming when the generation worker died,
was in flight (queued, in prefill, waiting for a non-streaming answer) without a token yet,
was sent while the worker was down, or was not affected. The soak's rule: a request that had
not started streaming when the worker died ends, as the client sees it, either completed
(failed over, or held until the worker was back) or with 503 and ``Retry-After``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# voice: a streamed turn of OpenAI's Responses API (Home Assistant's conversation agent).
KINDS = ("chat", "rag_stream", "rag_full", "embed", "voice")
GEN_KINDS = frozenset({"chat", "rag_stream", "rag_full", "voice"})
PHASES = ("queued", "prefill", "mid_stream", "non_streaming", "embed_window")
# The phases at which each kind of request may be disconnected.
KIND_PHASES: Mapping[str, tuple[str, ...]] = {
    "chat": ("queued", "prefill", "mid_stream"),
    "rag_stream": ("queued", "prefill", "mid_stream"),
    "rag_full": ("non_streaming",),
    "embed": ("embed_window",),
    "voice": ("queued", "prefill", "mid_stream"),
}
RELATIONS = ("in_flight_no_token", "sent_during_outage", "streaming_at_kill", "unaffected")
ACCEPTABLE_WITHOUT_TOKEN = frozenset({"completed", "http_503_retry_after"})


@dataclass
class RequestLog:
    """One request as the client saw it. Times are seconds from the start of the run."""

    id: int
    kind: str
    stream: bool
    expected_tokens: int
    sent_s: float
    planned: str | None = None  # the disconnect phase planned, if any
    disconnected: str | None = None  # the phase observed when the client went away
    burst: bool = False  # sent in the burst just before a kill
    warmup: bool = False
    headers_s: float | None = None
    first_token_s: float | None = None
    tokens: int = 0  # token events received (streams)
    usage_tokens: int | None = None  # completion tokens from the answer's usage
    done: bool = False  # the answer was complete ([DONE], or the whole JSON body)
    status: int | None = None
    retry_after: str | None = None
    error_event: str | None = None  # message of an error event inside a stream
    error: str | None = None  # transport error, timeout, or an HTTP error's message
    end_s: float | None = None


@dataclass(frozen=True)
class KillEvent:
    """One SIGKILL of the generation worker and its recovery (seconds from run start)."""

    killed_s: float
    restarted_s: float | None = None  # the new process was started
    ready_s: float | None = None  # the new worker answered /v1/models
    gateway_up_s: float | None = None  # the gateway's /status reported it up again
    in_flight_at_kill: int = 0  # requests of ours not finished at the kill
    no_token_at_kill: int = 0  # ...of them, generation requests without a token yet


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def observed_phase(rec: RequestLog) -> str:
    """Where a request was when its client went away, as the client can tell."""
    if rec.kind == "embed":
        return "embed_window"
    if not rec.stream:
        return "non_streaming"
    if rec.headers_s is None:
        return "queued"
    return "prefill" if rec.tokens == 0 else "mid_stream"


def outcome(rec: RequestLog) -> str:
    """One label for how the request ended, as its client saw it."""
    if rec.disconnected is not None:
        return f"disconnected:{rec.disconnected}"
    if rec.error == "unfinished":
        return "unfinished"
    if rec.status is None:
        if rec.error and "timeout" in rec.error.lower():
            return "timeout"
        return "connection_error"
    if rec.status != 200:
        if rec.status in (429, 503):
            return f"http_{rec.status}_" + ("retry_after" if rec.retry_after else "no_retry_after")
        return f"http_{rec.status}"
    if rec.error_event is not None:
        return "stream_error_event"
    if rec.error is not None:
        if "timeout" in rec.error.lower():
            return "timeout"
        return "stream_broken" if rec.stream else "body_broken"
    if not rec.done:
        return "stream_broken" if rec.stream else "body_broken"
    if rec.expected_tokens and rec.usage_tokens is not None:
        if rec.usage_tokens != rec.expected_tokens:
            return "short"
    elif rec.expected_tokens and rec.stream and rec.tokens == 0:
        return "short"
    return "completed"


def kill_relation(rec: RequestLog, kills: Sequence[KillEvent], grace_s: float) -> str:
    """How a generation request relates to the worker kills (embeddings: ``unaffected``).

    ``streaming_at_kill``: open at a kill, its stream had begun: its first token reached the
    client before the worker was ready again (there is one generation worker, so a token
    that arrives while it is down was produced before the kill and was in transit);
    ``in_flight_no_token``: sent before a kill, open at it, no token yet (queued, in
    prefill, non-streaming); ``sent_during_outage``: sent after a kill and before the gateway
    saw the worker up again (plus ``grace_s``).
    """
    if rec.kind not in GEN_KINDS:
        return "unaffected"
    end = rec.end_s if rec.end_s is not None else float("inf")
    relation = "unaffected"
    for k in kills:
        if rec.sent_s <= k.killed_s <= end:
            ready = k.ready_s if k.ready_s is not None else float("inf")
            if rec.first_token_s is not None and rec.first_token_s <= ready:
                return "streaming_at_kill"
            relation = "in_flight_no_token"
        elif relation == "unaffected":
            back = k.gateway_up_s if k.gateway_up_s is not None else k.ready_s
            until = float("inf") if back is None else back + grace_s
            if k.killed_s < rec.sent_s <= until:
                relation = "sent_during_outage"
    return relation


# ---------------------------------------------------------------- checks


def check_status(status: Mapping[str, Any] | None) -> Check:
    """Nothing queued, admitted or in flight in the gateway's ``/status`` (and, when the
    gateway reports leases, none open, queued or admitted)."""
    name = "gateway /status: nothing queued, admitted or in flight"
    if status is None:
        return Check(name, False, "/status did not answer")
    held: list[str] = []
    for key in ("queued", "in_flight"):
        if status.get(key):
            held.append(f"{key}={status[key]}")
    for w in status.get("workers") or []:
        for key in ("admitted", "in_flight"):
            if w.get(key):
                held.append(f"{w.get('name')}.{key}={w[key]}")
    leases = status.get("leases")
    if isinstance(leases, Mapping):
        for key in ("open", "queued", "admitted"):
            if leases.get(key):
                held.append(f"leases.{key}={leases[key]}")
    for cls, q in (status.get("queues") or {}).items():
        if isinstance(q, Mapping) and q.get("depth"):
            held.append(f"queues.{cls}.depth={q['depth']}")
    lease_note = "" if isinstance(leases, Mapping) else " (no leases object reported)"
    if held:
        return Check(name, False, ", ".join(held) + lease_note)
    return Check(name, True, "all zero" + lease_note)


def check_vllm(gauges: Mapping[str, Mapping[str, float] | None]) -> Check:
    """Every worker's ``vllm:num_requests_running`` and ``..._waiting`` are 0."""
    name = "vLLM running and waiting gauges at 0"
    bad: list[str] = []
    parts: list[str] = []
    for worker, g in gauges.items():
        if g is None:
            bad.append(f"{worker}: /metrics did not answer")
            continue
        running, waiting = g.get("running"), g.get("waiting")
        parts.append(f"{worker}: running={_num(running)} waiting={_num(waiting)}")
        if running is None or waiting is None:
            bad.append(f"{worker}: gauge missing")
        elif running or waiting:
            bad.append(f"{worker}: running={_num(running)} waiting={_num(waiting)}")
    return Check(name, not bad, "; ".join(bad or parts))


def check_memory(warm_kb: int | None, end_kb: int | None, tolerance: float) -> Check:
    """Gateway RSS at the end within ``tolerance`` (a fraction) of the RSS after warm-up."""
    name = f"gateway RSS within {100 * tolerance:.0f}% of warm-up"
    if not warm_kb or end_kb is None:
        return Check(name, False, "RSS not sampled")
    change = (end_kb - warm_kb) / warm_kb
    detail = f"{warm_kb / 1024:.1f} MiB -> {end_kb / 1024:.1f} MiB ({100 * change:+.1f}%)"
    return Check(name, abs(change) <= tolerance, detail)


def check_no_error_before_streaming(
    records: Iterable[RequestLog], kills: Sequence[KillEvent], grace_s: float
) -> Check:
    """No client-visible error for a generation request that had not started streaming when
    the worker died, or was sent while it was down: completed, or 503 with Retry-After."""
    name = "no error for requests not yet streaming at a kill (completed or 503+Retry-After)"
    seen = 0
    bad: Counter[str] = Counter()
    for r in records:
        if r.warmup or r.disconnected is not None:
            continue
        if kill_relation(r, kills, grace_s) not in ("in_flight_no_token", "sent_during_outage"):
            continue
        seen += 1
        o = outcome(r)
        if o not in ACCEPTABLE_WITHOUT_TOKEN:
            bad[o] += 1
    if not kills:
        return Check(name, True, "no kill in this run")
    if bad:
        return Check(name, False, f"{sum(bad.values())} of {seen}: {_counts(bad)}")
    return Check(name, seen > 0, f"{seen} requests, all acceptable" if seen else "none seen")


def check_unaffected(
    records: Iterable[RequestLog], kills: Sequence[KillEvent], grace_s: float
) -> Check:
    """Every request not touched by a kill and not disconnected by us completed."""
    name = "requests away from kills all completed"
    seen = 0
    bad: Counter[str] = Counter()
    for r in records:
        if r.warmup or r.disconnected is not None:
            continue
        if kill_relation(r, kills, grace_s) != "unaffected":
            continue
        seen += 1
        o = outcome(r)
        if o != "completed":
            bad[o] += 1
    if bad:
        return Check(name, False, f"{sum(bad.values())} of {seen}: {_counts(bad)}")
    return Check(name, True, f"{seen} requests")


def check_kills(kills: Sequence[KillEvent], wanted: int) -> Check:
    """The planned number of kills happened and the worker came back after each."""
    name = f"generation worker killed {wanted}x and back each time"
    back = [k for k in kills if k.ready_s is not None and k.gateway_up_s is not None]
    detail = f"{len(kills)} kills, {len(back)} recoveries"
    return Check(name, len(kills) == wanted and len(back) == wanted, detail)


def check_disconnects(records: Iterable[RequestLog], phases: Iterable[str]) -> Check:
    """Every disconnect phase asked for happened at least once."""
    name = "client disconnects at every phase"
    hit = Counter(r.disconnected for r in records if not r.warmup and r.disconnected)
    wanted = list(phases)
    missing = [p for p in wanted if not hit.get(p)]
    detail = ", ".join(f"{p}={hit.get(p, 0)}" for p in wanted) or "none planned"
    return Check(name, not missing, detail + (f"; missing {', '.join(missing)}" if missing else ""))


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def _counts(c: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


# ---------------------------------------------------------------- gateway log

_NUMBERS = re.compile(r"\b(0x[0-9a-f]+|\d+(\.\d+)?)\b")
_LEVEL = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b (\S+): (.*)$")


def summarize_log(lines: Iterable[str]) -> list[tuple[str, int]]:
    """Warning and error lines of a gateway log, grouped by message with numbers masked,
    most frequent first; tracebacks count under ``Traceback``."""
    counts: Counter[str] = Counter()
    for line in lines:
        m = _LEVEL.search(line)
        if m:
            counts[f"{m.group(1)} {m.group(2)}: {_NUMBERS.sub('N', m.group(3))[:160]}"] += 1
        elif line.startswith("Traceback"):
            counts["Traceback (most recent call last)"] += 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


# ---------------------------------------------------------------- parsing probes


def parse_vllm_gauges(text: str) -> dict[str, float]:
    """``running`` and ``waiting`` from a vLLM ``/metrics`` page, summed over label sets
    (absent when the page has no such series)."""
    names = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting"}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:num_requests_"):
            continue
        series, _, value = line.rpartition(" ")
        key = names.get(series.split("{", 1)[0])
        if key is None:
            continue
        try:
            out[key] = out.get(key, 0.0) + float(value)
        except ValueError:
            continue
    return out


def parse_vmrss_kb(status_text: str) -> int | None:
    """``VmRSS`` in kB from the text of ``/proc/PID/status``."""
    for line in status_text.splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1])
    return None


GATEWAY_COUNTERS = ("hearthgate_requests_total", "hearthgate_rejected_total")


def parse_gateway_counters(text: str) -> dict[str, float]:
    """The gateway's request and rejection counters from its ``/metrics`` page, by series
    (name and labels), zero series left out."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(GATEWAY_COUNTERS):
            continue
        series, _, value = line.rpartition(" ")
        try:
            v = float(value)
        except ValueError:
            continue
        if v:
            out[series] = v
    return out
