"""The fuzzer's tally and its markdown report: counts per endpoint, status and origin, case
kinds, and the failures, worker 5xx and slow answers with examples to reproduce them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from hearthgate.loadtests.fuzz_cases import ENDPOINTS, Case
from hearthgate.loadtests.fuzz_judge import Answer, Verdict
from hearthgate.loadtests.fuzz_values import clip


@dataclass
class Example:
    index: int
    status: int | None
    case: Case
    answer: str  # the start of the answer body (or the transport error)


@dataclass
class Group:
    count: int = 0
    examples: list[Example] = field(default_factory=list)


def status_label(status: int | None) -> str:
    return "none" if status is None else str(status)


def status_class(status: int | None) -> str:
    return "none" if status is None else f"{status // 100}xx"


@dataclass
class Tally:
    """Counts of everything sent, and the failures with examples to reproduce them."""

    examples_per_group: int = 3
    slow_s: float = 10.0  # answers slower than this are listed (not failures)
    counts: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    kinds: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    notes: Counter[tuple[str, str]] = field(default_factory=Counter)
    failures: dict[tuple[str, str, str], Group] = field(default_factory=dict)
    worker_5xx: dict[tuple[str, str, str], Group] = field(default_factory=dict)
    slow: dict[tuple[str, str, str], Group] = field(default_factory=dict)
    sent: Counter[str] = field(default_factory=Counter)
    elapsed_s: dict[str, float] = field(default_factory=dict)

    def add(self, index: int, case: Case, answer: Answer, verdict: Verdict) -> None:
        ep = case.endpoint
        self.sent[ep] += 1
        self.counts[(ep, status_label(answer.status), verdict.origin)] += 1
        self.kinds[(ep, case.kind, status_class(answer.status))] += 1
        if verdict.note:
            self.notes[(ep, verdict.note)] += 1
        if verdict.problem is not None:
            self._keep(self.failures, verdict.problem, index, case, answer)
        elif verdict.note == "worker 5xx":
            self._keep(self.worker_5xx, f"worker {answer.status}", index, case, answer)
        if answer.status is not None and answer.elapsed_s > self.slow_s:
            what = f"{status_label(answer.status)} after more than {self.slow_s:g} s"
            self._keep(self.slow, what, index, case, answer)

    def _keep(
        self,
        groups: dict[tuple[str, str, str], Group],
        what: str,
        index: int,
        case: Case,
        answer: Answer,
    ) -> None:
        group = groups.setdefault((case.endpoint, what, case.kind), Group())
        group.count += 1
        if len(group.examples) < self.examples_per_group:
            shown = answer.error or answer.body[:300].decode("utf-8", "replace")
            shown = f"{shown} ({answer.elapsed_s:.1f} s)"
            group.examples.append(Example(index, answer.status, case, shown))

    @property
    def failed(self) -> int:
        return sum(g.count for g in self.failures.values())


def _row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _groups_md(groups: Mapping[tuple[str, str, str], Group], seed: int) -> list[str]:
    lines: list[str] = []
    for (ep, what, kind), g in sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[1].count)):
        lines.append(f"### {ep}: {what} (kind {kind}): {g.count} requests")
        lines.append("")
        for ex in g.examples:
            lines.append(f"- case #{ex.index} (seed {seed}), {ex.case.detail or ex.case.kind}")
            request = ex.case.describe().replace("`", "'")
            lines.append(f"  - request: `{request}`")
            answer = clip(ex.answer, 200).replace("`", "'").replace("\n", "\\n")
            lines.append(f"  - answer {status_label(ex.status)}: `{answer}`")
        lines.append("")
    return lines


def render_markdown(tally: Tally, meta: Mapping[str, str], seed: int) -> str:
    """The report: totals per endpoint, status x origin, case kinds, failures, worker 5xx."""
    lines = ["# Fuzz run", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    verdict = "PASS" if tally.failed == 0 else f"FAIL ({tally.failed} failures)"
    lines += [f"- result: **{verdict}**", "", "## Answers per endpoint", ""]
    cols = ["endpoint", "requests", "2xx", "gateway 4xx", "worker 4xx", "worker 5xx"]
    cols += ["gateway 5xx", "no answer", "other", "failures", "seconds"]
    lines += [_row(cols), _row(["---"] * len(cols))]
    for ep in ENDPOINTS:
        if not tally.sent[ep]:
            continue

        def count(pred: Callable[[str, str], bool], ep: str = ep) -> int:
            return sum(n for (e, s, o), n in tally.counts.items() if e == ep and pred(s, o))

        fails = sum(g.count for (e, _, _), g in tally.failures.items() if e == ep)
        lines.append(
            _row(
                [
                    ep,
                    tally.sent[ep],
                    count(lambda s, o: s.startswith("2")),
                    count(lambda s, o: s.startswith("4") and o == "gateway"),
                    count(lambda s, o: s.startswith("4") and o == "worker"),
                    count(lambda s, o: s.startswith("5") and o == "worker"),
                    count(lambda s, o: s.startswith("5") and o == "gateway"),
                    count(lambda s, o: s == "none"),
                    count(lambda s, o: s[0] in "13"),
                    fails,
                    f"{tally.elapsed_s.get(ep, 0.0):.0f}",
                ]
            )
        )
    lines += ["", "## Status and origin", "", _row(["endpoint", "status", "origin", "count"])]
    lines.append(_row(["---"] * 4))
    for (ep, status, origin), n in sorted(tally.counts.items()):
        lines.append(_row([ep, status, origin, n]))
    lines += ["", "## Case kinds", ""]
    classes = ["2xx", "3xx", "4xx", "5xx", "none"]
    lines += [_row(["endpoint", "kind", *classes]), _row(["---"] * (2 + len(classes)))]
    pairs = sorted({(ep, kind) for ep, kind, _ in tally.kinds})
    for ep, kind in pairs:
        lines.append(_row([ep, kind, *(tally.kinds[(ep, kind, c)] for c in classes)]))
    if tally.notes:
        lines += [
            "",
            "Remarks: "
            + ", ".join(f"{ep}: {n} x {what}" for (ep, what), n in sorted(tally.notes.items())),
        ]
    lines += ["", f"## Failures ({tally.failed})", ""]
    lines += _groups_md(tally.failures, seed) if tally.failures else ["None.", ""]
    n5 = sum(g.count for g in tally.worker_5xx.values())
    lines += [f"## 5xx relayed from the worker ({n5}; vLLM's own, not gateway failures)", ""]
    lines += _groups_md(tally.worker_5xx, seed) if tally.worker_5xx else ["None.", ""]
    n_slow = sum(g.count for g in tally.slow.values())
    lines += [f"## Slow answers ({n_slow} over {tally.slow_s:g} s; not failures)", ""]
    lines += _groups_md(tally.slow, seed) if tally.slow else ["None.", ""]
    return "\n".join(lines).rstrip() + "\n"
