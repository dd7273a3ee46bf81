"""Per-request records and server-side samples, and their JSONL files.

All times are seconds relative to the run's start (t0), from one monotonic clock
(`time.perf_counter`), so scheduled and actual send times, token arrivals and server samples
can be compared directly.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

Outcome = Literal["ok", "rejected", "failed"]
REJECT_STATUSES = frozenset({429, 503})


def classify_status(status: int | None, error: str | None) -> Outcome:
    """ok: 2xx with no error; rejected: HTTP 429 or 503 (shed load); failed: anything else."""
    if status in REJECT_STATUSES:
        return "rejected"
    if status is not None and 200 <= status < 300 and error is None:
        return "ok"
    return "failed"


@dataclass
class RequestRecord:
    """What happened to one request. `chunk_s` holds the arrival time of every streamed chunk
    that carried a token (a non-empty `choices`, not the bare role header of a chat stream);
    for a non-streamed request it holds the single response time."""

    id: str
    target: str
    flow: str
    klass: str
    app: str
    endpoint: str
    stream: bool
    warmup: bool
    scheduled_s: float
    prompt_tokens_requested: int
    output_tokens_requested: int | None
    sent_s: float | None = None
    end_s: float | None = None
    chunk_s: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    status: int | None = None
    error: str | None = None
    retry_after: str | None = None
    outcome: Outcome = "failed"
    # Through the gateway: how long it waited in the gateway's queue (its
    # x-hearthgate-queued-ms header), so a first token's time splits into gateway and worker.
    queued_s: float | None = None

    # -- derived timings (None when they do not apply)

    @property
    def ttft_s(self) -> float | None:
        if self.sent_s is None or not self.chunk_s:
            return None
        return self.chunk_s[0] - self.sent_s

    @property
    def e2e_s(self) -> float | None:
        if self.sent_s is None or self.end_s is None:
            return None
        return self.end_s - self.sent_s

    @property
    def gaps_s(self) -> list[float]:
        c = self.chunk_s
        return [b - a for a, b in itertools.pairwise(c)]

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first: (last - first chunk) / (tokens - 1)."""
        if not self.stream or len(self.chunk_s) < 2:
            return None
        n = self.output_tokens if self.output_tokens else len(self.chunk_s)
        if n < 2:
            return None
        return (self.chunk_s[-1] - self.chunk_s[0]) / (n - 1)

    @property
    def max_gap_s(self) -> float | None:
        g = self.gaps_s
        return max(g) if g else None

    @property
    def worker_ttft_s(self) -> float | None:
        """The first token's time less the gateway queue (None without the header)."""
        t = self.ttft_s
        return None if t is None or self.queued_s is None else max(0.0, t - self.queued_s)

    @property
    def send_lag_s(self) -> float | None:
        return None if self.sent_s is None else self.sent_s - self.scheduled_s

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["class"] = d.pop("klass")
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RequestRecord:
        d = dict(d)
        d["klass"] = d.pop("class")
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class Sample:
    """One scrape of one `/metrics` endpoint: `source` is "worker", "embed_worker" or
    "gateway"; `values` maps a metric (vLLM gauges summed over label sets; gateway gauges
    keyed with their labels, e.g. `hearthgate_queue_depth{class="chat"}`) to its value."""

    target: str
    source: str
    t_s: float
    values: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Sample:
        return cls(
            target=str(d["target"]),
            source=str(d["source"]),
            t_s=float(d["t_s"]),
            values={str(k): float(v) for k, v in d["values"].items()},
        )


def write_jsonl(path: Path, items: Iterable[RequestRecord | Sample]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for item in items:
            fh.write(json.dumps(item.to_json(), separators=(",", ":")) + "\n")


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    with path.open() as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def read_records(path: Path) -> list[RequestRecord]:
    return [RequestRecord.from_json(d) for d in _lines(path)]


def read_samples(path: Path) -> list[Sample]:
    return [Sample.from_json(d) for d in _lines(path)] if path.exists() else []
