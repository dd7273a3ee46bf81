"""Several generation workers in the bench launcher: targets files with `gen_workers`, the
gateway settings built for them, vLLM alone behind the client's round-robin split, and the
summed worker metrics. Fake workers only (no vLLM)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from hearthgate.gateway.settings import Settings
from hearthgate.loadtests.cli import main
from hearthgate.loadtests.fakeserver import FakeState, serve, serve_in_thread
from hearthgate.loadtests.launcher import Launcher
from hearthgate.loadtests.matrix import target_info
from hearthgate.loadtests.runner import Endpoints, prime, run_workload
from hearthgate.loadtests.sampler import Sampler, Source, combine_workers
from hearthgate.loadtests.scenario import load_scenario, validate_scenario
from hearthgate.loadtests.targets import (
    TargetError,
    TargetsFile,
    TargetSpec,
    load_targets,
)
from hearthgate.loadtests.workload import plan, priming_plan

URLS = {"gen0": "http://127.0.0.1:18210", "gen1": "http://127.0.0.1:18212"}

SCENARIO: dict[str, Any] = {
    "name": "rr",
    "seed": 5,
    "duration_s": 0.8,
    "warmup_s": 0.1,
    "prime_requests": 2,
    "apps": {"a": {"key": "ka"}, "n": {"key": "kn"}},
    "classes": {"chat": {"interactive": True}, "rag": {}, "embed": {}},
    "flows": [
        {
            "class": "chat",
            "app": "a",
            "endpoint": "chat",
            "prompt_tokens": {"dist": "uniform", "min": 5, "max": 20},
            "output_tokens": 3,
            "arrival": {"process": "poisson", "rate": 25},
        },
        {
            "class": "rag",
            "app": "n",
            "endpoint": "completions",
            "prompt_tokens": 60,
            "output_tokens": 2,
            "arrival": {"process": "constant", "rate": 10},
        },
        {
            "class": "embed",
            "app": "n",
            "endpoint": "embeddings",
            "prompt_tokens": 8,
            "arrival": {"process": "constant", "rate": 5},
        },
    ],
}


class FakeWorker:
    def __init__(
        self, events: list[str], kind: str, port: int, core: int | str, args: Sequence[str]
    ) -> None:
        self.events, self.kind, self.port, self.core = events, kind, port, core
        self.args = tuple(args)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        flags = " ".join(self.args)
        self.events.append(f"start {self.kind} {self.port} core {self.core} {flags}".strip())

    def wait_ready(self, timeout: float = 0, interval: float = 0) -> float:
        return 0.0

    def stop(self, timeout: float = 0) -> int | None:
        self.events.append(f"stop {self.kind} {self.port}")
        return 0


def fake_launcher(
    tf: TargetsFile, events: list[str], settings: dict[str, dict[str, Any]], need_embed: bool
) -> Launcher:
    """A launcher with fake workers and no gateway process: the settings it would start the
    gateway with are kept in `settings` by target name."""

    def factory(
        kind: str, port: int, core: int | str, log: Path, args: Sequence[str], **_: Any
    ) -> Any:
        return FakeWorker(events, kind, port, core, args)

    la = Launcher(tf, need_embed=need_embed, worker_factory=factory, log=lambda m: None)

    def start_gateway(target: TargetSpec, gen_urls: dict[str, str], embed_url: str | None) -> str:
        settings[target.name] = la.gateway_settings(target, gen_urls, embed_url)
        events.append(f"gateway {target.name}")
        return f"http://127.0.0.1:{tf.gateway_port}"

    la._start_gateway = start_gateway  # type: ignore[method-assign]
    return la


# ---------------------------------------------------------------- targets files


def test_two_workers_file_validates() -> None:
    tf = load_targets("two-workers")
    gens = tf.generation_workers()
    assert [(w.name, w.port, w.core) for w in gens] == [("gen0", 18210, 0), ("gen1", 18212, 1)]
    assert tf.gateway_core is None and tf.client_core is None  # no free core to pin them to
    assert [(t.name, t.kind) for t in tf.targets] == [
        ("vllm-rr", "vllm"),
        ("gateway-ll", "gateway"),
        ("gateway-split", "gateway"),
    ]
    # All three share the workers' flags: the workers start once for the whole comparison.
    assert {tuple(t.args_for(w.name or "")) for t in tf.targets for w in gens} == {()}
    # The benchmark's scenario has no embeddings flow, so no embeddings worker is needed.
    sc = load_scenario("home-mix").with_overrides(without={"embed"})
    assert not any(f.endpoint == "embeddings" for f in sc.flows)


def test_one_worker_form_still_works() -> None:
    local = load_targets("local")
    assert local.gen_workers is None
    assert [(w.name, w.port, w.core) for w in local.generation_workers()] == [("gen0", 18210, 1)]
    assert TargetsFile(targets=[TargetSpec(name="v", kind="vllm")]).generation_workers()[0].name
    # A one-entry list is the same single worker: no round-robin.
    tf = TargetsFile.model_validate(
        {"gen_workers": [{"port": 18300, "core": 0}], "targets": [{"name": "v", "kind": "vllm"}]}
    )
    events: list[str] = []
    with fake_launcher(tf, events, {}, need_embed=False) as la:
        ep = la.up(tf.targets[0])
    assert ep.base_url == "http://127.0.0.1:18300" and ep.base_urls == ()
    assert ep.more_worker_metrics == ()
    assert events == ["start gen 18300 core 0", "stop gen 18300"]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (
            {
                "gen_worker": {"port": 18210, "core": 0},
                "gen_workers": [{"port": 18212, "core": 1}],
            },
            "either `gen_worker` or `gen_workers`",
        ),
        (
            {
                "gen_workers": [
                    {"name": "a", "port": 1, "core": 0},
                    {"name": "a", "port": 2, "core": 1},
                ]
            },
            "repeated: a",
        ),
        (
            {"gen_workers": [{"port": 18210, "core": 0}, {"port": 18210, "core": 1}]},
            "distinct ports",
        ),
        (
            {
                "gen_workers": [{"port": 18210, "core": 0}],
                "targets": [{"name": "g", "kind": "gateway", "workers": {"gen7": {}}}],
            },
            "no generation worker named gen7",
        ),
        (
            {
                "targets": [
                    {"name": "v", "kind": "vllm", "workers": {"gen0": {"role": "long_prefill"}}}
                ]
            },
            "only for kind gateway",
        ),
        ({"gen_workers": []}, "gen_workers"),
    ],
)
def test_targets_file_errors(tmp_path: Path, data: dict[str, Any], match: str) -> None:
    data = {"targets": [{"name": "v", "kind": "vllm"}], **data}
    p = tmp_path / "t.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(TargetError, match=match):
        load_targets(p)


# ---------------------------------------------------------------- launcher


def test_launcher_starts_two_workers_once_and_builds_gateway_settings() -> None:
    tf = load_targets("two-workers")
    events: list[str] = []
    settings: dict[str, dict[str, Any]] = {}
    with fake_launcher(tf, events, settings, need_embed=False) as la:
        rr = la.up(tf.targets[0])
        assert la.restarted
        ll = la.up(tf.targets[1])
        assert not la.restarted  # same flags: the warm workers are reused
        split = la.up(tf.targets[2])
    assert events == [
        "start gen 18210 core 0",
        "start gen 18212 core 1",
        "gateway gateway-ll",
        "gateway gateway-split",
        "stop gen 18210",
        "stop gen 18212",
    ]  # and no embeddings worker
    assert rr.base_urls == (URLS["gen0"], URLS["gen1"]) and rr.base_url == URLS["gen0"]
    assert rr.embed_url is None and rr.gateway_metrics is None
    assert [s.url for s in rr.sources()] == [URLS["gen0"] + "/metrics"]
    assert rr.sources()[0].more_urls == (URLS["gen1"] + "/metrics",)
    for gw in (ll, split):
        assert gw.base_url == "http://127.0.0.1:18220" and gw.base_urls == ()
        assert gw.worker_metrics == URLS["gen0"] + "/metrics"
        assert gw.more_worker_metrics == (URLS["gen1"] + "/metrics",)

    budgets = yaml.safe_load(Path("loadtests/targets/gateway-bench.yaml").read_text())
    budgets = budgets["worker_limits"]
    for name, roles in (
        ("gateway-ll", ["general", "general"]),
        ("gateway-split", ["general", "long_prefill"]),
    ):
        s = settings[name]
        assert [(w["name"], w["url"], w["role"]) for w in s["workers"]] == [
            ("gen0", URLS["gen0"], roles[0]),
            ("gen1", URLS["gen1"], roles[1]),
        ]
        assert all(w["limits"] == budgets for w in s["workers"])  # the bench budgets on both
        assert s["listen"] == {"host": "127.0.0.1", "port": 18220}
        assert s["log_level"] == "warning" and "worker_limits" not in s
        parsed = Settings.model_validate(s)
        want = budgets["prefill_token_budget"]
        assert [w.limits.prefill_token_budget for w in parsed.workers] == [want, want]
    assert settings["gateway-split"]["routing"] == {"long_prefill_min_tokens": 1024}
    assert (
        Settings.model_validate(settings["gateway-split"]).routing.long_prefill_min_tokens == 1024
    )
    assert "routing" not in settings["gateway-ll"]


def test_a_gateway_per_point_is_started_fresh_for_every_point(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hearthgate.loadtests import bench
    from hearthgate.loadtests.matrix import Options, run_matrix

    tf = TargetsFile.model_validate(
        {
            "targets": [
                {"name": "aged", "kind": "gateway"},
                {"name": "fresh", "kind": "gateway", "gateway_per_point": True},
            ]
        }
    )
    events: list[str] = []

    def run_one(sc: Any, reqs: Any, endpoints: Endpoints, **kw: Any) -> Any:
        events.append(f"run {sc.name} on {endpoints.name}")
        return object()

    monkeypatch.setattr(bench, "run_one", run_one)
    sc = validate_scenario(SCENARIO)
    _, _, cells = run_matrix(
        [("p1", sc), ("p2", sc)],
        tf,
        Options(prime=False, calibrate=False, restart_warmup_s=0),
        launcher_factory=lambda t, **kw: fake_launcher(t, events, {}, need_embed=False),
        log=lambda m: None,
    )
    assert [(c.point, c.target) for c in cells] == [
        ("p1", "aged"),
        ("p2", "aged"),
        ("p1", "fresh"),
        ("p2", "fresh"),
    ]
    assert events == [
        "start gen 18210 core 1",
        "gateway aged",
        "run rr on aged",
        "run rr on aged",  # one gateway lives through the round's points
        "gateway fresh",
        "run rr on fresh",
        "gateway fresh",  # a new one for the second point, on the same worker
        "run rr on fresh",
        "stop gen 18210",
    ]
    with pytest.raises(ValueError, match="only for kind gateway"):
        TargetSpec(name="v", kind="vllm", gateway_per_point=True)


def test_per_worker_flags_roles_and_limits() -> None:
    tf = TargetsFile.model_validate(
        {
            "gen_workers": [{"port": 18210, "core": 0}, {"port": 18212, "core": 1}],
            "targets": [
                {"name": "plain", "kind": "vllm"},
                {
                    "name": "mixed",
                    "kind": "gateway",
                    "worker_args": ["--max-num-batched-tokens", "256"],
                    "settings": {
                        "worker_limits": {"max_in_flight": 16, "prefill_token_budget": 2048}
                    },
                    "workers": {
                        "gen1": {
                            "worker_args": ["--scheduling-policy", "priority"],
                            "role": "long_prefill",
                            "limits": {"prefill_token_budget": 8192, "max_in_flight": None},
                        }
                    },
                },
            ],
        }
    )
    events: list[str] = []
    settings: dict[str, dict[str, Any]] = {}
    with fake_launcher(tf, events, settings, need_embed=True) as la:
        la.up(tf.targets[0])
        la.up(tf.targets[1])
        assert la.restarted
    assert events == [
        "start gen 18210 core 0",
        "start gen 18212 core 1",
        "start embed 18211 core 0",
        "stop gen 18210",
        "start gen 18210 core 0 --max-num-batched-tokens 256",
        "stop gen 18212",
        "start gen 18212 core 1 --scheduling-policy priority",
        "gateway mixed",
        "stop gen 18210",
        "stop gen 18212",
        "stop embed 18211",
    ]
    gen0, gen1, emb = settings["mixed"]["workers"]
    assert (gen0["role"], gen0["priority_scheduling"]) == ("general", False)
    assert gen0["limits"] == {"max_in_flight": 16, "prefill_token_budget": 2048}
    assert (gen1["role"], gen1["priority_scheduling"]) == ("long_prefill", True)
    assert gen1["limits"] == {"prefill_token_budget": 8192}  # null removed max_in_flight
    assert emb["role"] == "embeddings"
    Settings.model_validate(settings["mixed"])
    info = target_info(tf.targets[1], 0)
    assert info["workers"] == {
        "gen1": {
            "worker_args": ["--scheduling-policy", "priority"],
            "role": "long_prefill",
            "limits": {"prefill_token_budget": 8192, "max_in_flight": None},
        }
    }
    assert "gen1: long_prefill --scheduling-policy priority" in tf.targets[1].describe()


def test_a_target_can_start_its_workers_as_make_run_does_on_this_box() -> None:
    from hearthgate.deploy.run_local import worker_flags

    general = Settings.model_validate(
        {"workers": [{"name": "g", "url": "http://127.0.0.1:8000", "models": ["m"]}]}
    ).workers[0]
    shipped = worker_flags(general)
    tf = TargetsFile.model_validate(
        {
            "gen_workers": [{"port": 18210, "core": 0}, {"port": 18212, "core": 1}],
            "targets": [
                {
                    "name": "gw",
                    "kind": "gateway",
                    "make_run_flags": True,
                    "worker_args": ["--max-num-seqs", "64"],
                    "workers": {"gen1": {"worker_args": [], "role": "long_prefill"}},
                },
            ],
        }
    )
    gw = tf.targets[0]
    assert gw.args_for("gen0") == [*shipped, "--max-num-seqs", "64"]
    assert gw.args_for("gen1") == []  # make run's long-prefill worker: vLLM's defaults
    assert target_info(gw, 0)["worker_args"] == [*shipped, "--max-num-seqs", "64"]
    assert " ".join(shipped) in gw.describe()
    with pytest.raises(ValueError, match="not for kind url"):
        TargetSpec(name="u", kind="url", url="http://x", make_run_flags=True)


@pytest.mark.parametrize("avx512", [True, False])
def test_a_make_run_target_gets_the_gateway_settings_make_run_gives_on_this_box(
    monkeypatch: pytest.MonkeyPatch, avx512: bool
) -> None:
    from hearthgate.deploy import box
    from hearthgate.deploy.run_local import gateway_defaults

    monkeypatch.setattr(box, "describe", lambda: {"avx512": avx512})
    tf = TargetsFile.model_validate(
        {
            "gen_worker": {"port": 18210, "core": 0},
            "targets": [
                {"name": "shipped", "kind": "gateway", "make_run_flags": True},
                {
                    "name": "own",
                    "kind": "gateway",
                    "make_run_flags": True,
                    "settings": {"scheduler": {"pacing": {"background_prefill": 3}}},
                },
                {"name": "bare", "kind": "gateway"},
            ],
        }
    )
    la = Launcher(tf, need_embed=False, log=lambda m: None)
    pacing = {
        t.name: la.gateway_settings(t, "http://127.0.0.1:18210", None)
        .get("scheduler", {})
        .get("pacing", {})
        for t in tf.targets
    }
    assert pacing["shipped"] == gateway_defaults(avx512).get("scheduler", {}).get("pacing", {})
    assert pacing["shipped"] == ({} if avx512 else {"background_prefill": 1})
    # The target's own settings win, key by key.
    assert pacing["own"] == {**pacing["shipped"], "background_prefill": 3}
    assert pacing["bare"] == {}  # only with make_run_flags


# ---------------------------------------------------------------- round-robin


def test_round_robin_split_is_deterministic() -> None:
    sc = validate_scenario(SCENARIO)
    reqs = plan(sc)
    ep = Endpoints("rr", "http://a", base_urls=("http://a", "http://b"), embed_url="http://e")
    first = [ep.url_for(r, i) for i, r in enumerate(reqs)]
    again = [ep.url_for(r, i) for i, r in enumerate(plan(validate_scenario(SCENARIO)))]
    assert first == again
    for i, (r, url) in enumerate(zip(reqs, first, strict=True)):
        if r.endpoint == "embeddings":
            assert url == "http://e/v1/embeddings"
        else:
            assert url == ("http://a" if i % 2 == 0 else "http://b") + r.path
    # Without base_urls everything but embeddings goes to base_url, whatever the index.
    one = Endpoints("one", "http://a")
    assert {one.url_for(r, i).split("/v1")[0] for i, r in enumerate(reqs)} == {"http://a"}


def _bodies(state: FakeState) -> list[str]:
    return [
        str(x["body"].get("prompt") or x["body"]["messages"][0]["content"]) for x in state.received
    ]


async def test_runner_sends_request_i_to_worker_i_mod_n() -> None:
    sc = validate_scenario(SCENARIO)
    reqs = plan(sc)
    async with serve() as (a, sa), serve() as (b, sb), serve() as (e, se):
        ep = Endpoints(
            "rr",
            a,
            base_urls=(a, b),
            embed_url=e,
            worker_metrics=a + "/metrics",
            more_worker_metrics=(b + "/metrics",),
        )
        result = await run_workload(sc, reqs, ep, sample_interval_s=0.1)
    assert all(r.outcome == "ok" for r in result.records)
    gen = [(i, r) for i, r in enumerate(reqs) if r.endpoint != "embeddings"]
    assert sorted(_bodies(sa)) == sorted(r.prompt for i, r in gen if i % 2 == 0)
    assert sorted(_bodies(sb)) == sorted(r.prompt for i, r in gen if i % 2 == 1)
    assert len(se.received) == sum(r.endpoint == "embeddings" for r in reqs)
    assert abs(len(sa.received) - len(sb.received)) <= len(reqs) // 4  # roughly even
    # One summed `worker` series (both workers' running counts), plus nothing else.
    assert result.samples and {s.source for s in result.samples} == {"worker"}


async def test_priming_warms_every_worker_of_the_split() -> None:
    sc = validate_scenario(SCENARIO)
    primes = priming_plan(sc)
    async with serve() as (a, sa), serve() as (b, sb), serve() as (e, se):
        ep = Endpoints("rr", a, base_urls=(a, b), embed_url=e)
        out = await prime(sc, primes, ep)
    gen = [r for r in primes if r.endpoint != "embeddings"]
    assert sorted(_bodies(sa)) == sorted(_bodies(sb)) == sorted(r.prompt for r in gen)
    assert len(se.received) == len(primes) - len(gen)  # embeddings once
    assert len(out) == 2 * len(gen) + len(se.received)


# ---------------------------------------------------------------- sampling


def test_combine_workers_sums_counts_and_averages_kv_usage() -> None:
    got = combine_workers(
        [
            {"vllm:num_requests_waiting": 2.0, "vllm:kv_cache_usage_perc": 0.5},
            {"vllm:num_requests_waiting": 3.0, "vllm:kv_cache_usage_perc": 0.1},
        ]
    )
    assert got == {"vllm:num_requests_waiting": 5.0, "vllm:kv_cache_usage_perc": pytest.approx(0.3)}
    one = {"vllm:num_requests_running": 4.0, "vllm:kv_cache_usage_perc": 0.25}
    assert combine_workers([one]) == one


async def test_sampler_sums_workers_and_counts_a_missing_one_as_error() -> None:
    import aiohttp

    async with serve() as (a, _), serve() as (b, _), aiohttp.ClientSession() as sess:
        sampler = Sampler(
            sess, [Source("worker", a + "/metrics", "worker", (b + "/metrics",))], target="t", t0=0
        )
        await sampler._scrape(sampler.sources[0])
        assert sampler.samples[0].values == {
            "vllm:num_requests_running": 0.0,
            "vllm:num_requests_waiting": 0.0,
        }
        down = Source("worker", a + "/metrics", "worker", ("http://127.0.0.1:9/metrics",))
        await sampler._scrape(down)
        assert sampler.errors == 1 and len(sampler.samples) == 1


# ---------------------------------------------------------------- the CLI, end to end


class _FakeVllm:
    """Stands in for deploy.vllm_worker.VllmWorker: one fake server per worker."""

    started: ClassVar[list[tuple[str, int, int | str]]] = []
    instances: ClassVar[list[_FakeVllm]] = []

    def __init__(self, kind: str, port: int, core: int | str, *a: Any, **kw: Any) -> None:
        self.kind, self.port, self.core = kind, port, core
        self._stack = ExitStack()
        self._url = ""
        self.state: FakeState | None = None

    @property
    def url(self) -> str:
        return self._url

    def start(self) -> None:
        self._url, self.state = self._stack.enter_context(serve_in_thread())
        _FakeVllm.started.append((self.kind, self.port, self.core))
        _FakeVllm.instances.append(self)

    def wait_ready(self, timeout: float = 0, interval: float = 0) -> float:
        return 0.0

    def stop(self, timeout: float = 0) -> int | None:
        self._stack.close()
        return 0


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_FakeVllm]]:
    from hearthgate.deploy import vllm_worker

    _FakeVllm.started, _FakeVllm.instances = [], []
    monkeypatch.setattr(vllm_worker, "VllmWorker", _FakeVllm)
    yield _FakeVllm


def test_compare_two_workers_round_robin_end_to_end(
    tmp_path: Path, fake_vllm: type[_FakeVllm]
) -> None:
    scenario = tmp_path / "rr.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    out = tmp_path / "out"
    code = main(
        [
            "compare",
            str(scenario),
            "--targets",
            "two-workers",
            "--without",
            "embed",
            "--only",
            "vllm-rr",
            "--restart-warmup",
            "0",
            "--no-prime",
            "--no-plots",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    assert fake_vllm.started == [("gen", 18210, 0), ("gen", 18212, 1)]  # no embeddings worker
    a, b = (w.state for w in fake_vllm.instances)
    assert a is not None and b is not None
    reqs = plan(validate_scenario(SCENARIO).with_overrides(without={"embed"}))
    assert len(a.received) == len(reqs[0::2]) and len(b.received) == len(reqs[1::2])
    summary = json.loads((out / "rr.summary.json").read_text())
    t = summary["targets"]["vllm-rr"]
    assert set(t["classes"]) == {"chat", "rag"}
    assert t["run"]["completed"] == t["run"]["requests"] > 0
    assert "worker" in t["server"]
