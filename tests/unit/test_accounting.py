"""gateway/accounting.py: whether an answer met its class's targets, and what it records."""

from __future__ import annotations

from hearthgate.gateway.accounting import record, targets_met
from hearthgate.gateway.metrics import GatewayMetrics
from hearthgate.gateway.proxy import Result
from hearthgate.gateway.settings import RequestClass

CHAT = RequestClass(priority=1, interactive=True, ttft_ms=300, itl_ms=50)


def test_both_targets_are_judged_on_first_token_and_mean_gap() -> None:
    assert targets_met(CHAT, 0.3, [0.04, 0.06]) == (True, True)  # mean gap 50 ms: met
    assert targets_met(CHAT, 0.301, [0.01]) == (False, True)
    # One long gap among short ones is judged by the mean, as the README's goodput is.
    assert targets_met(CHAT, 0.1, [0.01, 0.01, 0.2]) == (True, False)
    assert targets_met(CHAT, 0.1, []) == (True, True)  # a one-token answer has no gaps


def test_a_class_without_targets_meets_them() -> None:
    batch = RequestClass(priority=9)
    assert targets_met(batch, 120.0, [5.0]) == (True, True)


def sample(m: GatewayMetrics, name: str, **labels: str) -> float:
    value = m.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_a_completed_answer_counts_its_tokens_and_its_targets() -> None:
    m = GatewayMetrics(["tiny"], 100, classes={"chat": CHAT}, apps=["notes"])
    totals: dict[str, list[int]] = {}
    ok = Result(200, ttft_s=0.1, gaps=[0.02], prompt_tokens=10, completion_tokens=2, completed=True)
    late = Result(
        200, ttft_s=0.5, gaps=[0.02], prompt_tokens=5, completion_tokens=2, completed=True
    )
    cut = Result(200, ttft_s=0.1, gaps=[], prompt_tokens=3)  # cut off: no verdict
    for result in (ok, late, cut):
        record(m, totals, "/v1/chat/completions", "tiny", "chat", CHAT, "notes", result)
    assert totals == {"notes": [18, 4]}
    slo = "hearthgate_slo_total"
    assert sample(m, slo, cls="chat", target="both", result="met") == 1
    assert sample(m, slo, cls="chat", target="both", result="missed") == 1
    assert sample(m, slo, cls="chat", target="itl", result="met") == 2
