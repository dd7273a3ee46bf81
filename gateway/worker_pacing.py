"""Pacing state per worker, fed from the request path (``policies.pacing`` decides).

The admission controller owns one :class:`WorkerPacing`. It keeps a ``WorkerPacer`` per
worker, feeds it the token gaps and first-token delays tickets report, moves the caps on
the controller's tick, adds each worker's caps to its snapshot for the scheduler, and,
with prefill pacing on (the default), counts the prompts each worker has in prefill: a
token gap that overlapped one is a prefill stall, not a decode step, and a background
prompt admitted is a prefill debt. With prefill pacing off none of that counting runs.
It also puts the flood limits (``PacingRule.flood_prefill``, ``flood_yields``,
``flood_until_first_token``) on every worker's snapshot and the background prefill limit
(``PacingRule.background_prefill``) on every general worker's, paced yet or not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from hearthgate.policies.budgets import WorkerUsage
from hearthgate.policies.estimators import PrefillRates
from hearthgate.policies.pacing import PacingCuts, PacingRule, PacingState, WorkerPacer
from hearthgate.policies.types import WorkerSnapshot


@dataclass(frozen=True)
class FloodLimits:
    """The limits on an app that floods a worker (``PacingRule.flood_*``), as every
    worker's snapshot carries them."""

    at: int | None  # interactive sequences on a worker that make an app a flood there
    prefill: int | None  # its prompts in prefill there at once (None: no limit)
    yields: bool  # it waits while a lighter app's request of its class awaits a first token
    until_first_token: bool  # its prompts count against ``prefill`` until their first token

    def on(self, snap: WorkerSnapshot) -> WorkerSnapshot:
        """``snap`` carrying these limits."""
        return replace(
            snap,
            flood_at=self.at,
            flood_prefill=self.prefill,
            flood_yields=self.yields,
            flood_until_first_token=self.until_first_token,
        )


_NO_FLOOD_LIMITS = FloodLimits(None, None, False, False)


class WorkerPacing:
    """Every worker's pacer, and the prompts each has in prefill (prefill pacing only)."""

    def __init__(self, rule: PacingRule | None, app_floor: int | None, rates: PrefillRates) -> None:
        self.rule = rule
        self.app_floor = app_floor  # None: no per-app pacing cap
        self._rates = rates
        self._pacers: dict[str, WorkerPacer] = {}
        # Cuts counted by pacers a reload restarted, so the exported counts never go back.
        self._cuts_before: dict[str, PacingCuts] = {}
        # Per worker, prompts in prefill and when one last ended: of every class, and of
        # background classes alone (their stalls are the prefill duty's to answer).
        self._prefilling: dict[str, int] = {}
        self._prefill_ended_at: dict[str, float] = {}
        self._bg_prefilling: dict[str, int] = {}
        self._bg_prefill_ended_at: dict[str, float] = {}

    def reconfigure(self, rule: PacingRule | None, app_floor: int | None) -> None:
        """A new rule or floor restarts the pacers (from the rule's max cap); a new flood
        or background prefill limit alone does not. Prompts admitted before a reload turned
        prefill pacing on were not counted: until they leave prefill (a few intervals at
        most) their stalls count as decode gaps, the price of not counting prefills on every
        admission while prefill pacing is off."""
        restart = _pacer_rule(rule) != _pacer_rule(self.rule) or app_floor != self.app_floor
        self.rule = rule
        self.app_floor = app_floor
        if restart:
            for name, pacer in self._pacers.items():
                self._cuts_before[name] = self._cuts_before.get(name, PacingCuts()) + (
                    pacer.state().cuts
                )
            self._pacers.clear()

    @property
    def flood_threshold(self) -> int | None:
        """The interactive sequences that make an app a flood on a worker: the per-app
        cap's own floor (None: no per-app pacing, so no app is told apart as a flood)."""
        rule, floor = self.rule, self.app_floor
        if rule is None or floor is None:
            return None
        return min(floor, rule.max_cap)

    @property
    def flood(self) -> FloodLimits | None:
        """The flood limits, or None: off (neither limit set, or no per-app pacing)."""
        at, rule = self.flood_threshold, self.rule
        if at is None or rule is None or (rule.flood_prefill is None and not rule.flood_yields):
            return None
        return FloodLimits(at, rule.flood_prefill, rule.flood_yields, rule.flood_until_first_token)

    @property
    def tracks_prefill(self) -> bool:
        """Whether prompts in prefill are counted (prefill pacing is on)."""
        return self.rule is not None and self.rule.prefill_gap_s is not None

    # ------------------------------------------------------------- request events

    def prefill_started(self, worker: str, background: bool = False) -> bool:
        """A prompt was admitted to ``worker`` (``background``: of a non-interactive
        class). Returns whether it is counted, so that only a counted prompt reports its
        end (``prefill_ended``)."""
        if not self.tracks_prefill:
            return False
        self._prefilling[worker] = self._prefilling.get(worker, 0) + 1
        if background:
            self._bg_prefilling[worker] = self._bg_prefilling.get(worker, 0) + 1
        return True

    def prefill_ended(self, worker: str, now: float, background: bool = False) -> None:
        """A counted prompt on ``worker`` is out of prefill."""
        _ended(self._prefilling, self._prefill_ended_at, worker, now)
        if background:
            _ended(self._bg_prefilling, self._bg_prefill_ended_at, worker, now)

    def observe_start(self, worker: str, now: float, seconds: float, ttft_s: float) -> None:
        """An interactive request's first token came ``seconds`` after it was sent to
        ``worker``; ``ttft_s``: its class's target."""
        pacer = self._pacer(worker, now)
        if pacer is not None:
            pacer.observe_start(seconds, ttft_s)

    def observe_gap(
        self, worker: str, now: float, seconds: float, tokens: int, interactive: bool
    ) -> None:
        """``tokens`` tokens of a stream on ``worker`` came ``seconds`` before ``now``
        after its last one."""
        pacer = self._pacer(worker, now)
        if pacer is None:
            return
        if not self.tracks_prefill:
            pacer.observe(seconds, tokens, False, interactive)
            return
        since = now - seconds
        prefill = (
            worker in self._prefilling or self._prefill_ended_at.get(worker, -math.inf) > since
        )
        background = prefill and (
            worker in self._bg_prefilling
            or self._bg_prefill_ended_at.get(worker, -math.inf) > since
        )
        pacer.observe(seconds, tokens, prefill, interactive, background)

    def charge(self, worker: str, now: float, prompt_tokens: int) -> None:
        """A background prompt was admitted to ``worker``: its prefill debt."""
        pacer = self._pacers.get(worker)
        if pacer is not None:
            pacer.charge_prefill(now, prompt_tokens, self._rates.rate(worker))

    def prefill_opens_in(self, now: float) -> float | None:
        """Seconds until the first worker whose prefill duty is closed (its debt unpaid)
        opens again; None when none is closed."""
        waits = [p.prefill_paid_in(now, self._rates.rate(n)) for n, p in self._pacers.items()]
        closed = [w for w in waits if w > 0]
        return min(closed) if closed else None

    # ------------------------------------------------------------------- control

    @property
    def watches_backlog(self) -> bool:
        """Whether the prefill duty loosens while background work is behind (the caller
        then passes ``behind`` to ``update``)."""
        return self.rule is not None and self.rule.behind_gap_s is not None

    def update(self, now: float, usage: Mapping[str, WorkerUsage], behind: bool = False) -> None:
        """Move every pacer's caps (each acts once per interval); ``behind``: background
        work waits past its share of its first-token target."""
        for name, pacer in self._pacers.items():
            rate = self._rates.rate(name)
            u = usage.get(name)
            if u is None:
                pacer.update(now, 0, 0, rate, behind, in_flight=0)
            else:
                bg = u.in_flight - u.interactive_in_flight
                pacer.update(now, bg, u.heaviest_app, rate, behind, in_flight=u.in_flight)

    def apply(self, snaps: Sequence[WorkerSnapshot], now: float) -> list[WorkerSnapshot]:
        """``snaps`` with each paced worker's caps and whether its prefill duty is open, and
        every worker's flood limit and, on a general worker, the background prefill limit
        (before its first token too: a cold start's burst). A long-prefill or embeddings
        worker is there to take background prompts; the limit protects interactive prompts
        where they run beside them."""
        limits = self.flood or _NO_FLOOD_LIMITS
        bg_prefill = None if self.rule is None else self.rule.background_prefill
        out = []
        for s in snaps:
            bg = bg_prefill if s.role == "general" else None
            p = self._pacers.get(s.name)
            if p is None:
                out.append(limits.on(replace(s, background_prefill=bg)))
                continue
            paced = replace(
                s,
                background_cap=p.cap,
                app_cap=p.app_cap,
                prefill_open=p.prefill_open(now, self._rates.rate(s.name)),
                background_prefill=bg,
            )
            out.append(limits.on(paced))
        return out

    @property
    def active(self) -> bool:
        """Whether any worker is paced yet (a pacer starts at a worker's first token)."""
        return bool(self._pacers)

    def state(self) -> dict[str, PacingState]:
        """Per paced worker: its caps, the last interval's mean token gap, its duty and the
        prefill speed it is a share of, and its cuts since the gateway started (across
        reloads that restarted its pacer)."""
        out = {}
        for name, p in sorted(self._pacers.items()):
            st = p.state()
            before = self._cuts_before.get(name)
            if before is not None:
                st = replace(st, cuts=st.cuts + before)
            if st.prefill_duty is not None:
                st = replace(st, prefill_rate=self._rates.rate(name))
            out[name] = st
        return out

    def _pacer(self, worker: str, now: float) -> WorkerPacer | None:
        if self.rule is None:
            return None
        pacer = self._pacers.get(worker)
        if pacer is None:
            pacer = WorkerPacer(self.rule, now, self.app_floor)
            self._pacers[worker] = pacer
        return pacer


def _ended(counts: dict[str, int], ended_at: dict[str, float], worker: str, now: float) -> None:
    left = counts.get(worker, 1) - 1
    if left > 0:
        counts[worker] = left
    else:
        counts.pop(worker, None)
    ended_at[worker] = now


def _pacer_rule(rule: PacingRule | None) -> PacingRule | None:
    """What the pacers run on: the rule without the prefill limits (not theirs to apply)."""
    if rule is None:
        return None
    return replace(
        rule,
        flood_prefill=None,
        flood_yields=False,
        flood_until_first_token=False,
        background_prefill=None,
    )
