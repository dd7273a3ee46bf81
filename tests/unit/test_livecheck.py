"""`hearthgate check --live`: the comparison of settings with worker facts, on plain values."""

from __future__ import annotations

from typing import Any

import pytest

from hearthgate.gateway.livecheck_rules import (
    Finding,
    ServedModel,
    WorkerFacts,
    check_context,
    check_models,
    check_priority,
    check_role,
    compare,
    format_report,
    parse_models,
    policy_from_server_info,
    priority_refused,
)
from hearthgate.gateway.settings import Settings, Worker


def worker(**kw: Any) -> Worker:
    spec: dict[str, Any] = {"name": "gen0", "url": "http://vllm:8000", "models": ["llama"]}
    spec.update(kw)
    return Worker(**spec)


def settings(*workers: Worker, threshold: int | None = 1024, default_max: int = 256) -> Settings:
    return Settings(
        workers=list(workers) or [worker()],
        routing={"long_prefill_min_tokens": threshold},
        tokens={"default_max_tokens": default_max},
    )


def facts(*models: tuple[str, int | None], **kw: Any) -> WorkerFacts:
    spec: dict[str, Any] = {
        "models": tuple(ServedModel(m, n) for m, n in models),
        "generates": True,
        "policy": "fcfs",
        "policy_source": "command line of pid 1",
    }
    spec.update(kw)
    return WorkerFacts(**spec)


def levels(findings: list[Finding]) -> list[str]:
    return [f.level for f in findings]


# ----- parsing -----


def test_parse_models_reads_vllm_model_list() -> None:
    body = {
        "object": "list",
        "data": [
            {"id": "tiny-llama", "object": "model", "max_model_len": 4096},
            {"id": "lora-a", "object": "model", "parent": "tiny-llama"},
            {"object": "model"},  # no id: skipped
        ],
    }
    assert parse_models(body) == (ServedModel("tiny-llama", 4096), ServedModel("lora-a", None))


@pytest.mark.parametrize("body", [None, [], {"data": "x"}, {"object": "list"}])
def test_parse_models_refuses_what_is_not_a_model_list(body: Any) -> None:
    with pytest.raises(ValueError, match="model list"):
        parse_models(body)


def test_priority_refused_only_for_a_client_error_about_priority() -> None:
    msg = '{"error": {"message": "Got priority 5 but Priority scheduling is not enabled."}}'
    assert priority_refused(400, msg)
    assert not priority_refused(200, '{"priority": 5}')
    assert not priority_refused(400, '{"error": {"message": "max_tokens too large"}}')
    assert not priority_refused(500, "priority")


def test_policy_from_server_info() -> None:
    body = {"vllm_config": {"scheduler_config": {"policy": "priority"}}}
    assert policy_from_server_info(body) == "priority"
    assert policy_from_server_info({"vllm_config": "SchedulerConfig(policy=fcfs)"}) is None
    assert policy_from_server_info({"vllm_config": {"scheduler_config": {"policy": "x"}}}) is None
    assert policy_from_server_info(None) is None


# ----- models -----


def test_models_served_under_the_same_or_the_aliased_name_pass() -> None:
    assert check_models(worker(), facts(("llama", 4096))) == []
    aliased = worker(models=["chat", "llama"], upstream_models={"chat": "llama"})
    assert check_models(aliased, facts(("llama", 4096))) == []


def test_wrong_model_name_is_an_error_with_the_upstream_models_fix() -> None:
    (f,) = check_models(worker(models=["llama-3-8b"]), facts(("tiny-llama", 4096)))
    assert f.level == "error"
    assert "'llama-3-8b'" in f.problem and "'tiny-llama'" in f.problem
    assert "upstream_models: {llama-3-8b: tiny-llama}" in f.advice
    assert "--served-model-name llama-3-8b" in f.advice


def test_wrong_alias_names_the_alias() -> None:
    w = worker(models=["chat"], upstream_models={"chat": "qwen"})
    (f,) = check_models(w, facts(("a", None), ("b", None)))
    assert "maps it to 'qwen'" in f.problem
    assert "upstream_models.chat" in f.advice and "--served-model-name qwen" in f.advice


def test_extra_served_model_is_a_note_and_none_served_an_error() -> None:
    assert levels(check_models(worker(), facts(("llama", 1), ("other", 1)))) == ["note"]
    assert levels(check_models(worker(), facts())) == ["error"]


# ----- context length -----


def test_context_long_enough_passes() -> None:
    assert check_context(worker(), 4096, 1024, 256) == []
    assert check_context(worker(role="long_prefill"), 8192, 1024, 256) == []
    assert check_context(worker(), 300, None, 256) == []  # no long-prompt routing


def test_context_too_short_for_the_default_answer_is_an_error() -> None:
    (f,) = check_context(worker(), 256, 1024, 256)
    assert f.level == "error" and "tokens.default_max_tokens" in f.problem


def test_long_prefill_worker_that_cannot_take_any_long_prompt_is_an_error() -> None:
    (f,) = check_context(worker(role="long_prefill"), 1024, 1024, 256)
    assert f.level == "error"
    assert "--max-model-len 1280" in f.advice


def test_context_below_threshold_plus_answer_is_a_warning_with_both_fixes() -> None:
    (f,) = check_context(worker(), 1100, 1024, 256)
    assert f.level == "warning"
    assert "--max-model-len 1280" in f.advice
    assert "long_prefill_min_tokens to 844" in f.advice
    (g,) = check_context(worker(role="long_prefill"), 1100, 1024, 256)
    assert g.level == "warning"


def test_embeddings_workers_have_no_context_check() -> None:
    assert check_context(worker(role="embeddings"), 128, 1024, 256) == []


# ----- scheduling policy -----


@pytest.mark.parametrize(
    ("claimed", "policy", "expected"),
    [
        (True, "priority", []),
        (False, "fcfs", []),
        (False, None, []),
        (True, "fcfs", ["error"]),
        (False, "priority", ["warning"]),
        (True, None, ["warning"]),
    ],
)
def test_priority_scheduling_against_the_worker(
    claimed: bool, policy: Any, expected: list[str]
) -> None:
    found = check_priority(worker(priority_scheduling=claimed), policy, "how")
    assert levels(found) == expected


def test_priority_claimed_on_fcfs_worker_says_how_to_fix() -> None:
    (f,) = check_priority(worker(priority_scheduling=True), "fcfs", "command line of pid 9")
    assert "pid 9" in f.problem
    assert "--scheduling-policy priority" in f.advice
    assert "workers.gen0.priority_scheduling: false" in f.advice


# ----- roles -----


def test_roles() -> None:
    emb = worker(role="embeddings")
    assert check_role(emb, facts(generates=None, embeds=True)) == []
    (f,) = check_role(emb, facts(generates=None, embeds=False, probe_note="HTTP 404: Not Found"))
    assert f.level == "error" and "HTTP 404" in f.problem and "--runner pooling" in f.advice
    assert levels(check_role(emb, facts(generates=None, embeds=None))) == ["warning"]
    assert check_role(worker(), facts()) == []
    (g,) = check_role(worker(), facts(generates=False, probe_note="HTTP 404: Not Found"))
    assert g.level == "error" and "role: embeddings" in g.advice


# ----- the whole comparison and the report -----


def test_unreachable_worker_is_one_error_with_advice() -> None:
    found = compare(worker(), WorkerFacts(unreachable="Cannot connect"), settings())
    assert levels(found) == ["error"]
    assert "not reachable at http://vllm:8000" in found[0].problem
    assert "systemctl status" in found[0].advice


def test_compare_lists_errors_first_and_checks_each_model_length() -> None:
    w = worker(models=["llama", "tiny"], priority_scheduling=False)
    f = facts(("llama", 1100), ("tiny", 200), ("extra", 4096), policy="priority")
    found = compare(w, f, settings(w))
    assert levels(found) == ["error", "warning", "warning", "note"]


def test_matching_worker_has_no_findings() -> None:
    w = worker(priority_scheduling=True)
    assert compare(w, facts(("llama", 8192), policy="priority"), settings(w)) == []


def test_report_names_each_worker_and_counts() -> None:
    ok, bad = worker(), worker(name="emb0", url="http://e:1", role="embeddings")
    s = settings(ok, bad)
    results = [
        (ok, facts(("llama", 4096)), compare(ok, facts(("llama", 4096)), s)),
        (bad, WorkerFacts(unreachable="refused"), compare(bad, WorkerFacts(unreachable="x"), s)),
    ]
    text = format_report(results)
    assert "gen0 http://vllm:8000: ok: serves llama (max_model_len 4096); generates;" in text
    assert "scheduling fcfs (command line of pid 1)" in text
    assert "emb0 http://e:1: PROBLEM: unreachable" in text
    assert "    fix: start it" in text
    assert text.endswith("live check: 2 workers, 1 error, 0 warnings")


def test_a_worker_that_does_not_generate_gets_only_the_role_error() -> None:
    w = worker()
    f = facts(("llama", 100), generates=False, probe_note="HTTP 404: Not Found")
    (only,) = compare(w, f, settings(w))
    assert "does not run a text generation model" in only.problem


@pytest.mark.parametrize("role", ["transcription", "speech"])
def test_speech_workers_are_not_probed_nor_held_to_text_lengths(role: str) -> None:
    w = worker(role=role)
    assert check_role(w, WorkerFacts(models=[])) == []
    # Whisper's 448 positions are its own; no text prompt of the settings reaches it.
    assert check_context(w, 448, 1024, 256) == []
