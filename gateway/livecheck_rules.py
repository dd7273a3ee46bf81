"""The comparison half of ``hearthgate check --live``: plain values in, findings out.

A ``Worker`` from the settings and the ``WorkerFacts`` probing observed (``livecheck``
gathers them over HTTP) are compared by ``compare`` and the ``check_*`` functions, each
disagreement a ``Finding`` with concrete advice; ``format_report`` prints them. Also the
parsers of what a worker answers. No I/O here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from hearthgate.gateway.settings import Settings, Worker
from hearthgate.gateway.vllm_process import Policy

Level = Literal["error", "warning", "note"]


@dataclass(frozen=True)
class Finding:
    """One disagreement (or point of note) between the settings and a worker."""

    worker: str
    level: Level
    problem: str
    advice: str = ""


@dataclass(frozen=True)
class ServedModel:
    id: str
    max_model_len: int | None = None


@dataclass(frozen=True)
class WorkerFacts:
    """What probing one worker found. ``None``: could not be told (``probe_note`` and
    ``policy_source`` say why)."""

    unreachable: str | None = None  # set when /v1/models gave no usable answer
    models: tuple[ServedModel, ...] = ()
    generates: bool | None = None  # answered a /v1/completions probe
    embeds: bool | None = None  # answered a /v1/embeddings probe
    probe_note: str = ""  # what the role probe answered when it failed
    policy: Policy | None = None
    policy_source: str = ""  # how the policy is known, or why it is not


# ----- pure helpers: parsing what workers say -----


def parse_models(body: Any) -> tuple[ServedModel, ...]:
    """The models of an OpenAI ``/v1/models`` answer (vLLM adds ``max_model_len``)."""
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise ValueError("not an OpenAI model list (no `data` list)")
    out = []
    for item in body["data"]:
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            mml = item.get("max_model_len")
            out.append(ServedModel(item["id"], mml if isinstance(mml, int) else None))
    return tuple(out)


def priority_refused(status: int, text: str) -> bool:
    """Whether a probe answer is vLLM refusing a non-zero ``priority`` (fcfs policy)."""
    return 400 <= status < 500 and "priority" in text.lower()


def policy_from_server_info(body: Any) -> Policy | None:
    """``vllm_config.scheduler_config.policy`` of a ``/server_info?config_format=json``."""
    with contextlib.suppress(AttributeError, KeyError, TypeError):
        policy = body["vllm_config"]["scheduler_config"]["policy"]
        if policy in ("fcfs", "priority"):
            return policy  # type: ignore[no-any-return]
    return None


# ----- the comparison -----


def check_models(worker: Worker, facts: WorkerFacts) -> list[Finding]:
    """Every model the settings list for ``worker`` (under its upstream name) is served."""
    served = [m.id for m in facts.models]
    if not served:
        return [Finding(worker.name, "error", "serves no model (its /v1/models list is empty)")]
    out = []
    for model in worker.models:
        upstream = worker.upstream_model(model)
        if upstream in served:
            continue
        alias = f" (upstream_models maps it to {upstream!r})" if upstream != model else ""
        problem = (
            f"clients' model {model!r}{alias} is not served here; "
            f"the worker serves {', '.join(map(repr, served))}"
        )
        if len(served) == 1:
            advice = (
                f"if {served[0]!r} is that model, set `upstream_models: {{{model}: "
                f"{served[0]}}}` on worker {worker.name}; or start vLLM with "
                f"--served-model-name {upstream}"
            )
        else:
            advice = (
                f"set upstream_models.{model} on worker {worker.name} to one of the names "
                f"above, or start vLLM with --served-model-name {upstream}"
            )
        out.append(Finding(worker.name, "error", problem, advice))
    wanted = {worker.upstream_model(m) for m in worker.models}
    extra = [m for m in served if m not in wanted]
    if extra and not out:  # with an error above, its advice already names them
        out.append(
            Finding(
                worker.name,
                "note",
                f"also serves {', '.join(map(repr, extra))}, which the settings do not list: "
                "clients cannot reach it through the gateway",
                f"add it to workers.{worker.name}.models if apps should use it",
            )
        )
    return out


def check_context(
    worker: Worker,
    max_model_len: int,
    long_prefill_min_tokens: int | None,
    default_max_tokens: int,
) -> list[Finding]:
    """``max_model_len`` (prompt + answer) against what the settings route to the worker."""
    if worker.role not in ("general", "long_prefill"):
        return []  # no text prompts of the settings' lengths reach it
    name, mml, dmt = worker.name, max_model_len, default_max_tokens
    if mml <= dmt:
        return [
            Finding(
                name,
                "error",
                f"max_model_len {mml} leaves no room for a prompt beside the default answer "
                f"of {dmt} tokens (tokens.default_max_tokens)",
                f"start vLLM with a larger --max-model-len, or lower tokens.default_max_tokens "
                f"below {mml}",
            )
        ]
    threshold = long_prefill_min_tokens
    if threshold is None:
        return []
    if worker.role == "long_prefill" and mml <= threshold:
        return [
            Finding(
                name,
                "error",
                f"every prompt routed to this long-prefill worker has at least {threshold} "
                f"tokens (routing.long_prefill_min_tokens), but its max_model_len is {mml}: "
                "vLLM would refuse them all (400)",
                f"start vLLM with --max-model-len {threshold + dmt} or more",
            )
        ]
    if mml < threshold + dmt:
        where = (
            "long prompts routed here"
            if worker.role == "long_prefill"
            else ("prompts just under it, which stay on this general worker,")
        )
        return [
            Finding(
                name,
                "warning",
                f"max_model_len {mml} is less than routing.long_prefill_min_tokens "
                f"({threshold}) plus the default answer ({dmt}): {where} cannot get a "
                f"{dmt}-token answer (vLLM answers 400 when prompt + max_tokens exceed it)",
                f"start vLLM with --max-model-len {threshold + dmt} or more, or lower "
                f"routing.long_prefill_min_tokens to {mml - dmt}",
            )
        ]
    return []


def check_priority(worker: Worker, policy: Policy | None, source: str) -> list[Finding]:
    """``priority_scheduling`` in the settings against the worker's scheduling policy."""
    name = worker.name
    if policy is None:
        if not worker.priority_scheduling:
            return []  # the gateway sends no priority: either policy works
        return [
            Finding(
                name,
                "warning",
                f"cannot tell whether the worker runs --scheduling-policy priority ({source})",
                "make sure its command line has --scheduling-policy priority (the settings "
                "say priority_scheduling: true); `hearthgate check --live` can read it where "
                "the worker runs on this machine, or from /server_info when vLLM runs with "
                "VLLM_SERVER_DEV_MODE=1",
            )
        ]
    if worker.priority_scheduling and policy == "fcfs":
        return [
            Finding(
                name,
                "error",
                f"the settings say priority_scheduling: true, but the worker runs the fcfs "
                f"policy ({source}): vLLM ignores the class priorities the gateway sends "
                "(vLLM versions that enforce it refuse them with 400)",
                "start vLLM with --scheduling-policy priority, or set "
                f"workers.{name}.priority_scheduling: false",
            )
        ]
    if not worker.priority_scheduling and policy == "priority":
        return [
            Finding(
                name,
                "warning",
                f"the worker runs --scheduling-policy priority ({source}), but the settings "
                "say priority_scheduling: false, so the gateway sends no priority and vLLM "
                "serves its own queue first come, first served",
                f"set workers.{name}.priority_scheduling: true",
            )
        ]
    return []


# Speech to text and text to speech: their role probe would transcribe or synthesize.
UNPROBED_ROLES = frozenset({"transcription", "speech"})


def check_role(worker: Worker, facts: WorkerFacts) -> list[Finding]:
    """The worker does what its role needs: embeddings -> /v1/embeddings (or, for a
    cross-encoder, /v1/score), generation roles -> /v1/completions; speech workers are not
    probed (a probe would cost a transcription or a synthesis)."""
    name, note = worker.name, facts.probe_note
    if worker.role in UNPROBED_ROLES:
        return []
    if worker.role == "embeddings":
        if facts.embeds is False:
            return [
                Finding(
                    name,
                    "error",
                    f"has role embeddings, but /v1/embeddings failed ({note}), and so did "
                    "/v1/score: it does not run an embedding or scoring (pooling) model",
                    "point this entry at the embeddings worker, or start vLLM with an "
                    "embedding model and --runner pooling",
                )
            ]
        if facts.embeds is None:
            return [Finding(name, "warning", f"could not probe /v1/embeddings ({note})")]
        return []
    if facts.generates is False:
        return [
            Finding(
                name,
                "error",
                f"has role {worker.role}, but /v1/completions failed ({note}): it does not "
                "run a text generation model",
                "if it is the embeddings worker, set its role: embeddings; otherwise point "
                "this entry at a generation worker",
            )
        ]
    if facts.generates is None:
        return [Finding(name, "warning", f"could not probe /v1/completions ({note})")]
    return []


def compare(worker: Worker, facts: WorkerFacts, settings: Settings) -> list[Finding]:
    """Every finding for one worker, errors first."""
    if facts.unreachable is not None:
        return [
            Finding(
                worker.name,
                "error",
                f"not reachable at {worker.url}: {facts.unreachable}",
                "start it, or fix workers."
                f"{worker.name}.url (systemd: `systemctl status vllm-worker@NAME`; compose: "
                "`docker compose ps` and `docker compose logs SERVICE`); a worker that is "
                "still loading its model answers only when it has loaded",
            )
        ]
    found = check_models(worker, facts)
    lengths = {m.id: m.max_model_len for m in facts.models}
    seen: set[int] = set()
    for model in worker.models if facts.generates is not False else ():
        mml = lengths.get(worker.upstream_model(model))
        if mml is not None and mml not in seen:
            seen.add(mml)
            found += check_context(
                worker,
                mml,
                settings.routing.long_prefill_min_tokens,
                settings.tokens.default_max_tokens,
            )
    found += check_role(worker, facts)
    found += check_priority(worker, facts.policy, facts.policy_source)
    order = {"error": 0, "warning": 1, "note": 2}
    return sorted(found, key=lambda f: order[f.level])


def describe(facts: WorkerFacts) -> str:
    """One line: what the worker was seen to run."""
    if facts.unreachable is not None:
        return "unreachable"
    models = ", ".join(
        m.id + (f" (max_model_len {m.max_model_len})" if m.max_model_len else "")
        for m in facts.models
    )
    does = []
    if facts.generates:
        does.append("generates")
    if facts.embeds:
        does.append("embeds")
    policy = facts.policy or "unknown"
    return f"serves {models or 'nothing'}; {', '.join(does) or 'role not confirmed'}; " + (
        f"scheduling {policy} ({facts.policy_source})"
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def format_report(results: Sequence[tuple[Worker, WorkerFacts, list[Finding]]]) -> str:
    lines = []
    for worker, facts, findings in results:
        state = "ok" if not any(f.level == "error" for f in findings) else "PROBLEM"
        lines.append(f"{worker.name} {worker.url}: {state}: {describe(facts)}")
        for f in findings:
            lines.append(f"  {f.level}: {f.problem}")
            if f.advice:
                lines.append(f"    fix: {f.advice}")
    errors = sum(f.level == "error" for _, _, fs in results for f in fs)
    warnings = sum(f.level == "warning" for _, _, fs in results for f in fs)
    lines.append(
        f"live check: {_count(len(results), 'worker')}, {_count(errors, 'error')}, "
        f"{_count(warnings, 'warning')}"
    )
    return "\n".join(lines)
