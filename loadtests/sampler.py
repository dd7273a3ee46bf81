"""Server-side sampling: scrape `/metrics` of the worker(s) and the gateway during a run.

vLLM's gauges of interest are summed over their label sets (one engine per worker here). For
the gateway every *gauge* whose name starts with `hearthgate_` is kept, keyed with its labels,
so the sampler does not depend on the gateway's exact metric names, plus the few counters in
`GATEWAY_COUNTERS` (the coalescer's upstream calls, pacing's cuts), whose increase the report
shows.

Several generation workers (a round-robin split, or the gateway's two workers) are one `worker`
series: each scrape reads every worker and records the sum over workers, except KV cache usage,
which is the mean (the pooled fraction, as the workers' caches are the same size). A scrape in
which any worker fails is counted as an error and recorded for none.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from hearthgate.loadtests.records import Sample

VLLM_METRICS: tuple[str, ...] = (
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
)
GATEWAY_PREFIX = "hearthgate_"
# Gateway counters kept besides the gauges (the report takes their increase over a run).
PACING_CUTS = "hearthgate_pacing_cuts_total"  # by worker, lever and reason
QUEUE_BLOCKED = "hearthgate_queue_blocked_seconds_total"  # by class and the limit in its way
GATEWAY_COUNTERS: tuple[str, ...] = (
    "hearthgate_coalesce_upstream_calls_total",
    "hearthgate_coalesce_calls_saved_total",
    PACING_CUTS,
    QUEUE_BLOCKED,
)

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?$")


@dataclass(frozen=True)
class PromSample:
    name: str
    labels: str  # the raw `{...}` text, or ""
    value: float


def parse_prometheus(text: str) -> tuple[dict[str, str], list[PromSample]]:
    """(family name -> TYPE, samples) from the Prometheus text exposition format."""
    types: dict[str, str] = {}
    samples: list[PromSample] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split()
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3]
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        samples.append(PromSample(m.group(1), m.group(2) or "", value))
    return types, samples


def worker_values(text: str, names: tuple[str, ...] = VLLM_METRICS) -> dict[str, float]:
    """The wanted vLLM series, each summed over its label sets (absent ones left out)."""
    _, samples = parse_prometheus(text)
    out: dict[str, float] = {}
    for s in samples:
        if s.name in names:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


MEAN_OVER_WORKERS: frozenset[str] = frozenset({"vllm:kv_cache_usage_perc"})


def combine_workers(per_worker: list[dict[str, float]]) -> dict[str, float]:
    """One worker series from several workers' values: summed, except the fractions in
    `MEAN_OVER_WORKERS`, averaged over the workers that report them."""
    out: dict[str, float] = {}
    seen: dict[str, int] = {}
    for values in per_worker:
        for k, v in values.items():
            out[k] = out.get(k, 0.0) + v
            seen[k] = seen.get(k, 0) + 1
    return {k: v / seen[k] if k in MEAN_OVER_WORKERS else v for k, v in out.items()}


def gateway_values(
    text: str, prefix: str = GATEWAY_PREFIX, counters: tuple[str, ...] = GATEWAY_COUNTERS
) -> dict[str, float]:
    """Every gauge named `prefix...` and the series of `counters`, keyed `name{labels}`.
    The `..._created` timestamps prometheus_client adds to counters and histograms (some
    exporters type them as gauges) are left out."""
    types, samples = parse_prometheus(text)
    return {
        s.name + s.labels: s.value
        for s in samples
        if (
            s.name.startswith(prefix)
            and types.get(s.name) == "gauge"
            and not s.name.endswith("_created")
        )
        or s.name in counters
    }


@dataclass(frozen=True)
class Source:
    """A `/metrics` URL to scrape; `kind` is "worker" (vLLM) or "gateway". A worker source
    may name `more_urls`, further workers combined with `url` into one series."""

    name: str
    url: str
    kind: str
    more_urls: tuple[str, ...] = ()


class Sampler:
    """Scrapes every source each `interval_s` until stopped; failures are counted, not fatal."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        sources: list[Source],
        *,
        target: str,
        t0: float,
        interval_s: float = 0.5,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.session = session
        self.sources = sources
        self.target = target
        self.t0 = t0
        self.interval_s = interval_s
        self.clock = clock
        self.samples: list[Sample] = []
        self.errors = 0
        self._stop = asyncio.Event()
        self._first_done = False

    async def _fetch(self, url: str) -> tuple[str, float] | None:
        """The page's text and when it arrived (relative to t0); None on failure."""
        try:
            async with self.session.get(
                url, timeout=aiohttp.ClientTimeout(total=max(1.0, 2 * self.interval_s))
            ) as resp:
                text = await resp.text()
                t = self.clock() - self.t0
                if resp.status != 200:
                    return None
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None
        return text, t

    async def _scrape(self, src: Source) -> None:
        pages = await asyncio.gather(*(self._fetch(u) for u in (src.url, *src.more_urls)))
        got = [p for p in pages if p is not None]
        if len(got) < len(pages):
            self.errors += 1
            return
        t = max(at for _, at in got)
        if src.kind == "worker":
            values = combine_workers([worker_values(text) for text, _ in got])
        else:
            values = gateway_values(got[0][0])
        self.samples.append(Sample(self.target, src.name, round(t, 4), values))

    async def first(self) -> None:
        """The first scrape, awaited before any request is sent, so counters' increases
        start from a value no request has moved yet; ``run`` then goes on from the next."""
        if self.sources:
            await asyncio.gather(*(self._scrape(s) for s in self.sources))
        self._first_done = True

    async def run(self) -> None:
        if not self.sources:
            return
        k = max(0, int((self.clock() - self.t0) / self.interval_s))
        skip = self._first_done
        while not self._stop.is_set():
            if not skip:
                await asyncio.gather(*(self._scrape(s) for s in self.sources))
            skip = False
            k += 1
            delay = self.t0 + k * self.interval_s - self.clock()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), timeout=delay)
        # One last scrape once stopped (after the run's last response), so counters' final
        # values are in: the report takes their increase from the first sample to the last.
        await asyncio.gather(*(self._scrape(s) for s in self.sources))

    def stop(self) -> None:
        self._stop.set()
