"""The `hearthgate bench` CLI end to end against the fake server, and the target launcher."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from hearthgate.loadtests.cli import main
from hearthgate.loadtests.fakeserver import FakeConfig, serve_in_thread
from hearthgate.loadtests.launcher import Launcher
from hearthgate.loadtests.scenario import load_scenario
from hearthgate.loadtests.targets import TargetError, TargetsFile, load_targets
from hearthgate.loadtests.workload import plan

SCENARIO: dict[str, Any] = {
    "name": "cli-test",
    "seed": 1,
    "duration_s": 0.6,
    "warmup_s": 0.15,
    "prime_requests": 1,
    "apps": {"a": {"key": "ka"}, "flood": {"key": "kf"}},
    "classes": {
        "chat": {"slo": {"ttft_s": 0.5, "itl_s": 0.05}, "interactive": True},
        "batch": {},
    },
    "flows": [
        {
            "class": "chat",
            "app": "a",
            "endpoint": "chat",
            "prompt_tokens": {"dist": "uniform", "min": 10, "max": 30},
            "output_tokens": 6,
            "arrival": {"process": "poisson", "rate": 12},
        },
        {
            "class": "chat",
            "app": "flood",
            "endpoint": "completions",
            "prompt_tokens": 40,
            "output_tokens": 6,
            "arrival": {"process": "gamma", "rate": 20, "burstiness": 0.5},
        },
        {
            "class": "batch",
            "app": "a",
            "endpoint": "completions",
            "stream": False,
            "prompt_tokens": 40,
            "output_tokens": 16,
            "arrival": {"process": "constant", "rate": 4},
        },
    ],
}


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    p = tmp_path / "cli-test.yaml"
    p.write_text(yaml.safe_dump(SCENARIO))
    return p


def _check_consistent(summary: dict[str, Any], planned: int) -> None:
    for t in summary["targets"].values():
        run = t["run"]
        assert run["requests"] + run["warmup_requests"] == planned
        assert run["requests"] == run["completed"] + run["rejected"] + run["failed"]
        total = 0
        for cs in t["classes"].values():
            assert cs["requests"] == cs["completed"] + cs["rejected"] + cs["failed"]
            assert cs["good"] <= cs["completed"]
            total += cs["requests"]
            for key in (
                "attainment",
                "completed",
                "rejected",
                "failed",
                "ttft_p50_s",
                "ttft_p99_s",
                "output_tokens_per_s",
            ):
                assert key in cs
        assert total == run["requests"]


def test_validate_and_plan(scenario_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(scenario_file), "home-mix"]) == 0
    assert main(["plan", str(scenario_file), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out.split("\n", 2)[-1])
    assert {r["flow"] for r in rows} == {"chat/a", "chat/flood", "batch/a"}
    bad = scenario_file.with_name("bad.yaml")
    bad.write_text(yaml.safe_dump({**SCENARIO, "duration_s": -1}))
    assert main(["validate", str(bad)]) == 1
    assert "duration_s: Input should be greater than 0" in capsys.readouterr().err
    assert main(["plan", str(bad)]) == 2


def test_run_writes_consistent_outputs(scenario_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cfg = FakeConfig(reject_keys=frozenset({"kf"}))
    with serve_in_thread(cfg) as (url, state):
        code = main(
            [
                "run",
                str(scenario_file),
                "--url",
                url,
                "--name",
                "fake",
                "--out",
                str(out),
                "--worker-metrics",
                url + "/metrics",
                "--no-progress",
            ]
        )
    assert code == 0
    summary = json.loads((out / "cli-test.summary.json").read_text())
    planned = len(plan(load_scenario(scenario_file)))
    assert len(state.received) == planned + 3  # and one warm-up request per flow
    _check_consistent(summary, planned)
    chat = summary["targets"]["fake"]["classes"]["chat"]
    assert chat["rejected"] > 0  # the flooding app's requests
    assert chat["attainment"] < 1.0
    assert summary["targets"]["fake"]["classes"]["batch"]["attainment"] == 1.0
    assert summary["calibration"]["endpoints"]["chat"]["overhead_tokens"] == 5
    assert (out / "cli-test.md").read_text().startswith("# Load test: cli-test")
    records = (out / "raw" / "cli-test" / "fake.records.jsonl").read_text().splitlines()
    assert len(records) == planned
    # `report` recomputes the same numbers from the raw records.
    again = tmp_path / "again"
    assert main(["report", str(out / "raw" / "cli-test"), "--out", str(again), "--no-plots"]) == 0
    rebuilt = json.loads((again / "cli-test.summary.json").read_text())
    assert rebuilt["targets"]["fake"]["classes"] == summary["targets"]["fake"]["classes"]


def test_compare_url_targets_with_repeats(scenario_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    with serve_in_thread() as (a, _), serve_in_thread(FakeConfig(ttft_s=0.55)) as (b, _):
        code = main(
            [
                "compare",
                str(scenario_file),
                "--target",
                f"fast={a}",
                "--target",
                f"slow={b}",
                "--repeat",
                "2",
                "--no-prime",
                "--no-calibrate",
                "--no-plots",
                "--no-progress",
                "--out",
                str(out),
                "--tag",
                "cmp",
                "--duration",
                "0.4",
                "--warmup",
                "0.1",
            ]
        )
    assert code == 0
    summary = json.loads((out / "cmp.summary.json").read_text())
    assert list(summary["targets"]) == ["fast", "slow"]
    fast, slow = summary["targets"]["fast"], summary["targets"]["slow"]
    assert fast["repeats"] == 2 and len(summary["runs"]["fast"]) == 2
    assert fast["classes"]["chat"]["attainment"] > 0.5  # generous: a busy CI machine
    assert slow["classes"]["chat"]["attainment"] == 0.0  # TTFT 550 ms > 500 ms
    raw = out / "raw" / "cmp"
    assert {p.name for p in raw.glob("*.records.jsonl")} == {
        "fast@1.records.jsonl",
        "fast@2.records.jsonl",
        "slow@1.records.jsonl",
        "slow@2.records.jsonl",
    }


def test_sweep_finds_capacity(tmp_path: Path) -> None:
    # Targets loose enough that a loaded test machine cannot miss them with the fake server:
    # this checks the sweep's bookkeeping, not anyone's speed.
    loose = {**SCENARIO, "classes": {**SCENARIO["classes"]}}
    loose["classes"]["chat"] = {"slo": {"ttft_s": 5.0, "itl_s": 2.0}, "interactive": True}
    scenario_file = tmp_path / "cli-test.yaml"
    scenario_file.write_text(yaml.safe_dump(loose))
    out = tmp_path / "sw"
    with serve_in_thread() as (a, _):
        code = main(
            [
                "sweep",
                str(scenario_file),
                "--target",
                f"fake={a}",
                "--rates",
                "0.5,1",
                "--no-prime",
                "--no-calibrate",
                "--no-plots",
                "--no-progress",
                "--no-raw",
                "--out",
                str(out),
            ]
        )
    assert code == 0
    summary = json.loads((out / "cli-test-sweep.summary.json").read_text())
    t = summary["targets"]["fake"]
    assert [p["rate_scale"] for p in t["points"]] == [0.5, 1.0]
    assert t["capacity_rate_scale"] == 1.0
    assert summary["recommended"] == "fake"
    point = t["points"][0]
    assert point["interactive_attainment_runs"] == [point["interactive_attainment"]]
    assert len(point["background_output_tokens_per_s_runs"]) == 1
    interactive = summary["latency_classes"]
    assert interactive and all(c in point["classes"] for c in interactive)
    assert all("tpot_p50_s" in cs for cs in point["classes"].values())
    md = (out / "cli-test-sweep.md").read_text()
    assert f"{interactive[0]} TPOT p50 (ms)" in md


def test_bad_arguments(scenario_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(scenario_file), "--targets", "/nope.yaml"]) == 2
    assert "no such targets file" in capsys.readouterr().err
    assert main(["run", "no-such-scenario", "--url", "http://x"]) == 2
    with pytest.raises(SystemExit):
        main(["compare", str(scenario_file), "--repeat", "0"])


# ---------------------------------------------------------------- launcher


class FakeWorker:
    def __init__(self, log: list[str], kind: str, port: int, args: Sequence[str]) -> None:
        self.log, self.kind, self.port, self.args = log, kind, port, tuple(args)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.log.append(f"start {self.kind} {' '.join(self.args)}".strip())

    def wait_ready(self, timeout: float = 0, interval: float = 0) -> float:
        return 0.0

    def stop(self, timeout: float = 0) -> int | None:
        self.log.append(f"stop {self.kind}")
        return 0


def test_launcher_reuses_workers_and_restarts_on_new_flags() -> None:
    tf = load_targets("local")
    events: list[str] = []

    def factory(
        kind: str, port: int, core: int | str, log: Path, args: Sequence[str], **_: Any
    ) -> Any:
        return FakeWorker(events, kind, port, args)

    vllm_only = tf.model_copy(update={"targets": [t for t in tf.targets if t.kind == "vllm"]})
    with Launcher(vllm_only, need_embed=True, worker_factory=factory, log=lambda m: None) as la:
        fcfs = la.up(vllm_only.targets[0])
        assert la.restarted
        assert fcfs.base_url == "http://127.0.0.1:18210"
        assert fcfs.embed_url == "http://127.0.0.1:18211"
        assert fcfs.worker_metrics == "http://127.0.0.1:18210/metrics"
        assert not fcfs.send_priority
        prio = la.up(vllm_only.targets[1])
        assert prio.send_priority and la.restarted
    assert events == [
        "start gen",
        "start embed",
        "stop gen",
        "start gen --scheduling-policy priority",
        "stop gen",
        "stop embed",
    ]


def _noting_factory(events: list[str], key: str) -> Any:
    """A worker factory that notes each worker's kind and keyword ``key``."""

    def factory(
        kind: str, port: int, core: int | str, log: Path, args: Sequence[str], **kw: Any
    ) -> Any:
        events.append(f"{kind} {key}={kw[key]}")
        return FakeWorker(events, kind, port, args)

    return factory


def test_launcher_moves_the_api_server_where_a_target_says() -> None:
    tf = TargetsFile.model_validate(
        {
            "gen_worker": {"port": 18210, "core": 1},
            "targets": [
                {"name": "stays", "kind": "vllm"},
                {"name": "moved", "kind": "vllm", "api_server_core": 0},
            ],
        }
    )
    events: list[str] = []
    factory = _noting_factory(events, "api_server_core")
    stays, moved = tf.targets
    with Launcher(tf, need_embed=False, worker_factory=factory, log=lambda m: None) as la:
        la.up(stays)
        la.up(moved)
        assert la.restarted  # a worker started the other way is not reused
        la.up(moved)
        assert not la.restarted
    assert events == [
        "gen api_server_core=None",
        "start gen",
        "stop gen",
        "gen api_server_core=0",
        "start gen",
        "stop gen",
    ]


def test_launcher_restarts_the_workers_when_their_sessions_are_pinned_otherwise() -> None:
    tf = load_targets("pinned-sessions")
    events: list[str] = []
    factory = _noting_factory(events, "pin_session")
    fcfs, unpinned = tf.targets[:2]
    assert fcfs.pin_worker_sessions and not unpinned.pin_worker_sessions
    assert fcfs.args_for("gen0") == unpinned.args_for("gen0")
    with Launcher(tf, need_embed=False, worker_factory=factory, log=lambda m: None) as la:
        la.up(fcfs)
        la.up(fcfs)
        assert not la.restarted
        la.up(unpinned)
        assert la.restarted
    assert events == [
        "gen pin_session=True",
        "start gen",
        "stop gen",
        "gen pin_session=False",
        "start gen",
        "stop gen",
    ]


def test_gateway_settings_point_at_started_workers() -> None:
    tf = load_targets("local")
    gw = next(t for t in tf.targets if t.kind == "gateway")
    la = Launcher(tf, need_embed=True, log=lambda m: None)
    s = la.gateway_settings(gw, "http://127.0.0.1:18210", "http://127.0.0.1:18211")
    assert s["listen"] == {"host": "127.0.0.1", "port": 18220}
    assert [w["role"] for w in s["workers"]] == ["general", "embeddings"]
    assert s["workers"][0]["priority_scheduling"] is False
    assert s["log_level"] == "warning"
    # The generated file is a valid gateway settings file.
    from hearthgate.gateway.settings import Settings

    Settings.model_validate(s)


def test_targets_file_errors(tmp_path: Path) -> None:
    p = tmp_path / "t.yaml"
    p.write_text(yaml.safe_dump({"targets": [{"name": "x", "kind": "url"}]}))
    with pytest.raises(TargetError, match="needs `url`"):
        load_targets(p)
    p.write_text(
        yaml.safe_dump(
            {
                "targets": [
                    {"name": "x", "kind": "url", "url": "http://a"},
                    {"name": "x", "kind": "url", "url": "http://b"},
                ]
            }
        )
    )
    with pytest.raises(TargetError, match="repeated: x"):
        load_targets(p)
    with pytest.raises(TargetError, match="only for kind gateway"):
        p.write_text(yaml.safe_dump({"targets": [{"name": "x", "kind": "vllm", "config": "c"}]}))
        load_targets(p)


def test_shipped_scenarios_have_gateway_keys() -> None:
    sc = load_scenario("home-mix")
    assert {a.key_env for a in sc.apps.values()} >= {"ASSISTANT_KEY", "NOTES_KEY"}
