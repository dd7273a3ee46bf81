"""The batch's lines of `hearthgate bench batch`: its shape, the planned requests, the
Batch API input files."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hearthgate.loadtests.lengths import sample_length
from hearthgate.loadtests.prompts import Calibration, build_prompt
from hearthgate.loadtests.scenario import ENDPOINT_PATHS, LengthDist, Scenario, UniformLength
from hearthgate.loadtests.workload import PlannedRequest

SUMMARY_DEFAULT = UniformLength(dist="uniform", min=1500, max=2000)
EMBED_DEFAULT = UniformLength(dist="uniform", min=16, max=64)


@dataclass(frozen=True)
class BatchShape:
    """What one batch run sends: ``lines`` lines, ``summary_fraction`` of them summaries."""

    lines: int = 5000
    summary_fraction: float = 0.2
    summary_endpoint: str = "chat"  # chat | completions
    summary_prompt: LengthDist = SUMMARY_DEFAULT
    summary_tokens: int = 32
    embed_prompt: LengthDist = EMBED_DEFAULT
    app: str = "nightly"
    klass: str = "batch"
    seed: int = 42

    def counts(self) -> tuple[int, int]:
        """(summary lines, embeddings lines)."""
        return split_counts(self.lines, self.summary_fraction)

    def endpoints(self) -> list[str]:
        """The batch endpoints, one batch each (a part without lines has none)."""
        n_sum, n_emb = self.counts()
        return [
            ep
            for ep, n in (
                (ENDPOINT_PATHS[self.summary_endpoint], n_sum),
                (ENDPOINT_PATHS["embeddings"], n_emb),
            )
            if n
        ]

    def describe(self) -> dict[str, Any]:
        n_sum, n_emb = self.counts()
        return {
            "lines": self.lines,
            "summary_fraction": self.summary_fraction,
            "summary_lines": n_sum,
            "embed_lines": n_emb,
            "summary_endpoint": ENDPOINT_PATHS[self.summary_endpoint],
            "summary_prompt_tokens": self.summary_prompt.model_dump(),
            "summary_max_tokens": self.summary_tokens,
            "embed_prompt_tokens": self.embed_prompt.model_dump(),
            "app": self.app,
            "seed": self.seed,
        }


def split_counts(lines: int, fraction: float) -> tuple[int, int]:
    """(summaries, embeddings) of ``lines`` lines with ``fraction`` summaries (rounded)."""
    if lines < 1:
        raise ValueError("a batch needs at least one line")
    if not 0 <= fraction <= 1:
        raise ValueError(f"summary fraction must be within [0, 1], got {fraction}")
    n_sum = round(lines * fraction)
    return n_sum, lines - n_sum


def shape_from(scenario: Scenario, **kw: Any) -> BatchShape:
    """A shape whose summary prompts follow the scenario's RAG flow and whose embeddings
    inputs follow its embeddings flow (the defaults when it has none)."""
    rag = next((f for f in scenario.flows if f.klass == "rag"), None)
    emb = next((f for f in scenario.flows if f.endpoint == "embeddings"), None)
    return BatchShape(
        summary_prompt=rag.prompt_tokens if rag is not None else SUMMARY_DEFAULT,
        embed_prompt=emb.prompt_tokens if emb is not None else EMBED_DEFAULT,
        seed=scenario.seed,
        **kw,
    )


def plan_lines(
    shape: BatchShape, scenario: Scenario, cal: Calibration, label: str
) -> dict[str, list[PlannedRequest]]:
    """The batch's requests by batch endpoint (``/v1/chat/completions`` or
    ``/v1/completions``, and ``/v1/embeddings``; an empty part is left out). Lengths follow
    ``shape.seed`` only, so every measurement sends the same token counts; the words follow
    ``label`` too, so no two measurements share a prompt (vLLM's prefix cache)."""
    n_sum, n_emb = shape.counts()
    priority = scenario.classes[shape.klass].priority if shape.klass in scenario.classes else 0
    out: dict[str, list[PlannedRequest]] = {}
    parts = (
        ("sum", shape.summary_endpoint, n_sum, shape.summary_prompt, shape.summary_tokens),
        ("emb", "embeddings", n_emb, shape.embed_prompt, None),
    )
    for part, endpoint, n, dist, out_tokens in parts:
        if n == 0:
            continue
        lengths = random.Random(f"{shape.seed}:batch:{part}:lengths")
        words = random.Random(f"{shape.seed}:batch:{part}:words:{label}")
        ecal = cal.for_endpoint(endpoint)
        reqs = []
        for i in range(n):
            p = sample_length(dist, lengths)
            reqs.append(
                PlannedRequest(
                    id=f"{part}-{i:05d}",
                    flow=f"batch/{part}",
                    klass=shape.klass,
                    app=shape.app,
                    endpoint=endpoint,
                    model=scenario.models.for_endpoint(endpoint),
                    stream=False,
                    scheduled_s=0.0,
                    prompt_tokens=p,
                    output_tokens=out_tokens,
                    priority=priority,
                    warmup=False,
                    prompt=build_prompt(p, words, ecal),
                )
            )
        out[ENDPOINT_PATHS[endpoint]] = reqs
    return out


def batch_line(req: PlannedRequest) -> dict[str, Any]:
    """One line of a Batch API input file for ``req`` (the body the load tester sends)."""
    return {
        "custom_id": req.id,
        "method": "POST",
        "url": req.path,
        "body": req.body(send_priority=False),
    }


def to_jsonl(reqs: Sequence[PlannedRequest]) -> bytes:
    return "".join(json.dumps(batch_line(r)) + "\n" for r in reqs).encode()
