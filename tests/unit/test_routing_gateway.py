"""The gateway side of routing: settings, model aliases, worker roles in snapshots, passive
drop detection, per-worker metrics."""

from __future__ import annotations

import json

import pytest
from prometheus_client import generate_latest

from hearthgate.gateway.metrics import GatewayMetrics, WorkerCollector
from hearthgate.gateway.parse import parse_body
from hearthgate.gateway.proxy import model_swap, swap_model, upstream_body
from hearthgate.gateway.scheduling import routing_policy
from hearthgate.gateway.settings import Health, Settings, SettingsError, Worker, load_settings
from hearthgate.gateway.workers import WorkerPool, WorkerState
from hearthgate.policies.routing import RoutingPolicy, RoutingWeights


def settings(**extra: object) -> Settings:
    workers = [{"name": "w", "url": "http://127.0.0.1:1", "models": ["m"]}]
    return load_settings(None, workers=workers, **extra)


def test_routing_settings_default_and_translate() -> None:
    s = settings()
    assert s.routing.long_prefill_min_tokens == 1024
    assert routing_policy(s) == RoutingPolicy(1024, RoutingWeights(1.0, 1.0, 1.0), 1.0)
    s = settings(
        routing={
            "long_prefill_min_tokens": None,
            "weights": {"in_flight": 2, "waiting": 0.5, "kv": 0},
            "unknown_load": 0.5,
        }
    )
    assert routing_policy(s) == RoutingPolicy(None, RoutingWeights(2.0, 0.5, 0.0), 0.5)


@pytest.mark.parametrize(
    ("routing", "needle"),
    [
        ({"long_prefill_min_tokens": 0}, "routing.long_prefill_min_tokens"),
        ({"weights": {"kv": -1}}, "routing.weights.kv"),
        ({"weights": {"queue": 1}}, "routing.weights.queue: unknown key"),
        ({"unknown_load": 3}, "routing.unknown_load"),
    ],
)
def test_bad_routing_settings_name_the_key(routing: dict[str, object], needle: str) -> None:
    with pytest.raises(SettingsError, match=needle.replace(".", r"\.")):
        settings(routing=routing)


def test_upstream_models_must_name_a_served_model() -> None:
    w = Worker(name="w", url="http://x", models=["llama"], upstream_models={"llama": "tl"})
    assert w.upstream_model("llama") == "tl" and w.upstream_model("other") == "other"
    with pytest.raises(ValueError, match="not in this worker's models"):
        Worker(name="w", url="http://x", models=["llama"], upstream_models={"gpt": "tl"})
    with pytest.raises(ValueError, match="empty upstream name"):
        Worker(name="w", url="http://x", models=["llama"], upstream_models={"llama": ""})


def test_logical_models_are_listed_once() -> None:
    s = load_settings(
        None,
        workers=[
            {"name": "a", "url": "http://x", "models": ["llama"]},
            {
                "name": "b",
                "url": "http://y",
                "models": ["llama", "minilm"],
                "upstream_models": {"llama": "tiny-llama-lp"},
                "role": "long_prefill",
            },
        ],
    )
    assert s.models() == ["llama", "minilm"]


def test_model_is_renamed_for_the_worker_and_back() -> None:
    spec = Worker(name="w", url="http://x", models=["llama"], upstream_models={"llama": "up"})
    worker = WorkerState(spec)
    parsed = parse_body(b'{"model": "llama", "prompt": "hi", "stream": true}', "completions")
    body = json.loads(upstream_body(parsed, worker, None))
    assert body["model"] == "up"
    swap = model_swap(parsed.model, worker)
    assert swap == (b'"up"', b'"llama"')
    chunk = b'data: {"id":"x","model":"up","choices":[{"text":"up"}]}\n\n'
    assert (
        swap_model(chunk, swap) == b'data: {"id":"x","model":"llama","choices":[{"text":"up"}]}\n\n'
    )
    assert swap_model(b'{"model": "up"}', swap) == b'{"model": "llama"}'
    plain = WorkerState(Worker(name="p", url="http://x", models=["llama"]))
    assert model_swap(parsed.model, plain) is None
    assert json.loads(upstream_body(parsed, plain, None))["model"] == "llama"


def test_snapshots_carry_the_role_and_drops_mark_down_after_two_in_a_row() -> None:
    specs = [
        Worker(name="g", url="http://127.0.0.1:1", models=["m"]),
        Worker(name="l", url="http://127.0.0.1:2", models=["m"], role="long_prefill"),
    ]
    pool = WorkerPool(specs, Health(), GatewayMetrics(["m"]))
    assert [s.role for s in pool.snapshots()] == ["general", "long_prefill"]
    g = pool.by_name["g"]
    pool.note_dropped(g)
    pool.note_answered(g)
    pool.note_dropped(g)
    assert g.up is not False  # not in a row
    pool.note_dropped(g)
    assert g.up is False and "2 connections in a row" in (g.last_error or "")


def test_worker_metrics_show_role_gauges_and_counts() -> None:
    specs = [
        Worker(name="g", url="http://127.0.0.1:1", models=["m"]),
        Worker(name="e", url="http://127.0.0.1:2", models=["e"], role="embeddings"),
    ]
    metrics = GatewayMetrics(["m", "e"])
    pool = WorkerPool(specs, Health(), metrics)
    metrics.registry.register(WorkerCollector(pool.rows))
    g = pool.by_name["g"]
    g.scraped_waiting, g.scraped_running, g.kv_usage = 2.0, 3.0, 0.25
    g.failovers = 1
    pool.acquire(g)
    text = generate_latest(metrics.registry).decode()
    assert 'hearthgate_worker_info{role="embeddings",worker="e"} 1.0' in text
    assert 'hearthgate_worker_scraped_waiting{worker="g"} 2.0' in text
    assert 'hearthgate_worker_scraped_running{worker="g"} 3.0' in text
    assert 'hearthgate_worker_kv_usage{worker="g"} 0.25' in text
    assert 'hearthgate_worker_kv_usage{worker="e"}' not in text  # unknown: absent, not 0
    assert 'hearthgate_worker_served_total{worker="g"} 1.0' in text
    assert 'hearthgate_worker_failovers_total{worker="g"} 1.0' in text
    assert 'hearthgate_in_flight{worker="g"} 1.0' in text
    st = {w["name"]: w for w in pool.status()}
    assert st["g"]["waiting"] == 2.0 and st["g"]["kv_usage"] == 0.25
    assert st["e"]["waiting"] is None and st["g"]["role"] == "general"


def test_run_local_layouts_pin_the_workers() -> None:
    from hearthgate.deploy import box
    from hearthgate.deploy.run_local import layout_config, plan_workers, prefill_threshold
    from hearthgate.deploy.vllm_worker import VllmWorker

    single = load_settings(layout_config("deploy/settings.example.yaml", "single"))
    # Generation alone on core 0; embeddings, speech to text, rerank and speech on core 1.
    assert [(w.kind, w.port, w.core) for w in plan_workers(single)] == [
        ("gen", 8000, 0),
        ("embed", 8001, 1),
        ("stt", 8003, 1),
        ("rerank", 8004, 1),
        ("tts", 8005, 1),
    ]
    split = load_settings(layout_config("deploy/settings.example.yaml", "split"))
    assert [(w.name, w.role) for w in split.workers] == [
        ("gen0", "general"),
        ("gen1", "long_prefill"),
        ("emb0", "embeddings"),
    ]
    # Three processes, two cores: the embeddings worker shares the long-prefill one's.
    assert [(w.kind, w.port, w.core) for w in plan_workers(split)] == [
        ("gen", 8000, 0),
        ("gen", 8002, 1),
        ("embed", 8001, 1),
    ]
    assert split.classes == single.classes and split.apps == single.apps
    # Shorter prefill steps on the worker voice shares (1,024 tokens, chunks.md), at most
    # 384 of them for one prompt while others run or wait with AVX-512, 64 without
    # (prefill-threshold.md, threshold-steps.md, threshold-64-heavy.md); the long-prefill
    # worker keeps vLLM's default, the embeddings worker is not chunked.
    assert (prefill_threshold(True), prefill_threshold(False)) == (384, 64)
    most = str(prefill_threshold(bool(box.describe()["avx512"])))  # this box's
    step = ["--max-num-batched-tokens", "1024", "--long-prefill-token-threshold", most]
    assert [getattr(w, "extra_args", None) for w in plan_workers(split)] == [tuple(step), (), ()]
    first = plan_workers(single)[0]
    assert isinstance(first, VllmWorker) and first.extra_args == tuple(step)


def test_run_local_gives_the_gateway_its_box_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hearthgate.deploy.run_local import gateway_environment

    var = "HEARTHGATE_SCHEDULER__PACING__BACKGROUND_PREFILL"
    monkeypatch.delenv(var, raising=False)
    shipped = load_settings("deploy/settings.example.yaml")
    # The gateway's own default, which the example leaves to the box:
    assert shipped.scheduler.pacing.background_prefill is None
    assert gateway_environment(shipped, avx512=False) == {var: "1"}
    assert gateway_environment(shipped, avx512=True) == {}
    # What the settings name themselves stays theirs: in the file (null included) ...
    for own in (2, None):
        named = load_settings(
            "deploy/settings.example.yaml",
            scheduler={"pacing": {"background_prefill": own}},
        )
        assert gateway_environment(named, avx512=False) == {}
    # ... or in the environment.
    monkeypatch.setenv(var, "3")
    from_env = load_settings("deploy/settings.example.yaml")
    assert from_env.scheduler.pacing.background_prefill == 3
    assert gateway_environment(from_env, avx512=False) == {}
    # The variables it sets are ones the gateway reads.
    monkeypatch.setenv(var, "1")
    assert load_settings("deploy/settings.example.yaml").scheduler.pacing.background_prefill == 1
