"""Decode pacing: hold a worker's token gap under a target by capping its background work.

Every sequence running on a vLLM worker gets one token per engine step, so the gap between
tokens of *any* stream on that worker measures the step time an interactive stream sees.
Each step grows with the decode batch and with the prefill chunks admitted into it, so the
more background work the gateway lets onto the worker, the slower every stream runs. The
static budgets (in-flight caps, prefill tokens) set that trade once; this controller sets it
from what is measured, as the machine's speed and the mix change.

``DecodePacer`` keeps one cap on the background (non-interactive) sequences of one worker,
adjusted once per interval from the mean token gap observed in it (additive increase,
multiplicative decrease):

- gap above the target: the cap drops to ``decrease`` times what is in flight (at least
  ``min_cap``). It drops again only once the background work in flight has come down to the
  cap, so the sequences admitted before the cut, which take a while to finish, do not drive
  it to the floor;
- gap below ``headroom`` times the target while the cap is what holds work back (background
  in flight at the cap): one more sequence, or with ``PacingRule.proportional_growth`` the
  cap times the room the gap leaves (at least one, at most doubling);
- no gap observed (nothing streamed): unchanged.

Only gaps no prefill overlapped count here: a long prompt's prefill step stalls every stream
for its whole length whatever the decode batch, so counting it cut the cap for something the
cap does not cause, and at light load held RAG to one or two prompts at a time (background
0.5-0.75x of vLLM alone: results/matrix-1round.md). Prefill stalls have their own lever:

``PrefillPacer`` (policies/prefill_pacing.py) answers those: the share of the worker's prefill
speed background prompts may use.

An interactive first token that came late cuts the decode cap as well: while long prompts
are in prefill all the time, no gap is free of them and the decode batch would grow unseen
(with ``PacingRule.late_cut_when_blind``, only in an interval where that is so: no
decode-only gap seen). Every cut is counted by lever and reason (``PacingCuts``), so what
holds background work back can be read off a running gateway.

The same gaps move a third cap, on the interactive sequences any one app may have on the
worker (``WorkerPacer``): an app flooding an interactive class is held to it, so the queue
forms in the gateway, where fair sharing lets the other apps' requests go first, instead of
in vLLM's own first-come-first-served queue. It is cut only once the background work has
come down to its own floor (and, with prefill pacing, the duty to its floor, unless no
background work is on the worker at all): background gives way first. With prefill pacing
on, gaps that a background prompt's prefill overlapped do not count for it (the duty
answers those). The scheduler holds an app to this cap only while another app shares its
class (``policies.class_apps``).

Pure: the caller passes the time and the observations; no clock, no I/O.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, fields, replace

from hearthgate.policies.prefill_pacing import PrefillPacer


@dataclass(frozen=True, slots=True)
class PacingRule:
    """``target_gap_s``: the mean gap between tokens to hold; ``interval_s``: how often the
    cap moves; ``max_cap``: the cap at start and its ceiling. ``prefill_gap_s``: the mean
    gap interactive streams may see, prefill stalls included (None: no prefill pacing, and
    the decode cap counts every gap as before)."""

    target_gap_s: float
    interval_s: float = 0.5
    decrease: float = 0.7
    headroom: float = 0.85
    min_cap: int = 1
    max_cap: int = 64
    prefill_gap_s: float | None = None
    # Prompts an app flooding a worker (at least the per-app cap's floor of interactive
    # sequences there) may have in prefill at once; None: no limit (policies.budgets).
    flood_prefill: int | None = None
    # Such an app's requests also wait while another app's request of their class on the
    # worker waits for its first token (policies.budgets, ``WorkerSnapshot.flood_yields``).
    flood_yields: bool = False
    # While another app shares its class, a flooding app's prompt counts against
    # ``flood_prefill`` until its first token (not its early prefill release).
    flood_until_first_token: bool = False
    # The interactive gap the prefill duty may grow to while background work is behind
    # (None: prefill_gap_s always). Only with prefill_gap_s, and not below it.
    behind_gap_s: float | None = None
    # Background prompts a worker may have in prefill at once; None: no limit
    # (policies.budgets).
    background_prefill: int | None = None
    # A late interactive first token cuts the background cap only in an interval with no
    # decode-only gap (the decode batch unseen); False: in every interval. The gateway's
    # settings turn it on by default (scheduler.pacing.late_cuts_decode_cap).
    late_cut_when_blind: bool = False
    # The background cap grows in proportion to the room the gap leaves (at most doubling
    # an interval) instead of one sequence an interval; False: one (additive increase).
    # The gateway's settings turn it on by default (scheduler.pacing.cap_growth).
    proportional_growth: bool = False
    # The gap the per-app cap (WorkerPacer) holds; None: target_gap_s (``app_target_gap_s``).
    app_gap_s: float | None = None
    # The per-app cap's gap as this many times the worker's own token gap under light load
    # (the shortest interval mean gap seen with at most the cap's floor of sequences in
    # flight, over the last LIGHT_WINDOW_S), so it follows the box's speed, at most
    # target_gap_s; None: fixed at ``app_target_gap_s``, which also holds until a light
    # interval is seen.
    app_gap_steps: float | None = None

    @property
    def app_target_gap_s(self) -> float:
        """The gap the per-app cap holds."""
        return self.target_gap_s if self.app_gap_s is None else self.app_gap_s

    def __post_init__(self) -> None:
        if not (math.isfinite(self.target_gap_s) and self.target_gap_s > 0):
            raise ValueError("target_gap_s must be > 0")
        if not (math.isfinite(self.interval_s) and self.interval_s > 0):
            raise ValueError("interval_s must be > 0")
        if not 0 < self.decrease < 1:
            raise ValueError("decrease must be in (0, 1)")
        if not 0 < self.headroom <= 1:
            raise ValueError("headroom must be in (0, 1]")
        if self.min_cap < 1 or self.max_cap < self.min_cap:
            raise ValueError("need 1 <= min_cap <= max_cap")
        gap = self.prefill_gap_s
        if gap is not None and not (math.isfinite(gap) and gap > 0):
            raise ValueError("prefill_gap_s must be > 0")
        if self.flood_prefill is not None and self.flood_prefill < 1:
            raise ValueError("flood_prefill must be >= 1")
        if self.background_prefill is not None and self.background_prefill < 1:
            raise ValueError("background_prefill must be >= 1")
        app = self.app_gap_s
        if app is not None and not (math.isfinite(app) and app > 0):
            raise ValueError("app_gap_s must be > 0")
        steps = self.app_gap_steps
        if steps is not None and not (math.isfinite(steps) and steps >= 1):
            raise ValueError("app_gap_steps must be >= 1")
        behind = self.behind_gap_s
        if behind is not None and (gap is None or not (math.isfinite(behind) and behind >= gap)):
            raise ValueError("behind_gap_s needs prefill_gap_s and must be >= it")


class DecodePacer:
    """The background cap of one worker (see the module docstring)."""

    def __init__(self, rule: PacingRule, now: float) -> None:
        self.rule = rule
        self.cap = rule.max_cap
        self.last_gap_s: float | None = None  # mean gap of the last interval with tokens
        self.intervals = 0  # intervals that measured a mean gap (last_gap_s)
        self._since = now
        self._time = 0.0
        self._tokens = 0
        self._settling = False  # a cut was made; wait until in-flight work is down to it
        self.cuts_gap = 0  # cuts made because the mean gap was over the target
        self.cuts_late = 0  # cuts made because an interactive first token came late

    def observe(self, seconds: float, tokens: int) -> None:
        """``tokens`` tokens of one stream arrived ``seconds`` after its previous token."""
        if tokens > 0 and seconds >= 0 and math.isfinite(seconds):
            self._time += seconds
            self._tokens += tokens

    @property
    def seen(self) -> bool:
        """Whether the current interval has observed any gap yet."""
        return self._tokens > 0

    def update(
        self, now: float, background_in_flight: int, may_cut: bool = True, slow: bool = False
    ) -> int:
        """Move the cap if an interval has passed; the cap now. ``may_cut`` False: a gap
        over the target leaves the cap where it is (something else gives way first).
        ``slow``: count the interval as over the target whatever its gaps (an interactive
        first token came late)."""
        if now - self._since < self.rule.interval_s:
            return self.cap
        self._since = now
        if self._tokens == 0 and not slow:
            return self.cap
        gap = self._time / self._tokens if self._tokens else math.inf
        self._time, self._tokens = 0.0, 0
        if math.isfinite(gap):
            self.last_gap_s = gap
            self.intervals += 1
        r = self.rule
        if self._settling and background_in_flight <= self.cap:
            self._settling = False
        if slow or gap > r.target_gap_s:
            if may_cut and not self._settling:
                base = min(self.cap, background_in_flight)
                self.cap = max(r.min_cap, math.floor(base * r.decrease))
                self._settling = background_in_flight > self.cap
                if slow:
                    self.cuts_late += 1
                else:
                    self.cuts_gap += 1
        elif gap < r.headroom * r.target_gap_s and background_in_flight >= self.cap:
            self.cap = min(r.max_cap, self.cap + self._growth(gap))
        return self.cap

    def retarget(self, gap_s: float) -> None:
        """Hold ``gap_s`` from the next interval on."""
        if gap_s != self.rule.target_gap_s:
            self.rule = replace(self.rule, target_gap_s=gap_s)

    def _growth(self, gap: float) -> int:
        """Sequences to add to the cap after an interval whose mean ``gap`` was under
        headroom x target while the cap held work back: one, or with
        ``proportional_growth`` the cap times the room left (headroom x target / gap - 1),
        at least one and at most the cap itself (doubling). After a deep cut the cap then
        climbs back in a few intervals where the gap allows it, not one sequence each."""
        r = self.rule
        if not r.proportional_growth:
            return 1
        room = r.headroom * r.target_gap_s / gap - 1 if gap > 0 else 1.0
        return max(1, math.floor(self.cap * min(1.0, room)))


APP_DECREASE = 0.85  # the per-app cap's multiplicative cut (WorkerPacer)
# How long a light interval's gap counts for the per-app cap's gap (``app_gap_steps``): the
# box's speed drifts over an hour; without a newer one the last one stays.
LIGHT_WINDOW_S = 600.0


@dataclass(frozen=True, slots=True)
class PacingCuts:
    """How many intervals each of a worker's pacing levers was cut in (at its floor too:
    the pressure stays visible), and why: ``late``, an interactive first token came late
    (counted so even when the gap was over its target as well); ``gap``, the mean token
    gap was over its target. The background cap and the prefill duty answer both; the
    per-app cap only gaps (and only once background has given way)."""

    background_gap: int = 0
    background_late: int = 0
    duty_gap: int = 0
    duty_late: int = 0
    app_gap: int = 0

    def __add__(self, other: PacingCuts) -> PacingCuts:
        return PacingCuts(
            *(getattr(self, f.name) + getattr(other, f.name) for f in fields(PacingCuts))
        )

    def items(self) -> list[tuple[str, str, int]]:
        """(lever, reason, count) for every counter, e.g. ("duty", "late", 3)."""
        return [
            ("background", "gap", self.background_gap),
            ("background", "late", self.background_late),
            ("duty", "gap", self.duty_gap),
            ("duty", "late", self.duty_late),
            ("app", "gap", self.app_gap),
        ]


@dataclass(frozen=True, slots=True)
class PacingState:
    """One paced worker: its background cap, its per-app interactive cap (None: off), the
    mean token gap of the last interval with decode-only gaps (None before any), the
    background prefill duty (None: no prefill pacing), how often each lever was cut, and the
    prefill speed the duty is a share of."""

    background_cap: int
    app_cap: int | None
    token_gap_s: float | None
    prefill_duty: float | None = None
    cuts: PacingCuts = PacingCuts()
    # The prefill speed (prompt tokens per second) the duty is a share of (None: no
    # prefill pacing, or not told).
    prefill_rate: float | None = None
    # The gap the per-app cap holds now (None: no per-app cap).
    app_gap_s: float | None = None

    def cut_counts(self) -> list[tuple[str, str, int]]:
        """``cuts.items()`` for the levers this worker has (no duty without prefill
        pacing, no per-app cap without per-app pacing)."""
        off = {"duty"} if self.prefill_duty is None else set()
        if self.app_cap is None:
            off.add("app")
        return [c for c in self.cuts.items() if c[0] not in off]


class WorkerPacer:
    """The pacing of one worker, moved by the token gaps it relays: ``cap`` on background
    sequences (from gaps no prefill overlapped, when prefill pacing is on), the background
    prefill ``duty`` (from interactive streams' gaps; None when off) and ``app_cap`` (None
    when per-app pacing is off) on the interactive sequences of any one app, which is cut
    only while background is at its floor."""

    def __init__(self, rule: PacingRule, now: float, app_min_cap: int | None = None) -> None:
        self._background = DecodePacer(rule, now)
        self._prefill: PrefillPacer | None = None
        if rule.prefill_gap_s is not None:
            self._prefill = PrefillPacer(
                rule.prefill_gap_s, rule.interval_s, now, behind_gap_s=rule.behind_gap_s
            )
        self._apps: DecodePacer | None = None
        # (time, mean gap) of recent intervals with at most the per-app floor of sequences
        # in flight (only with app_gap_steps).
        self._light: deque[tuple[float, float]] = deque()
        self._light_at = 0  # the most sequences in flight an interval counts as light
        if app_min_cap is not None:
            floor = min(app_min_cap, rule.max_cap)
            self._light_at = floor
            # Gentler cuts than for background: a flooding app's sequences are short and
            # there are always more queued, so a deep cut only leaves the worker idle
            # (cuts to 0.7 held the cap around 16 where the gap allowed about 24).
            decrease = max(rule.decrease, APP_DECREASE)
            app_rule = replace(
                rule,
                target_gap_s=rule.app_target_gap_s,
                min_cap=floor,
                decrease=decrease,
                proportional_growth=False,
            )
            self._apps = DecodePacer(app_rule, now)

    @property
    def rule(self) -> PacingRule:
        return self._background.rule

    @property
    def cap(self) -> int:
        return self._background.cap

    @property
    def app_cap(self) -> int | None:
        return None if self._apps is None else self._apps.cap

    @property
    def last_gap_s(self) -> float | None:
        return self._background.last_gap_s

    @property
    def duty(self) -> float | None:
        return None if self._prefill is None else self._prefill.duty

    def state(self) -> PacingState:
        bg, duty, apps = self._background, self._prefill, self._apps
        cuts = PacingCuts(
            background_gap=bg.cuts_gap,
            background_late=bg.cuts_late,
            duty_gap=0 if duty is None else duty.cuts_gap,
            duty_late=0 if duty is None else duty.cuts_late,
            app_gap=0 if apps is None else apps.cuts_gap,
        )
        app_gap = None if apps is None else apps.rule.target_gap_s
        return PacingState(
            self.cap, self.app_cap, self.last_gap_s, self.duty, cuts, app_gap_s=app_gap
        )

    def observe(
        self,
        seconds: float,
        tokens: int,
        prefill: bool = False,
        interactive: bool = False,
        background_prefill: bool = False,
    ) -> None:
        """A stream's ``tokens`` came ``seconds`` after its previous token; ``prefill``:
        some prompt was in prefill on the worker during that time (``background_prefill``:
        a background one); ``interactive``: the stream is of an interactive class."""
        if self._prefill is None or not prefill:
            self._background.observe(seconds, tokens)
        if self._prefill is not None and interactive:
            self._prefill.observe(seconds, tokens)
        if self._apps is not None and (self._prefill is None or not background_prefill):
            # With prefill pacing, a background prompt's stall is the duty's to answer: it
            # cut the chat app's cap in RAG bursts and queued chat in the gateway (rag-burst
            # x3: 65% on target). A flooding app's own prefills still count.
            self._apps.observe(seconds, tokens)

    def observe_start(self, seconds: float, ttft_s: float) -> None:
        """An interactive request's first token came ``seconds`` after it reached the
        worker; ``ttft_s`` is its class's target."""
        if self._prefill is not None:
            self._prefill.observe_start(seconds, ttft_s)

    def prefill_open(self, now: float, rate: float) -> bool:
        """Whether background prompts may start on the worker now (prefill duty)."""
        return self._prefill is None or self._prefill.open(now, rate)

    def prefill_paid_in(self, now: float, rate: float) -> float:
        """Seconds until background prompts may start on the worker (0: now)."""
        return 0.0 if self._prefill is None else self._prefill.paid_in(now, rate)

    def charge_prefill(self, now: float, prompt_tokens: int, rate: float) -> None:
        """A background prompt was admitted to the worker."""
        if self._prefill is not None:
            self._prefill.charge(now, prompt_tokens, rate)

    def update(
        self,
        now: float,
        background_in_flight: int,
        heaviest_app: int,
        rate: float = 0.0,
        behind: bool = False,
        in_flight: int | None = None,
    ) -> None:
        """Move the caps if an interval has passed. ``heaviest_app``: the most interactive
        sequences one app has on the worker; ``rate``: its prefill speed (tokens/s);
        ``behind``: background work waits past its share of its target; ``in_flight``:
        every sequence on the worker (None: not told; the per-app gap then stays put)."""
        # A late interactive first token also cuts the decode cap: while long prompts
        # are always in prefill no gap is free of them, and a decode batch grown unseen
        # made every step slow (rag-burst at 3x: chat TTFT p99 1.2 s).
        late = self._prefill is not None and self._prefill.late(behind)
        # With late_cut_when_blind, decode-only gaps seen in the interval judge the decode
        # batch themselves, and a late start is left to the duty (prompts queued ahead).
        judged = self.rule.late_cut_when_blind and self._background.seen
        self._background.update(now, background_in_flight, slow=late and not judged)
        if self._prefill is not None:
            self._prefill.update(now, rate, behind)
        if self._apps is not None:
            # Background has given way once its sequences are down to the floor and, with
            # prefill pacing, its prefill duty too: at the start of a RAG burst few RAG
            # sequences run yet their prefills slow every step, and cutting the chat app
            # then queued chat in the gateway (rag-burst x3: chat 76-81% on target).
            # With no background work on the worker at all, nothing is left to give way
            # and the duty (held to a looser gap) may never reach its floor: waiting for
            # it left a flooding chat app uncapped (noisy x1, run 6: chat UI p99 347 ms
            # against 125 ms without prefill pacing).
            floor = self._background.rule.min_cap
            duty = self._prefill
            gave_way = background_in_flight <= floor and (
                duty is None or duty.duty <= duty.min_duty or background_in_flight == 0
            )
            seen = self._apps.intervals
            self._apps.update(now, heaviest_app, may_cut=gave_way)
            if self._apps.intervals > seen and in_flight is not None:
                self._follow_speed(now, in_flight)

    def _follow_speed(self, now: float, in_flight: int) -> None:
        """With ``app_gap_steps``: after an interval that measured a gap, keep it if the
        worker ran light (at most the per-app floor of sequences), and hold the per-app cap
        to ``app_gap_steps`` x the shortest light gap of the last ``LIGHT_WINDOW_S`` (the
        newest one when all are older), never looser than background's gap (on a slow box
        the multiple would otherwise hold a flood less than background is held)."""
        steps, apps = self.rule.app_gap_steps, self._apps
        if steps is None or apps is None or apps.last_gap_s is None:
            return
        light = self._light
        if in_flight <= self._light_at:
            light.append((now, apps.last_gap_s))
        while len(light) > 1 and light[0][0] < now - LIGHT_WINDOW_S:
            light.popleft()
        if light:
            light_gap = min(gap for _, gap in light)
            apps.retarget(min(steps * light_gap, self.rule.target_gap_s))
