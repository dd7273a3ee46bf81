"""``hearthgate check --live``: compare the settings with what each vLLM worker really runs.

Two layers. The comparison (``livecheck_rules``: ``compare`` and the ``check_*`` functions)
works on plain values: a ``Worker`` from the settings and the ``WorkerFacts`` observed, and
returns ``Finding``s, each with concrete advice. This module is the probing layer
(``probe_worker``, ``live_check``): it gathers the facts over HTTP; every failure to reach
or understand a worker becomes a fact, never an exception.

What a worker tells and how:

- served model ids and each one's ``max_model_len``: ``GET /v1/models``;
- whether it generates or embeds: a one-token ``POST /v1/completions`` or a one-input
  ``POST /v1/embeddings`` for its model, as its role asks;
- its scheduling policy. vLLM 0.32 accepts a request's ``priority`` under either policy
  and ignores it under ``fcfs`` (its API docs say a non-zero priority is an error there;
  0.32 answers 200), and publishes the policy only on ``/server_info``, which exists when
  the worker runs with ``VLLM_SERVER_DEV_MODE=1``. So, in this order: the command line of
  the local process listening on the worker's port (loopback URLs only, found in /proc by
  ``vllm_process``), ``/server_info``, and a probe that carries a non-zero priority, whose
  refusal (vLLM versions that enforce it) means ``fcfs``. When none of these tells, the
  policy is reported unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from typing import Any, TextIO

import aiohttp

from hearthgate.gateway.livecheck_rules import (
    UNPROBED_ROLES,
    Finding,
    WorkerFacts,
    compare,
    format_report,
    parse_models,
    policy_from_server_info,
    priority_refused,
)
from hearthgate.gateway.settings import Settings, Worker
from hearthgate.gateway.vllm_process import Policy, local_policy
from hearthgate.policies.budgets import upstream_priority

PROBE_TEXT = "hearthgate live check"
SCORE_PROBE = {"text_1": PROBE_TEXT, "text_2": PROBE_TEXT}


# ----- probing -----


async def _request(
    session: aiohttp.ClientSession, method: str, url: str, body: Any = None
) -> tuple[int, str]:
    async with session.request(method, url, json=body) as resp:
        return resp.status, await resp.text()


def _short(status: int, text: str) -> str:
    """``HTTP 404: Not Found``: the status and the message of an OpenAI or FastAPI error."""
    with contextlib.suppress(ValueError):
        body = json.loads(text)
        if isinstance(body, dict):
            err = body.get("error")
            msg = err.get("message") if isinstance(err, dict) else err or body.get("detail")
            if msg:
                text = str(msg)
    return f"HTTP {status}: {text.strip()[:160]}"


def _why(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    return f"{type(exc).__name__}: {exc}".strip().rstrip(":")


async def _policy(session: aiohttp.ClientSession, base: str) -> tuple[Policy | None, str]:
    """The worker's scheduling policy from its local command line or /server_info."""
    local = local_policy(base)
    if local is not None:
        return local
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError, ValueError):
        status, text = await _request(session, "GET", base + "/server_info?config_format=json")
        if status == 200:
            policy = policy_from_server_info(json.loads(text))
            return policy, "/server_info" if policy else "/server_info names no policy"
    return None, "no vLLM process of this machine listens there, no /server_info"


async def _role_probe(
    session: aiohttp.ClientSession, worker: Worker, model: str, priority: int
) -> tuple[bool | None, bool, str]:
    """One tiny request of the worker's role, carrying ``priority``: (answered, refused the
    priority, what went wrong). A refused priority is retried without one."""
    embedding = worker.role == "embeddings"
    probes: list[tuple[str, dict[str, Any]]] = (
        # An embedding model, or a cross-encoder (rerank and score).
        [("/v1/embeddings", {"input": PROBE_TEXT}), ("/v1/score", SCORE_PROBE)]
        if embedding
        else [("/v1/completions", {"prompt": PROBE_TEXT, "max_tokens": 1})]
    )
    notes: list[str] = []
    refused = False
    for path, fields in probes:
        body: dict[str, Any] = {"model": model, **fields}
        try:
            status, text = await _request(
                session, "POST", worker.url + path, {**body, "priority": priority}
            )
            refused = priority_refused(status, text)
            if refused:
                status, text = await _request(session, "POST", worker.url + path, body)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return None, False, _why(exc)
        if status == 200:
            return True, refused, ""
        # The first probe's failure as it is; a fallback's after it, named.
        notes.append(_short(status, text) if not notes else f"{path}: {_short(status, text)}")
    return False, refused, "; ".join(notes)


async def probe_worker(
    session: aiohttp.ClientSession, worker: Worker, probe_priority: int
) -> WorkerFacts:
    """Everything ``compare`` needs about one worker; never raises for a worker's fault."""
    try:
        status, text = await _request(session, "GET", worker.url + "/v1/models")
        if status != 200:
            return WorkerFacts(unreachable=f"/v1/models answered {_short(status, text)}")
        models = parse_models(json.loads(text))
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
        return WorkerFacts(unreachable=_why(exc))
    policy, source = await _policy(session, worker.url)
    # Probe with the worker's model as the gateway would send it, else with any it serves.
    served = {m.id for m in models}
    wanted = [worker.upstream_model(m) for m in worker.models]
    model = next((u for u in wanted if u in served), models[0].id if models else None)
    if model is None:
        return WorkerFacts(models=models, policy=policy, policy_source=source)
    if worker.role in UNPROBED_ROLES:
        return WorkerFacts(models=models, policy=policy, policy_source=source)
    answered, refused, note = await _role_probe(session, worker, model, probe_priority)
    if policy is None and refused:
        policy, source = "fcfs", "it refused a request with a priority"
    elif policy is None and answered:
        source += ", and it accepted a request with a priority (vLLM 0.32 does either way)"
    embedding = worker.role == "embeddings"
    return WorkerFacts(
        models=models,
        generates=None if embedding else answered,
        embeds=answered if embedding else None,
        probe_note=note,
        policy=policy,
        policy_source=source,
    )


async def live_check(
    settings: Settings, timeout_s: float = 30.0
) -> list[tuple[Worker, WorkerFacts, list[Finding]]]:
    """Probe every worker of ``settings`` at once (``timeout_s`` per request) and compare."""
    # Lowest urgency: under the priority policy the probe waits behind real traffic.
    lowest = max((c.priority for c in settings.classes.values()), default=0)
    probe_priority = upstream_priority(lowest + 1, False)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    # trust_env off: workers are on the home network, never behind the host's proxy.
    async with aiohttp.ClientSession(timeout=timeout, trust_env=False) as session:
        facts = await asyncio.gather(
            *(probe_worker(session, w, probe_priority) for w in settings.workers)
        )
    return [(w, f, compare(w, f, settings)) for w, f in zip(settings.workers, facts, strict=True)]


def run_live_check(settings: Settings, timeout_s: float = 30.0, out: TextIO | None = None) -> int:
    """Print the live check's report; 0 when no finding is an error, else 1."""
    results = asyncio.run(live_check(settings, timeout_s))
    print(format_report(results), file=out or sys.stdout)
    return 1 if any(f.level == "error" for _, _, fs in results for f in fs) else 0
