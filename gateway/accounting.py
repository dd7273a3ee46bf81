"""What one finished request leaves behind: its counts and latencies in the metrics, its
app's token totals, and whether it met its class's targets (the goodput the README's
numbers are about)."""

from __future__ import annotations

from hearthgate.gateway.metrics import GatewayMetrics
from hearthgate.gateway.proxy import Result
from hearthgate.gateway.settings import RequestClass


def targets_met(cls: RequestClass, ttft_s: float, gaps: list[float]) -> tuple[bool, bool]:
    """Whether a completed answer met its class's first-token target and its inter-token
    target (the mean gap between its tokens); a class without a target meets it."""
    ttft_ok = cls.ttft_ms is None or ttft_s * 1000 <= cls.ttft_ms
    mean_gap = sum(gaps) / len(gaps) if gaps else 0.0
    itl_ok = cls.itl_ms is None or mean_gap * 1000 <= cls.itl_ms
    return ttft_ok, itl_ok


def record(
    m: GatewayMetrics,
    app_tokens: dict[str, list[int]],
    route: str,
    model: str,
    cls_name: str,
    cls: RequestClass,
    app: str,
    result: Result,
) -> None:
    """Account one request that reached a worker. ``app_tokens``: app -> [prompt,
    completion] tokens served, updated in place."""
    m.count(route, model, result.status)
    label = m.app_label(app)
    totals = app_tokens.setdefault(app, [0, 0])
    if result.prompt_tokens:
        m.class_tokens.labels(cls_name, label, "prompt").inc(result.prompt_tokens)
        totals[0] += result.prompt_tokens
    if result.completion_tokens:
        m.class_tokens.labels(cls_name, label, "completion").inc(result.completion_tokens)
        totals[1] += result.completion_tokens
    m.tokens(model, result.prompt_tokens or 0, result.completion_tokens or 0)
    if result.e2e_s is not None:
        m.observe_e2e(route, model, result.e2e_s)
    if result.ttft_s is None:
        return
    m.observe_ttft(route, model, result.ttft_s)
    m.observe_gaps(route, model, result.gaps)
    m.class_ttft.labels(cls_name).observe(result.ttft_s)
    if not result.completed:
        return
    ttft_ok, itl_ok = targets_met(cls, result.ttft_s, result.gaps)
    for target, ok in (("ttft", ttft_ok), ("itl", itl_ok), ("both", ttft_ok and itl_ok)):
        m.slo.labels(cls_name, target, "met" if ok else "missed").inc()
