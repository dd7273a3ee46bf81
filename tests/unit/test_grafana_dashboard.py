"""The Grafana dashboard (deploy/grafana/dashboards/hearthgate.json), its provisioning and the
compose service that runs it, checked without Grafana: every PromQL expression names metrics
(and labels) the gateway really exports, or that the installed vLLM defines."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from hearthgate.gateway.app import create_app
from hearthgate.gateway.settings import load_settings
from tests.unit.test_deploy_files import KEYS, interpolate

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
GRAFANA = DEPLOY / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "hearthgate.json"
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "prometheus.yaml"
PROVIDERS = GRAFANA / "provisioning" / "dashboards" / "hearthgate.yaml"
VLLM_LOGGERS = ".venv-vllm/lib/python3*/site-packages/vllm/v1/metrics/loggers.py"

# Grafana's own variables; the dashboard's are in its templating list.
GRAFANA_VARIABLES = {"__rate_interval", "__interval", "__range", "__range_s", "__interval_ms"}
# Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"job", "instance"}
# Panel types that ship with Grafana (no plugin to download).
CORE_PANELS = {"row", "timeseries", "stat", "gauge", "bargauge", "table", "text", "heatmap"}


# ----- a small PromQL reader: which metrics and labels an expression names -----


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


AGGREGATIONS = _words(
    "sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk "
    "limit_ratio"
)
FUNCTIONS = _words(
    "abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time ceil changes "
    "clamp clamp_max clamp_min cos cosh count_over_time day_of_month day_of_week day_of_year "
    "days_in_month deg delta deriv double_exponential_smoothing end exp floor "
    "histogram_avg histogram_count histogram_fraction histogram_quantile histogram_stddev "
    "histogram_stdvar histogram_sum holt_winters hour idelta increase irate label_join "
    "label_replace last_over_time ln log10 log2 mad_over_time max_over_time min_over_time "
    "minute month pi predict_linear present_over_time quantile_over_time rad rate resets "
    "round scalar sgn sin sinh sort sort_by_label sort_by_label_desc sort_desc sqrt start "
    "stddev_over_time stdvar_over_time sum_over_time tan tanh time timestamp vector "
    "year"
)
GROUPING = frozenset({"by", "without"})
MATCHING = frozenset({"on", "ignoring", "group_left", "group_right"})
# Words that are neither metrics nor calls.
KEYWORDS = frozenset({"bool", "and", "or", "unless", "offset", "atan2", "inf", "nan"})

_TOKEN = re.compile(
    r"""
      (?P<ws>\s+)
    | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    | (?P<range>\[[^\[\]]*\])                  # [5m], [$__rate_interval], [1h:5m]
    | (?P<var>\$\{\w+(?::\w+)?\}|\$\w+)        # a Grafana variable outside quotes
    | (?P<duration>(?:\d+(?:ms|[smhdwy]))+(?![\w:]))
    | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
    | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
    | (?P<op>==|!=|=~|!~|<=|>=|[-+*/%^<>=@,(){}])
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class Token:
    kind: str
    text: str


def tokenize(expr: str) -> list[Token]:
    """PromQL tokens, whitespace dropped; anything PromQL does not know is an error."""
    out, pos = [], 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise ValueError(f"cannot read {expr[pos:]!r} in {expr!r}")
        assert m.lastgroup is not None
        if m.lastgroup != "ws":
            out.append(Token(m.lastgroup, m.group()))
        pos = m.end()
    return out


@dataclass
class Query:
    """What one expression refers to."""

    metrics: list[str] = field(default_factory=list)
    # (metric, label) of each label matcher in a selector's braces
    matchers: list[tuple[str, str]] = field(default_factory=list)
    # (by/without/on/ignoring/..., labels, metrics those labels must exist on)
    groupings: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)


def _pairs(tokens: list[Token]) -> dict[int, int]:
    """Index of each opening ( or { -> index of its closing one, and back."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for i, t in enumerate(tokens):
        if t.text in ("(", "{"):
            stack.append(i)
        elif t.text in (")", "}"):
            if not stack or tokens[stack[-1]].text != {")": "(", "}": "{"}[t.text]:
                raise ValueError(f"unbalanced {t.text!r}")
            j = stack.pop()
            pairs[j], pairs[i] = i, j
    if stack:
        raise ValueError(f"unclosed {tokens[stack[-1]].text!r}")
    return pairs


def _label_list(tokens: list[Token], open_: int, close: int) -> tuple[str, ...]:
    """The labels of ``by (a, b)`` between the parentheses at open_ and close."""
    inner = tokens[open_ + 1 : close]
    labels = tuple(t.text for t in inner[::2])
    if any(t.kind != "ident" for t in inner[::2]) or any(t.text != "," for t in inner[1::2]):
        raise ValueError(f"bad label list: {' '.join(t.text for t in inner)}")
    return labels


def _matchers(tokens: list[Token], open_: int, close: int) -> list[tuple[str, str, str]]:
    """(label, op, quoted value) of each matcher between the braces at open_ and close."""
    inner, out = tokens[open_ + 1 : close], []
    while inner:
        part, inner = inner[:3], inner[3:]
        if (
            len(part) != 3
            or part[0].kind != "ident"
            or part[1].text not in ("=", "!=", "=~", "!~")
            or part[2].kind != "string"
        ):
            raise ValueError(f"bad label matcher: {' '.join(t.text for t in part)}")
        out.append((part[0].text, part[1].text, part[2].text))
        if inner:
            if inner[0].text != ",":
                raise ValueError(f"expected ',' between label matchers, got {inner[0].text!r}")
            inner = inner[1:]
    return out


def parse(expr: str) -> Query:
    """The metrics, label matchers, groupings and calls of one PromQL expression."""
    tokens = tokenize(expr)
    pairs = _pairs(tokens)
    q = Query()
    metric_at: dict[int, str] = {}  # token index -> metric name
    scoped: list[tuple[str, tuple[str, ...], tuple[int, int] | None]] = []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        nxt = tokens[i + 1].text if i + 1 < len(tokens) else None
        if t.kind == "ident" and (t.text in GROUPING or t.text in MATCHING):
            if nxt != "(":
                if t.text in ("group_left", "group_right"):  # without labels
                    i += 1
                    continue
                raise ValueError(f"{t.text} needs a label list")
            labels = _label_list(tokens, i + 1, pairs[i + 1])
            span: tuple[int, int] | None = None  # None: the whole expression
            if t.text in GROUPING:
                after = pairs[i + 1] + 1
                if i > 0 and tokens[i - 1].text in AGGREGATIONS:  # sum by (x) (...)
                    if after >= len(tokens) or tokens[after].text != "(":
                        raise ValueError(f"{tokens[i - 1].text} by (...) needs its argument")
                    span = (after, pairs[after])
                elif (
                    i > 0
                    and tokens[i - 1].text == ")"
                    and pairs[i - 1] > 0
                    and tokens[pairs[i - 1] - 1].text in AGGREGATIONS
                ):  # sum (...) by (x)
                    span = (pairs[i - 1], i - 1)
                else:
                    raise ValueError(f"{t.text} (...) outside an aggregation")
            scoped.append((t.text, labels, span))
            i = pairs[i + 1] + 1
        elif t.kind == "ident" and nxt == "(":
            if t.text not in AGGREGATIONS and t.text not in FUNCTIONS:
                raise ValueError(f"unknown function {t.text!r}")
            q.calls.append(t.text)
            i += 1
        elif t.kind == "ident" and t.text in AGGREGATIONS and nxt in GROUPING:
            q.calls.append(t.text)
            i += 1
        elif t.kind == "ident" and t.text in KEYWORDS:
            i += 1
        elif t.kind == "ident":
            if t.text in AGGREGATIONS or t.text in FUNCTIONS:
                raise ValueError(f"{t.text} without its arguments")
            metric_at[i] = t.text
            q.metrics.append(t.text)
            if nxt == "{":
                q.matchers += [(t.text, m[0]) for m in _matchers(tokens, i + 1, pairs[i + 1])]
                i = pairs[i + 1] + 1
            else:
                i += 1
        elif t.text == "{":  # a selector without a name: {__name__="...", ...}
            found = _matchers(tokens, i, pairs[i])
            names = [v[1:-1] for label, op, v in found if label == "__name__" and op == "="]
            if len(names) != 1:
                raise ValueError('a selector without a metric name needs __name__="..."')
            metric_at[i] = names[0]
            q.metrics.append(names[0])
            q.matchers += [(names[0], m[0]) for m in found if m[0] != "__name__"]
            i = pairs[i] + 1
        elif t.kind == "var":
            raise ValueError(f"{t.text} outside quotes or a range: not PromQL once substituted")
        else:
            i += 1
    for word, labels, span in scoped:
        inside = tuple(
            name for at, name in sorted(metric_at.items()) if span is None or span[0] < at < span[1]
        )
        q.groupings.append((word, labels, inside))
    return q


def variables(expr: str) -> set[str]:
    """Grafana variables ($x, ${x}, ${x:format}) used anywhere in the expression."""
    return {m.group(1) or m.group(2) for m in re.finditer(r"\$\{(\w+)[^}]*\}|\$(\w+)", expr)}


@pytest.mark.parametrize(
    ("expr", "metrics", "matchers", "groupings"),
    [
        (
            'sum by (cls) (rate(hearthgate_slo_total{cls=~"$cls", result="met"}[5m]))',
            ["hearthgate_slo_total"],
            [("hearthgate_slo_total", "cls"), ("hearthgate_slo_total", "result")],
            [("by", ("cls",), ("hearthgate_slo_total",))],
        ),
        (
            "histogram_quantile(0.95, sum by (le, cls) "
            "(rate(hearthgate_queue_wait_seconds_bucket[$__rate_interval])))",
            ["hearthgate_queue_wait_seconds_bucket"],
            [],
            [("by", ("le", "cls"), ("hearthgate_queue_wait_seconds_bucket",))],
        ),
        (
            # grouping after the argument; vector matching spans the whole expression;
            # metric names with colons; a trailing comma in the braces
            'max(vllm:kv_cache_usage_perc{worker=~"gen.*",}) by (worker) '
            "/ on(worker) group_left hearthgate_worker_up",
            ["vllm:kv_cache_usage_perc", "hearthgate_worker_up"],
            [("vllm:kv_cache_usage_perc", "worker")],
            [
                ("by", ("worker",), ("vllm:kv_cache_usage_perc",)),
                ("on", ("worker",), ("vllm:kv_cache_usage_perc", "hearthgate_worker_up")),
            ],
        ),
        (
            # keywords, durations, numbers and bool are not metrics
            "rate(a_total[5m] offset 1h30m) > bool 1e3 and b unless c_seconds_count or -.5",
            ["a_total", "b", "c_seconds_count"],
            [],
            [],
        ),
        (
            # words inside strings are not metrics, nor are a function's string arguments
            'label_replace(up{job="sum(rate(x))"}, "dst", "$1", "src", "(.*)")',
            ["up"],
            [("up", "job")],
            [],
        ),
        (
            '{__name__="foo_total", app="a"} / ignoring (app) sum without (kind) (bar)',
            ["foo_total", "bar"],
            [("foo_total", "app")],
            [("ignoring", ("app",), ("foo_total", "bar")), ("without", ("kind",), ("bar",))],
        ),
    ],
)
def test_promql_reader(
    expr: str,
    metrics: list[str],
    matchers: list[tuple[str, str]],
    groupings: list[tuple[str, tuple[str, ...], tuple[str, ...]]],
) -> None:
    q = parse(expr)
    assert q.metrics == metrics
    assert q.matchers == matchers
    assert q.groupings == groupings


@pytest.mark.parametrize(
    ("expr", "error"),
    [
        ("histogram_quantil(0.9, x_bucket)", "unknown function"),
        ("sum(rate(x[5m])", "unclosed"),
        ("sum(x))", "unbalanced"),
        ("x{cls=~$cls}", "bad label matcher"),
        ("rate(x[5m]) # comment", "cannot read"),
        ("x by (cls)", "outside an aggregation"),
        ("rate + x", "without its arguments"),
        ("x * $factor", "outside quotes"),
    ],
)
def test_promql_reader_refuses(expr: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse(expr)


def test_variables() -> None:
    assert variables('sum(rate(x{a=~"$cls", b="${app:regex}"}[$__rate_interval]))') == {
        "cls",
        "app",
        "__rate_interval",
    }


# ----- what the gateway and vLLM export -----


@cache
def gateway_series() -> dict[str, frozenset[str]]:
    """Each series name the gateway's /metrics can show (counters with _total, histograms
    with _bucket/_sum/_count) -> its label names. Built in-process from the compose
    settings (Redis configured, so the batch gauges are registered; nothing connects)."""
    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in os.environ if k.startswith("HEARTHGATE_")]:
            mp.delenv(key)
        settings = load_settings(DEPLOY / "config" / "settings.yaml")
        keys = [a.key_env for a in settings.apps] + [settings.auth.admin_key_env]
        for n, key in enumerate(k for k in keys if k):
            mp.setenv(key, f"grafana-dashboard-test-key-{n:02d}-" + "x" * 24)
        app = create_app(settings)
    assert app.state.batches is not None, "the batch collector needs redis.url"
    metrics = app.state.gateway.metrics
    # A labelled counter or histogram shows no series before its first use: make one.
    for wrapper in vars(metrics).values():
        if isinstance(wrapper, MetricWrapperBase) and wrapper._labelnames:
            wrapper.labels(*["probe"] * len(wrapper._labelnames))
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    out: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
        if not family.samples:  # a scrape-time collector with nothing to report yet
            labels = set(getattr(family, "_labelnames", ()))
            for suffix in suffixes.get(family.type, ("",)):
                extra = {"le"} if suffix == "_bucket" else set()
                out[family.name + suffix] = labels | extra
    return {name: frozenset(labels) for name, labels in out.items()}


@cache
def vllm_loggers() -> str | None:
    """The installed vLLM's metric definitions (v1/metrics/loggers.py), if installed."""
    found = sorted(REPO.glob(VLLM_LOGGERS))
    return found[-1].read_text() if found else None


def vllm_series(text: str) -> set[str]:
    names = set(re.findall(r"[\"'](vllm:[A-Za-z0-9_:]+)[\"']", text))
    return names | {n + s for n in names for s in ("_total", "_bucket", "_sum", "_count")}


def vllm_labels(name: str, text: str) -> set[str]:
    """Labels a vLLM series may have: Prometheus's own, the vllm job's target labels in
    prometheus.yml (worker), and the label names vLLM's code spells out."""
    prom = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    (job,) = [j for j in prom["scrape_configs"] if j["job_name"] == "vllm"]
    labels = set(TARGET_LABELS)
    for group in job["static_configs"]:
        labels |= set(group.get("labels", {}))
    labels |= set(re.findall(r"[\"']([a-z_]+)[\"']", text)) & {"model_name", "engine"}
    if name.endswith("_bucket"):
        labels.add("le")
    return labels


def test_gateway_series_sees_every_kind_of_family() -> None:
    """Sanity of gateway_series(): it sees the scrape-time collectors, the batch gauges and
    the labels of metrics that have no series yet."""
    series = gateway_series()
    assert series["hearthgate_queue_depth"] == {"cls"}
    assert series["hearthgate_tenant_counter"] == {"cls", "app"}
    assert series["hearthgate_slo_total"] == {"cls", "target", "result"}
    assert series["hearthgate_queue_wait_seconds_bucket"] == {"cls", "le"}
    assert series["hearthgate_pacing_token_gap_seconds"] == {"worker"}
    assert series["hearthgate_redis_up"] == frozenset()
    assert "hearthgate_batch_eta_seconds" in series and "hearthgate_slo" not in series


# ----- the dashboard -----


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def datasource() -> dict[str, Any]:
    (ds,) = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    assert isinstance(ds, dict)
    return ds


def all_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row keeps its panels inside


@dataclass(frozen=True)
class Expr:
    where: str
    promql: str
    legend: str = ""
    label: str | None = None  # label_values(..., label)


def expressions(dashboard: dict[str, Any]) -> list[Expr]:
    """Every PromQL expression: the panels' queries and the variables' label_values()."""
    out = []
    for panel in all_panels(dashboard):
        for t in panel.get("targets", []):
            out.append(Expr(f"panel {panel['title']!r} {t['refId']}", t["expr"], t["legendFormat"]))
    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        text = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        assert text == var["definition"], var["name"]
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", text)
        assert m, f"variable {var['name']}: {text}"
        if isinstance(var["query"], dict):  # the query editor's fields say the same
            assert (var["query"]["metric"], var["query"]["label"]) == (m[1], m[2]), var["name"]
        out.append(Expr(f"variable {var['name']}", m[1], label=m[2]))
    return out


def test_dashboard_is_self_contained(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "hearthgate" and dashboard["title"]
    assert dashboard["schemaVersion"] >= 36  # datasources referenced by uid
    assert dashboard.get("id") is None  # provisioning assigns the id
    # an "export for sharing" file (__inputs, ${DS_...}) would not load from provisioning
    assert "__inputs" not in dashboard and "__requires" not in dashboard
    text = DASHBOARD.read_text()
    assert "${DS_" not in text
    assert not re.search(r"https?://", text), "no assets or links from the internet"
    assert {p["type"] for p in all_panels(dashboard)} <= CORE_PANELS


def test_panels_have_unique_ids_titles_and_fit_the_grid(dashboard: dict[str, Any]) -> None:
    panels = list(all_panels(dashboard))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    for p in panels:
        assert isinstance(p["id"], int) and p["title"].strip(), p
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, p["title"]
        if p["type"] == "row":
            assert not p.get("targets"), p["title"]
        else:
            assert p["targets"], f"{p['title']}: no query"
            refs = [t["refId"] for t in p["targets"]]
            assert len(refs) == len(set(refs)), p["title"]
    # the rows the dashboard is about
    rows = " | ".join(p["title"] for p in panels if p["type"] == "row").lower()
    for topic in ("queue", "slo", "ttft", "app", "worker", "pacing", "batch", "vllm"):
        assert topic in rows, topic


def test_every_query_uses_the_provisioned_datasource(
    dashboard: dict[str, Any], datasource: dict[str, Any]
) -> None:
    expected = {"type": datasource["type"], "uid": datasource["uid"]}
    assert expected == {"type": "prometheus", "uid": "prometheus"}
    for panel in all_panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == expected, panel["title"]
        for t in panel["targets"]:
            assert t["datasource"] == expected, f"{panel['title']} {t['refId']}"
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            assert var["datasource"] == expected, var["name"]


def test_every_variable_is_defined(dashboard: dict[str, Any]) -> None:
    defined = {v["name"] for v in dashboard["templating"]["list"]} | GRAFANA_VARIABLES
    assert {"cls", "app", "worker"} <= defined
    for e in expressions(dashboard):
        assert variables(e.promql) <= defined, e.where


def test_every_gateway_metric_is_exported(dashboard: dict[str, Any]) -> None:
    series = gateway_series()
    used = set()
    for e in expressions(dashboard):
        q = parse(e.promql)
        assert q.metrics, f"{e.where}: no metric in {e.promql}"
        for name in q.metrics:
            if not name.startswith("vllm:"):
                assert name in series, f"{e.where}: the gateway exports no {name}"
                used.add(name)
    # the families the issue asks for are on the dashboard
    for name in (
        "hearthgate_queue_depth",
        "hearthgate_queue_wait_seconds_bucket",
        "hearthgate_slo_total",
        "hearthgate_class_ttft_seconds_bucket",
        "hearthgate_inter_token_seconds_bucket",
        "hearthgate_tokens_total",
        "hearthgate_worker_up",
        "hearthgate_in_flight",
        "hearthgate_worker_scraped_waiting",
        "hearthgate_worker_scraped_running",
        "hearthgate_worker_kv_usage",
        "hearthgate_pacing_background_cap",
        "hearthgate_pacing_token_gap_seconds",
        "hearthgate_batch_lines",
        "hearthgate_batch_lines_finished_total",
        "hearthgate_batches",
        "hearthgate_batch_eta_seconds",
        "hearthgate_redis_up",
        "hearthgate_event_loop_lag_seconds_bucket",
    ):
        assert name in used, name


def test_every_vllm_metric_is_defined_by_the_installed_vllm(dashboard: dict[str, Any]) -> None:
    text = vllm_loggers()
    if text is None:
        pytest.skip(f"no vLLM environment ({VLLM_LOGGERS}); `make test` installs it")
    known = vllm_series(text)
    used = {n for e in expressions(dashboard) for n in parse(e.promql).metrics}
    vllm = {n for n in used if n.startswith("vllm:")}
    assert {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    } <= vllm
    assert vllm <= known, f"not in the installed vLLM: {sorted(vllm - known)}"


def test_every_label_exists_on_its_metric(dashboard: dict[str, Any]) -> None:
    """Labels in by (...), on (...), in selectors and in label_values() exist on the
    metrics they apply to, so no panel groups or filters by a label that is never there."""
    series = gateway_series()
    text = vllm_loggers()

    def labels_of(name: str) -> set[str] | None:
        if name.startswith("vllm:"):
            return None if text is None else vllm_labels(name, text)
        return set(series[name]) | TARGET_LABELS

    for e in expressions(dashboard):
        q = parse(e.promql)
        wanted = [(m, label) for m, label in q.matchers]
        wanted += [
            (m, label) for _, labels, scope in q.groupings for m in scope for label in labels
        ]
        if e.label is not None:
            wanted += [(m, e.label) for m in q.metrics]
        for metric, label in wanted:
            have = labels_of(metric)
            if have is not None:
                assert label in have, f"{e.where}: {metric} has no label {label!r}"


def test_legends_name_labels_the_query_keeps(dashboard: dict[str, Any]) -> None:
    """{{label}} in a legend is a label the aggregation keeps (else the legend is empty)."""
    for e in expressions(dashboard):
        shown = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", e.legend))
        if not shown:
            continue
        kept = [set(labels) for word, labels, _ in parse(e.promql).groupings if word == "by"]
        assert kept, f"{e.where}: legend {e.legend!r} but no by (...)"
        assert all(shown <= k for k in kept), f"{e.where}: legend {e.legend!r}"


# ----- provisioning and the compose service -----


@pytest.fixture(scope="module")
def grafana() -> dict[str, Any]:
    raw = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    service = interpolate(raw, KEYS)["services"]["grafana"]
    assert isinstance(service, dict)
    return service


def mounts(service: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Container path -> (source, options) of each volume."""
    out = {}
    for m in service["volumes"]:
        source, target, *opts = m.split(":")
        out[target] = (source, ",".join(opts))
    return out


def test_grafana_service(grafana: dict[str, Any]) -> None:
    assert grafana["profiles"] == ["monitoring"]
    assert re.fullmatch(r"grafana/grafana(-oss)?:\d+\.\d+\.\d+", grafana["image"])
    assert grafana["ports"] == ["127.0.0.1:3000:3000"]  # the NAS only, like Prometheus
    assert "prometheus" in grafana["depends_on"]
    env = grafana["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"  # off unless GRAFANA_ANONYMOUS=true
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert env["GF_USERS_ALLOW_SIGN_UP"] == "false"
    assert env["GF_PLUGINS_PREINSTALL_DISABLED"] == "true"  # nothing fetched at start
    raw = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]["grafana"]
    assert raw["environment"]["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")
    with pytest.raises(KeyError, match="GRAFANA_ADMIN_PASSWORD"):
        interpolate(raw, {**KEYS, "GRAFANA_ADMIN_PASSWORD": ""})
    anonymous = interpolate(raw, {**KEYS, "GRAFANA_ANONYMOUS": "true"})
    assert anonymous["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "true"


def test_grafana_mounts_the_provisioning_and_dashboards_read_only(
    grafana: dict[str, Any],
) -> None:
    by_target = mounts(grafana)
    source, opts = by_target["/etc/grafana/provisioning"]
    assert (DEPLOY / source).resolve() == GRAFANA / "provisioning" and opts == "ro"
    providers = yaml.safe_load(PROVIDERS.read_text())["providers"]
    (provider,) = providers
    assert provider["type"] == "file"
    path = provider["options"]["path"]
    assert path in by_target, f"the provider reads {path}, which compose does not mount"
    source, opts = by_target[path]
    assert opts == "ro"
    assert (DEPLOY / source).resolve() == DASHBOARD.parent
    assert provider["allowUiUpdates"] is False  # the JSON file is the dashboard


def test_the_datasource_is_the_compose_prometheus(datasource: dict[str, Any]) -> None:
    raw = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    url = urlsplit(datasource["url"])
    assert url.hostname == "prometheus" and "prometheus" in raw
    container_ports = {p.rsplit(":", 1)[1] for p in raw["prometheus"]["ports"]}
    assert str(url.port) in container_ports
    assert datasource["access"] == "proxy"  # the browser never talks to Prometheus
    prom = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    assert datasource["jsonData"]["timeInterval"] == prom["global"]["scrape_interval"]


def test_every_required_variable_is_in_the_keys_example_and_the_readme() -> None:
    """Compose interpolates every service, in every profile, before it starts any: each
    ${VAR:?...} must be in keys.env.example and in the README's key-making loop."""
    required = set(re.findall(r"\$\{(\w+):\?", (DEPLOY / "compose.yaml").read_text()))
    assert "GRAFANA_ADMIN_PASSWORD" in required
    example = (DEPLOY / "keys.env.example").read_text()
    assert required <= set(re.findall(r"(?m)^(\w+)=", example))
    loop = re.search(r"for k in ([\w ]+); do", (REPO / "README.md").read_text())
    assert loop, "README: the loop that fills deploy/.env"
    assert required <= set(loop[1].split())
