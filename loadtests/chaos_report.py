"""Chaos soak: the result of one run and its markdown report (pure, see chaos_outcomes)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hearthgate.loadtests.chaos_outcomes import (
    ACCEPTABLE_WITHOUT_TOKEN,
    GEN_KINDS,
    KINDS,
    PHASES,
    RELATIONS,
    Check,
    KillEvent,
    RequestLog,
    kill_relation,
    outcome,
)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


# ---------------------------------------------------------------- result and report


@dataclass
class SoakResult:
    """Everything a soak produced; ``render`` turns it into the markdown report."""

    command: str
    started: str  # date and time, local
    seed: int
    params: dict[str, Any]
    layout: dict[str, str]  # component -> where it ran
    records: list[RequestLog]
    kills: list[KillEvent]
    checks: list[Check]
    rss_warm_kb: int | None
    rss_end_kb: int | None
    rss_samples: list[tuple[float, int]] = field(default_factory=list)
    status_end: dict[str, Any] | None = None
    gauges_end: dict[str, dict[str, float] | None] = field(default_factory=dict)
    settle_s: float | None = None  # load stop to clean end state (None: never clean)
    max_queued: int = 0
    max_in_flight: int = 0
    skipped: int = 0  # planned arrivals not sent (too many outstanding)
    log_summary: list[tuple[str, int]] = field(default_factory=list)
    gateway_counters: dict[str, float] = field(default_factory=dict)  # its /metrics, at the end
    wall_s: float = 0.0
    grace_s: float = 5.0

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["ok"] = self.ok
        return out


def outcome_table(records: Sequence[RequestLog]) -> list[list[str]]:
    """Rows ``kind, outcome...`` (plus a total row), columns in a fixed order."""
    counts: dict[str, Counter[str]] = {k: Counter() for k in KINDS}
    for r in records:
        counts.setdefault(r.kind, Counter())[outcome(r)] += 1
    columns = _outcome_columns(c for cs in counts.values() for c in cs)
    rows = [["kind", *columns, "total"]]
    total: Counter[str] = Counter()
    for kind, cs in counts.items():
        if not cs:
            continue
        total.update(cs)
        rows.append([kind, *(str(cs.get(c, 0)) for c in columns), str(sum(cs.values()))])
    rows.append(["**all**", *(str(total.get(c, 0)) for c in columns), str(sum(total.values()))])
    return rows


def relation_table(
    records: Sequence[RequestLog], kills: Sequence[KillEvent], grace_s: float
) -> list[list[str]]:
    """Generation requests: relation to the kills x outcome."""
    counts: dict[str, Counter[str]] = {rel: Counter() for rel in RELATIONS}
    for r in records:
        if r.kind in GEN_KINDS:
            counts[kill_relation(r, kills, grace_s)][outcome(r)] += 1
    columns = _outcome_columns(c for cs in counts.values() for c in cs)
    rows = [["relation to a kill", *columns, "total"]]
    for rel, cs in counts.items():
        rows.append([rel, *(str(cs.get(c, 0)) for c in columns), str(sum(cs.values()))])
    return rows


def disconnect_table(records: Sequence[RequestLog]) -> list[list[str]]:
    """Planned disconnect phase x the phase observed (or ``finished first``)."""
    counts: dict[str, Counter[str]] = {}
    for r in records:
        if r.planned is None:
            continue
        got = r.disconnected or f"not disconnected ({outcome(r)})"
        counts.setdefault(r.planned, Counter())[got] += 1
    columns = [p for p in PHASES if any(p in c for c in counts.values())]
    columns += sorted({c for cs in counts.values() for c in cs} - set(PHASES))
    rows = [["planned \\ observed", *columns]]
    for planned in PHASES:
        if planned in counts:
            rows.append([planned, *(str(counts[planned].get(c, 0)) for c in columns)])
    return rows


def _outcome_columns(seen: Iterable[str]) -> list[str]:
    present = set(seen)
    order = ["completed", *(f"disconnected:{p}" for p in PHASES)]
    first = [c for c in order if c in present]
    return first + sorted(present - set(first))


def _md_table(rows: Sequence[Sequence[str]]) -> str:
    head, *body = rows
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def _fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def problem_examples(result: SoakResult, limit: int = 15) -> list[RequestLog]:
    """Requests that break a request-level check, earliest first."""
    out = []
    for r in result.records:
        if r.warmup or r.disconnected is not None:
            continue
        rel = kill_relation(r, result.kills, result.grace_s)
        o = outcome(r)
        if (
            rel in ("in_flight_no_token", "sent_during_outage")
            and o not in ACCEPTABLE_WITHOUT_TOKEN
        ) or (rel == "unaffected" and o != "completed"):
            out.append(r)
    return sorted(out, key=lambda r: r.sent_s)[:limit]


def render(result: SoakResult) -> str:
    """The markdown report."""
    measured = [r for r in result.records if not r.warmup]
    p = result.params
    verdict = "PASS" if result.ok else "FAIL"
    out = [
        f"# Chaos soak: {verdict}",
        "",
        f"- date: {result.started}",
        f"- command: `{result.command}`",
        f"- seed {result.seed}; load {p.get('duration_s')} s after {p.get('warmup_s')} s of "
        f"warm-up; wall time {result.wall_s:.0f} s",
        "- load: "
        + ", ".join(f"{k} {v}" for k, v in p.items() if k not in ("duration_s", "warmup_s")),
        "- layout: " + "; ".join(f"{k}: {v}" for k, v in result.layout.items()),
        f"- requests: {len(measured)} measured ({len(result.records) - len(measured)} warm-up), "
        f"{result.skipped} planned arrivals skipped (too many outstanding); "
        f"gateway peaks: {result.max_queued} queued, {result.max_in_flight} in flight",
        "",
        "## End-state checks",
        "",
        _md_table(
            [["check", "result", "detail"]]
            + [[c.name, "pass" if c.ok else "**FAIL**", c.detail] for c in result.checks]
        ),
        "",
        "## Outcomes (measured requests)",
        "",
        _md_table(outcome_table(measured)),
        "",
        "## Generation requests and the worker kills",
        "",
        f"A request counts as sent during an outage until {result.grace_s:g} s after the "
        "gateway saw the worker up again.",
        "",
        _md_table(relation_table(measured, result.kills, result.grace_s)),
        "",
        "## Disconnects: planned phase and where the client actually was",
        "",
        "A streaming request left before its first byte counts as queued when the gateway's "
        "/status showed requests of its class queued at that moment, else as in prefill.",
        "",
        _md_table(disconnect_table(measured)),
        "",
        "## Kills",
        "",
        _md_table(
            [
                [
                    "kill at (s)",
                    "open requests (no token yet)",
                    "restarted (s)",
                    "worker ready (s)",
                    "gateway up (s)",
                ]
            ]
            + [
                [
                    _fmt_s(k.killed_s),
                    f"{k.in_flight_at_kill} ({k.no_token_at_kill})",
                    _fmt_s(k.restarted_s),
                    _fmt_s(k.ready_s),
                    _fmt_s(k.gateway_up_s),
                ]
                for k in result.kills
            ]
        ),
        "",
        "## Memory (gateway VmRSS)",
        "",
        f"- after warm-up (idle): {_mib(result.rss_warm_kb)}",
        f"- at the end (idle, after settling): {_mib(result.rss_end_kb)}",
    ]
    if result.rss_samples:
        values = [kb for _, kb in result.rss_samples]
        out.append(
            f"- during the run: min {_mib(min(values))}, max {_mib(max(values))} "
            f"({len(values)} samples)"
        )
    out += [
        "",
        "## End state",
        "",
        f"- settled {_fmt_s(result.settle_s)} s after the load stopped"
        if result.settle_s is not None
        else "- never settled to a clean state",
        "- vLLM gauges: "
        + "; ".join(
            f"{w}: "
            + (
                "unreachable"
                if g is None
                else f"running={_num(g.get('running'))} waiting={_num(g.get('waiting'))}"
            )
            for w, g in result.gauges_end.items()
        ),
        "",
        "```json",
        json.dumps(_status_excerpt(result.status_end), indent=1),
        "```",
    ]
    examples = problem_examples(result)
    if examples:
        out += ["", "## Requests that broke a check (first 15)", ""]
        rows = [["id", "kind", "sent (s)", "end (s)", "relation", "outcome", "detail"]]
        for r in examples:
            rows.append(
                [
                    str(r.id),
                    r.kind + (" (burst)" if r.burst else ""),
                    _fmt_s(r.sent_s),
                    _fmt_s(r.end_s),
                    kill_relation(r, result.kills, result.grace_s),
                    outcome(r),
                    (r.error_event or r.error or "").replace("|", "/")[:120],
                ]
            )
        out.append(_md_table(rows))
    if result.gateway_counters:
        out += ["", "## The gateway's own counts (/metrics at the end, warm-up included)", ""]
        rows = [["series", "count"]]
        rows += [[f"`{k}`", f"{v:g}"] for k, v in sorted(result.gateway_counters.items())]
        out.append(_md_table(rows))
    if result.log_summary:
        out += ["", "## Gateway log: warnings and errors", ""]
        out.append(
            _md_table(
                [["count", "message"]]
                + [[str(n), m.replace("|", "/")] for m, n in result.log_summary[:20]]
            )
        )
    out.append("")
    return "\n".join(out)


def _mib(kb: int | None) -> str:
    return "-" if kb is None else f"{kb / 1024:.1f} MiB"


def _status_excerpt(status: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The parts of /status that hold requests."""
    if status is None:
        return None
    keep: dict[str, Any] = {k: status.get(k) for k in ("queued", "in_flight") if k in status}
    if "leases" in status:
        keep["leases"] = status["leases"]
    keep["queues"] = {
        c: q.get("depth") for c, q in (status.get("queues") or {}).items() if isinstance(q, dict)
    }
    keep["workers"] = [
        {k: w.get(k) for k in ("name", "up", "admitted", "in_flight", "failovers", "served")}
        for w in status.get("workers") or []
    ]
    return keep
