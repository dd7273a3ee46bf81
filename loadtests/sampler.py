"""Server-side sampling: scrape `/metrics` of the worker(s) and the gateway during a run.

vLLM's gauges of interest are summed over their label sets (one engine per worker here). For
the gateway every *gauge* whose name starts with `hearthgate_` is kept, keyed with its labels,
so the sampler does not depend on the gateway's exact metric names.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from loadtests.records import Sample

VLLM_METRICS: tuple[str, ...] = (
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
)
GATEWAY_PREFIX = "hearthgate_"

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


def gateway_values(text: str, prefix: str = GATEWAY_PREFIX) -> dict[str, float]:
    """Every gauge named `prefix...`, keyed `name{labels}`."""
    types, samples = parse_prometheus(text)
    return {
        s.name + s.labels: s.value
        for s in samples
        if s.name.startswith(prefix) and types.get(s.name) == "gauge"
    }


@dataclass(frozen=True)
class Source:
    """A `/metrics` URL to scrape; `kind` is "worker" (vLLM) or "gateway"."""

    name: str
    url: str
    kind: str


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

    async def _scrape(self, src: Source) -> None:
        try:
            async with self.session.get(
                src.url, timeout=aiohttp.ClientTimeout(total=max(1.0, 2 * self.interval_s))
            ) as resp:
                text = await resp.text()
                t = self.clock() - self.t0
                if resp.status != 200:
                    self.errors += 1
                    return
        except (aiohttp.ClientError, OSError, TimeoutError):
            self.errors += 1
            return
        values = worker_values(text) if src.kind == "worker" else gateway_values(text)
        self.samples.append(Sample(self.target, src.name, round(t, 4), values))

    async def run(self) -> None:
        if not self.sources:
            return
        k = max(0, int((self.clock() - self.t0) / self.interval_s))
        while not self._stop.is_set():
            await asyncio.gather(*(self._scrape(s) for s in self.sources))
            k += 1
            delay = self.t0 + k * self.interval_s - self.clock()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), timeout=delay)

    def stop(self) -> None:
        self._stop.set()
