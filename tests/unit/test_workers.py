"""Worker pool bookkeeping: scraped vLLM gauges, staleness, snapshots for the scheduler."""

from __future__ import annotations

from hearthgate.gateway.metrics import GatewayMetrics
from hearthgate.gateway.settings import Health, Worker
from hearthgate.gateway.workers import WorkerPool, parse_vllm_gauges

PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="1",model_name="m"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 7.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 4.0
"""


def test_parse_sums_engines_and_ignores_the_rest() -> None:
    assert parse_vllm_gauges(PAGE) == {
        "vllm:num_requests_running": 3.0,
        "vllm:num_requests_waiting": 3.0,
        "vllm:kv_cache_usage_perc": 0.25,
        "vllm:num_preemptions_total": 7.0,
    }


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def test_stale_gauges_are_unknown_not_idle() -> None:
    clock = Clock()
    spec = Worker(name="w", url="http://127.0.0.1:1", models=["m"])
    pool = WorkerPool([spec], Health(interval_s=1.0), GatewayMetrics(["m"]), clock=clock)
    w = pool.workers[0]
    w.gauges, w.scraped_at = parse_vllm_gauges(PAGE), 0.0
    clock.t = 2.9
    pool.refresh_gauges()
    snap = pool.snapshots()[0]
    assert snap.scraped_waiting == 3.0 and snap.kv_usage == 0.25
    clock.t = 3.1  # older than three intervals
    pool.refresh_gauges()
    snap = pool.snapshots()[0]
    assert snap.scraped_waiting is None and snap.kv_usage is None


def test_down_worker_is_unhealthy_in_snapshots_and_not_picked() -> None:
    specs = [Worker(name=n, url="http://127.0.0.1:1", models=["m"]) for n in ("a", "b")]
    pool = WorkerPool(specs, Health(), GatewayMetrics(["m"]))
    pool.mark_down(pool.by_name["a"], "refused")
    assert [s.healthy for s in pool.snapshots()] == [False, True]
    picked = pool.pick("m")
    assert picked is not None and picked.name == "b"
    assert pool.pick("m", exclude={"b"}) is None
    assert pool.pick("other") is None


def prefill_page(tokens: float, seconds: float) -> str:
    return (
        "# TYPE vllm:request_prompt_tokens histogram\n"
        f'vllm:request_prompt_tokens_sum{{engine="0",model_name="m"}} {tokens}\n'
        'vllm:request_prompt_tokens_count{engine="0",model_name="m"} 3.0\n'
        "# TYPE vllm:request_prefill_time_seconds histogram\n"
        f'vllm:request_prefill_time_seconds_sum{{engine="0",model_name="m"}} {seconds}\n'
    )


def test_parse_reads_the_prefill_histogram_sums() -> None:
    got = parse_vllm_gauges(PAGE + prefill_page(6000.0, 0.5))
    assert got["vllm:request_prompt_tokens_sum"] == 6000.0
    assert got["vllm:request_prefill_time_seconds_sum"] == 0.5
    assert "vllm:request_prompt_tokens_count" not in got


class Pages:
    """An upstream whose /metrics answers the next page of a list."""

    def __init__(self, pages: list[str]) -> None:
        self.pages = pages

    async def get(self, worker: str, url: str, timeout_s: float) -> tuple[int, bytes]:
        return 200, self.pages.pop(0).encode()


async def test_scrapes_report_the_prefill_done_between_them() -> None:
    """Non-streamed requests teach the prefill speed too: through vLLM's own histograms,
    as differences between scrapes (a worker restart, sums going down, reports nothing)."""
    spec = Worker(name="w", url="http://127.0.0.1:1", models=["m"])
    pool = WorkerPool([spec], Health(interval_s=1.0), GatewayMetrics(["m"]), clock=Clock())
    seen: list[tuple[str, int, float]] = []
    pool.on_prefill = lambda w, tokens, s: seen.append((w, tokens, s))
    sums = [(1000, 0.1), (5000, 0.2), (5000, 0.2), (100, 0.01)]
    pages = Pages([prefill_page(t, s) for t, s in sums])
    for _ in range(4):
        await pool.scrape(pages, pool.workers[0])  # type: ignore[arg-type]
    assert len(seen) == 1
    (worker, tokens, seconds) = seen[0]
    assert worker == "w" and tokens == 4000 and abs(seconds - 0.1) < 1e-9


def test_reconfigure_keeps_state_adds_fresh_workers_and_retires_removed_ones() -> None:
    w0 = Worker(name="w0", url="http://w0", models=["m"])
    w1 = Worker(name="w1", url="http://w1", models=["m"])
    pool = WorkerPool([w0], Health(), GatewayMetrics(["m"]))
    old = pool.by_name["w0"]
    old.up = True
    pool.acquire(old)
    fresh = pool.reconfigure([w0.model_copy(update={"models": ["m", "n"]}), w1], Health())
    assert [w.name for w in fresh] == ["w1"] and fresh[0].up is None
    assert pool.by_name["w0"] is old and old.spec.models == ["m", "n"] and old.in_flight == 1
    moved = pool.reconfigure([w0.model_copy(update={"url": "http://elsewhere"})], Health())
    assert [w.name for w in moved] == ["w0"] and moved[0] is not old  # a new address: checked
    assert pool.state("w1").name == "w1"  # removed, still reachable for an admission in flight
    assert pool.any_up(["w1"]) is False  # ...but never offered again
    assert [w.name for w in pool.snapshots()] == ["w0"]
    pool.release(old)  # the request on the old address ends on the old state
    assert old.in_flight == 0
