"""Expand a scenario into the exact list of requests to send: deterministic from the seed.

Each flow draws its arrival times, lengths and prompt words from its own generators, seeded
from (scenario seed, flow label, purpose), so adding a flow does not change the others and the
same plan is replayed against every target of a comparison.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

from hearthgate.loadtests.arrivals import arrival_times
from hearthgate.loadtests.lengths import sample_pair
from hearthgate.loadtests.prompts import Calibration, build_prompt
from hearthgate.loadtests.scenario import ENDPOINT_PATHS, Flow, Scenario


@dataclass(frozen=True)
class PlannedRequest:
    """One request of the workload; `scheduled_s` is relative to the run's start."""

    id: str
    flow: str
    klass: str
    app: str
    endpoint: str
    model: str
    stream: bool
    scheduled_s: float
    prompt_tokens: int
    output_tokens: int | None
    priority: int
    warmup: bool
    prompt: str

    @property
    def path(self) -> str:
        return ENDPOINT_PATHS[self.endpoint]

    def body(self, *, send_priority: bool) -> dict[str, Any]:
        """The JSON body. Generation uses `ignore_eos` so the output length is exact, greedy
        decoding, and usage in the stream; `priority` only when the target wants it."""
        body: dict[str, Any] = {"model": self.model}
        if self.endpoint == "embeddings":
            body["input"] = self.prompt
            return body
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": self.prompt}]
        else:
            body["prompt"] = self.prompt
        body["max_tokens"] = self.output_tokens
        body["temperature"] = 0
        body["ignore_eos"] = True
        body["stream"] = self.stream
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        if send_priority:
            body["priority"] = self.priority
        return body


def _rng(scenario: Scenario, flow: Flow, purpose: str) -> random.Random:
    # str seeds are hashed with SHA-512 by random.seed: stable across runs and machines.
    return random.Random(f"{scenario.seed}:{flow.label}:{purpose}")


def _planned(
    scenario: Scenario,
    flow: Flow,
    req_id: str,
    at_s: float,
    prompt_tokens: int,
    output_tokens: int | None,
    warmup: bool,
    prompt: str,
) -> PlannedRequest:
    return PlannedRequest(
        id=req_id,
        flow=flow.label,
        klass=flow.klass,
        app=flow.app,
        endpoint=flow.endpoint,
        model=scenario.model_for(flow),
        stream=flow.streams,
        scheduled_s=at_s,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        priority=scenario.priority_for(flow),
        warmup=warmup,
        prompt=prompt,
    )


def plan_flow(scenario: Scenario, flow: Flow, calibration: Calibration) -> list[PlannedRequest]:
    end = min(flow.stop_s, scenario.duration_s) if flow.stop_s else scenario.duration_s
    times = arrival_times(flow.arrival, _rng(scenario, flow, "arrivals"), flow.start_s, end)
    lengths = _rng(scenario, flow, "lengths")
    words = _rng(scenario, flow, "prompts")
    cal = calibration.for_endpoint(flow.endpoint)
    out: list[PlannedRequest] = []
    for i, t in enumerate(times):
        p, o = sample_pair(flow.prompt_tokens, flow.output_tokens, lengths)
        out.append(
            _planned(
                scenario,
                flow,
                f"{flow.label}#{i}",
                round(t, 6),
                p,
                o,
                t < scenario.warmup_s,
                build_prompt(p, words, cal),
            )
        )
    return out


def plan(scenario: Scenario, calibration: Calibration | None = None) -> list[PlannedRequest]:
    """All requests of the scenario, ordered by scheduled time (ties by id)."""
    cal = calibration or Calibration()
    reqs = [r for flow in scenario.flows for r in plan_flow(scenario, flow, cal)]
    reqs.sort(key=lambda r: (r.scheduled_s, r.id))
    return reqs


def priming_plan(
    scenario: Scenario, calibration: Calibration | None = None, per_flow: int | None = None
) -> list[PlannedRequest]:
    """Requests of every flow's shape (its largest and a typical length) to send before the
    measured run, so that the worker has compiled graphs for each shape. All at time 0."""
    cal = calibration or Calibration()
    n = scenario.prime_requests if per_flow is None else per_flow
    out: list[PlannedRequest] = []
    for flow in scenario.flows:
        lengths = _rng(scenario, flow, "prime-lengths")
        words = _rng(scenario, flow, "prime-prompts")
        for i in range(n):
            p, o = sample_pair(flow.prompt_tokens, flow.output_tokens, lengths)
            if i == 0:  # the longest shape first: it is the one most likely to be new
                p = flow.prompt_tokens.upper()
                o = flow.output_tokens.upper() if flow.output_tokens is not None else None
            prompt = build_prompt(p, words, cal.for_endpoint(flow.endpoint))
            out.append(_planned(scenario, flow, f"prime:{flow.label}#{i}", 0.0, p, o, True, prompt))
    return out


def describe(scenario: Scenario, reqs: list[PlannedRequest]) -> list[dict[str, Any]]:
    """Per-flow counts and token demand of a plan (for `bench plan` and the report)."""
    counts = Counter(r.flow for r in reqs)
    rows: list[dict[str, Any]] = []
    for flow in scenario.flows:
        mine = [r for r in reqs if r.flow == flow.label]
        span = (flow.stop_s or scenario.duration_s) - flow.start_s
        span = min(span, scenario.duration_s - flow.start_s)
        rows.append(
            {
                "flow": flow.label,
                "class": flow.klass,
                "app": flow.app,
                "endpoint": flow.endpoint,
                "stream": flow.streams,
                "requests": counts[flow.label],
                "rate_planned": round(counts[flow.label] / span, 3) if span > 0 else 0.0,
                "rate_nominal": round(flow.arrival.mean_rate(), 3),
                "prompt_tokens_mean": round(sum(r.prompt_tokens for r in mine) / len(mine), 1)
                if mine
                else 0.0,
                "output_tokens_mean": round(sum(r.output_tokens or 0 for r in mine) / len(mine), 1)
                if mine
                else 0.0,
            }
        )
    return rows
