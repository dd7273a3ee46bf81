"""Scenario loading: shipped files validate; bad files fail with errors naming the key."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from hearthgate.loadtests.scenario import (
    SHIPPED_DIR,
    FixedLength,
    ScenarioError,
    load_scenario,
    validate_scenario,
)

BASE: dict[str, Any] = {
    "name": "t",
    "duration_s": 10,
    "warmup_s": 2,
    "apps": {"a": {"key": "ka"}, "b": {"key_env": "B_KEY"}},
    "classes": {"chat": {"slo": {"ttft_s": 0.5, "itl_s": 0.05}, "interactive": True}},
    "flows": [
        {
            "class": "chat",
            "app": "a",
            "endpoint": "chat",
            "prompt_tokens": 40,
            "output_tokens": {"dist": "uniform", "min": 8, "max": 16},
            "arrival": {"process": "poisson", "rate": 2},
        }
    ],
}


def _with(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    node = data
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


_DELETE = object()


@pytest.mark.parametrize("name", ["home-mix", "noisy-neighbour", "rag-burst", "embed-backlog"])
def test_shipped_scenarios_validate(name: str) -> None:
    sc = load_scenario(name)
    assert sc.name == name
    assert sc.warmup_s < sc.duration_s
    assert any(c.interactive for c in sc.classes.values())


def test_every_shipped_file_is_listed() -> None:
    names = {p.stem for p in SHIPPED_DIR.glob("*.yaml")}
    assert {"home-mix", "noisy-neighbour", "rag-burst", "embed-backlog"} <= names


def test_shorthand_and_defaults() -> None:
    sc = validate_scenario(BASE)
    flow = sc.flows[0]
    assert flow.prompt_tokens == FixedLength(value=40)
    assert flow.streams is True
    assert flow.label == "chat/a"
    assert sc.model_for(flow) == "tiny-llama"
    assert sc.apps["a"].resolve_key("a", {}) == "ka"
    assert sc.apps["b"].resolve_key("b", {"B_KEY": "secret"}) == "secret"
    assert sc.apps["b"].resolve_key("b", {}) == "b"


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (
            ("flows", 0, "arrival", "rate"),
            0,
            "flows[0].arrival.rate: Input should be greater than 0",
        ),
        (("flows", 0, "arrival", "process"), "poison", "flows[0].arrival: Input tag 'poison'"),
        (("flows", 0, "class"), "voice", "class 'voice' is not defined in classes"),
        (("flows", 0, "app"), "nobody", "app 'nobody' is not defined in apps"),
        (("flows", 0, "output_tokens"), _DELETE, "output_tokens is required for the chat"),
        (("flows", 0, "endpoint"), "embeddings", "output_tokens is not allowed"),
        (("flows", 0, "prompt_tokens"), {"dist": "uniform", "min": 9, "max": 3}, "min (9)"),
        (("flows", 0, "prompt_tokens"), 5000, "exceeds max_model_len (4096)"),
        (("flows", 0, "surprise"), 1, "flows[0].surprise: Extra inputs are not permitted"),
        (("warmup_s",), 10, "warmup_s (10.0) must be shorter than duration_s"),
        (("duration_s",), _DELETE, "duration_s: Field required"),
        (("flows",), [], "flows: List should have at least 1 item"),
        (("classes", "chat", "slo", "itl_stat"), "p42", "classes.chat.slo.itl_stat"),
        (
            ("flows", 0, "prompt_tokens"),
            {"dist": "trace", "path": "/nope.csv", "column": "x"},
            "trace file not found",
        ),
    ],
)
def test_validation_errors_name_the_key(path: tuple[Any, ...], value: Any, message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        validate_scenario(_with(path, value), source="t.yaml")
    assert message in str(err.value)
    assert str(err.value).startswith("t.yaml: ")


def test_embeddings_cannot_stream() -> None:
    data = copy.deepcopy(BASE)
    data["flows"][0].update(endpoint="embeddings", stream=True)
    del data["flows"][0]["output_tokens"]
    with pytest.raises(ScenarioError, match="cannot stream"):
        validate_scenario(data)


def test_duplicate_flow_names() -> None:
    data = copy.deepcopy(BASE)
    data["flows"].append(copy.deepcopy(data["flows"][0]))
    with pytest.raises(ScenarioError, match="duplicate flow name 'chat/a'"):
        validate_scenario(data)


def test_load_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ScenarioError, match=r"bad\.yaml: invalid YAML"):
        load_scenario(bad)
    with pytest.raises(ScenarioError, match="no such scenario file"):
        load_scenario(tmp_path / "missing.yaml")
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n")
    with pytest.raises(ScenarioError, match="expected a mapping"):
        load_scenario(listy)


def test_trace_path_relative_to_scenario(tmp_path: Path) -> None:
    (tmp_path / "trace.csv").write_text("i,o\n5,6\n")
    data = copy.deepcopy(BASE)
    data["flows"][0]["prompt_tokens"] = {"dist": "trace", "path": "trace.csv", "column": "i"}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    sc = load_scenario(tmp_path / "s.yaml")
    assert sc.flows[0].prompt_tokens.upper() == 5


def test_overrides_scale_rates_and_drop_late_flows() -> None:
    data = copy.deepcopy(BASE)
    late = copy.deepcopy(data["flows"][0])
    late.update(name="late", start_s=8)
    data["flows"].append(late)
    sc = validate_scenario(data)
    scaled = sc.with_overrides(rate_scale=2.0, seed=9)
    assert [f.arrival.rate for f in scaled.flows] == [4.0, 4.0]
    assert scaled.seed == 9
    shorter = sc.with_overrides(duration_s=5)
    assert [f.label for f in shorter.flows] == ["chat/a"]
    assert shorter.warmup_s == 2
    with pytest.raises(ScenarioError, match="rate scale"):
        sc.with_overrides(rate_scale=-1)


def test_overrides_leave_classes_or_apps_out() -> None:
    sc = load_scenario("home-mix")
    no_embed = sc.with_overrides(without={"embed"})
    assert "embed" not in no_embed.classes
    assert {f.klass for f in no_embed.flows} == {"voice", "chat", "rag", "batch"}
    solo = load_scenario("noisy-neighbour").with_overrides(without_apps={"scraper"})
    assert [f.app for f in solo.flows] == ["chatui"] and set(solo.apps) == {"chatui"}
    with pytest.raises(ScenarioError, match="no such class"):
        sc.with_overrides(without={"nope"})
    with pytest.raises(ScenarioError, match="no such app"):
        sc.with_overrides(without_apps={"nope"})
