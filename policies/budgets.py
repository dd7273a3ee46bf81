"""Admission budgets per worker: what the scheduler has in flight there, and whether one
more request fits."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from hearthgate.policies.counts import count_down
from hearthgate.policies.types import WorkerSnapshot


class Verdict(enum.Enum):
    """Whether a request fits a worker now, and if not, the first limit in the way."""

    FITS = "fits"
    UNHEALTHY = "unhealthy"
    CLASS_CAP = "class_cap"  # the class's own in-flight cap on that worker
    SATURATED = "saturated"  # scraped gauges over their limits (background classes only)
    SLOTS = "slots"  # total in-flight cap, minus the interactive reserve for background
    PREFILL = "prefill"  # prefill token budget, minus the interactive reserve for background
    PACED = "paced"  # background sequences at the worker's decode-pacing cap
    APP_PACED = "app_paced"  # the app's interactive sequences at the worker's per-app cap


@dataclass(frozen=True, slots=True)
class WorkerUsage:
    """What the scheduler has admitted to one worker and not yet seen finish.

    ``prefill_tokens`` are prompt-token estimates of requests whose first token has not
    arrived; ``interactive_prefill_tokens`` the part of them from interactive classes.
    """

    name: str
    in_flight: int
    in_flight_by_class: Mapping[str, int]
    prefill_tokens: int
    interactive_prefill_tokens: int
    prefill_requests: int
    interactive_in_flight: int = 0
    # Interactive sequences by app (only apps with some), for the per-app pacing cap.
    interactive_by_app: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    # Interactive requests in prefill by app (only apps with some), for the flood limit.
    interactive_prefill_by_app: Mapping[str, int] = field(
        default_factory=lambda: MappingProxyType({})
    )
    interactive_prefill_requests: int = 0  # the interactive part of prefill_requests
    # Interactive requests still waiting for their first token (past the early prefill
    # release too) by (class, app), only those with some: a flooding app yields to the
    # other apps' of its class (``WorkerSnapshot.flood_yields``) and may count its own as in
    # prefill (``flood_until_first_token``).
    awaiting: Mapping[tuple[str, str], int] = field(default_factory=lambda: MappingProxyType({}))

    def awaiting_of(self, app: str) -> int:
        """``app``'s interactive requests here without a first token, of any class."""
        return sum(n for (_, a), n in self.awaiting.items() if a == app)

    @property
    def background_prefill_requests(self) -> int:
        """Background (non-interactive) requests in prefill here."""
        return self.prefill_requests - self.interactive_prefill_requests

    @property
    def heaviest_app(self) -> int:
        """The most interactive sequences any one app has here."""
        return max(self.interactive_by_app.values(), default=0)


class WorkerLoad:
    """Mutable in-flight bookkeeping of one worker (owned by the scheduler)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._by_class: dict[str, int] = {}
        self._prefill = 0
        self._prefill_interactive = 0
        self._prefill_requests = 0
        self._prefill_interactive_requests = 0
        self._interactive = 0
        self._by_app: dict[str, int] = {}  # interactive sequences by app
        self._prefill_by_app: dict[str, int] = {}  # interactive requests in prefill by app
        # Interactive requests before their first token, by (class, app).
        self._awaiting: dict[tuple[str, str], int] = {}

    def add(
        self,
        cls: str,
        interactive: bool,
        prompt_tokens: int,
        sequences: int = 1,
        app: str | None = None,
    ) -> None:
        """A request of ``sequences`` sequences (of ``app``) was admitted here; it is in
        prefill until ``end_prefill``."""
        self._by_class[cls] = self._by_class.get(cls, 0) + sequences
        self._prefill += prompt_tokens
        self._prefill_requests += 1
        if interactive:
            self._prefill_interactive += prompt_tokens
            self._prefill_interactive_requests += 1
            self._interactive += sequences
            if app is not None:
                self._by_app[app] = self._by_app.get(app, 0) + sequences
                self._prefill_by_app[app] = self._prefill_by_app.get(app, 0) + 1
                self._awaiting[cls, app] = self._awaiting.get((cls, app), 0) + 1

    def end_prefill(self, interactive: bool, prompt_tokens: int, app: str | None) -> None:
        """The request's first token arrived (or it ended before one): release its tokens.
        ``app`` must be the one it was added with (its prompts in prefill are counted)."""
        self._prefill -= prompt_tokens
        self._prefill_requests -= 1
        if interactive:
            self._prefill_interactive -= prompt_tokens
            self._prefill_interactive_requests -= 1
            if app is not None:
                count_down(self._prefill_by_app, app)

    def answered(self, cls: str, app: str) -> None:
        """An interactive request of ``cls`` from ``app`` added here saw its first token,
        or its prefill is estimated over (an answer that does not stream), or it ended (once
        per request). Unlike ``end_prefill`` not at the early prefill release: the worker
        may not have started that prompt yet."""
        count_down(self._awaiting, (cls, app))

    def remove(
        self, cls: str, interactive: bool = False, sequences: int = 1, app: str | None = None
    ) -> None:
        """The request finished: release its slots (its prefill must have ended already)."""
        if interactive:
            self._interactive -= sequences
            if app is not None:
                count_down(self._by_app, app, sequences)
        count_down(self._by_class, cls, sequences)

    def usage(self) -> WorkerUsage:
        """A frozen view of the current bookkeeping."""
        return WorkerUsage(
            name=self.name,
            in_flight=sum(self._by_class.values()),
            in_flight_by_class=MappingProxyType(dict(sorted(self._by_class.items()))),
            prefill_tokens=self._prefill,
            interactive_prefill_tokens=self._prefill_interactive,
            prefill_requests=self._prefill_requests,
            interactive_in_flight=self._interactive,
            interactive_by_app=MappingProxyType(dict(self._by_app)),
            interactive_prefill_by_app=MappingProxyType(dict(self._prefill_by_app)),
            interactive_prefill_requests=self._prefill_interactive_requests,
            awaiting=MappingProxyType(dict(self._awaiting)),
        )


def check(
    worker: WorkerSnapshot,
    usage: WorkerUsage,
    cls: str,
    interactive: bool,
    prompt_tokens: int,
    sequences: int = 1,
    app: str | None = None,
    capped: bool = True,
) -> Verdict:
    """Whether one more request of ``cls`` (from ``app``) with ``prompt_tokens`` fits
    ``worker`` now.
    In-flight counts and caps are in sequences (a request with ``n`` completions runs as
    ``sequences`` of them); a request with more sequences than a cap runs alone.

    Background classes may not use the interactive reserve (slots or prefill tokens) and
    wait while the worker is saturated or has as many background sequences as its
    decode-pacing cap (``WorkerSnapshot.background_cap``) or while its prefill duty is
    used up (``prefill_open``), and while it has ``background_prefill`` background prompts
    in prefill (``prefill``); an interactive request waits
    while its app has as many interactive sequences there as the per-app pacing cap
    (``WorkerSnapshot.app_cap``; only when ``capped``; an app with none there is always
    let in) or while it
    floods the worker and has its limit of prompts in prefill there (``flood_at``,
    ``flood_prefill``: ``app_paced``). The prefill
    budget admits any request when nothing is in prefill (so a request larger than the
    budget goes alone);
    interactive requests may also always use the reserved prefill tokens not used by other
    interactive requests, even while an oversized background prompt is alone in prefill.
    """
    if not worker.healthy:
        return Verdict.UNHEALTHY
    lim = worker.limits
    cap = lim.max_in_flight_per_class.get(cls)
    if cap is not None and usage.in_flight_by_class.get(cls, 0) >= cap:
        return Verdict.CLASS_CAP
    if not interactive and worker.saturated:
        return Verdict.SATURATED
    bg_cap = worker.background_cap
    background = usage.in_flight - usage.interactive_in_flight
    if not interactive and (
        not worker.prefill_open or (bg_cap is not None and background >= bg_cap)
    ):
        return Verdict.PACED
    if interactive and app is not None and app_paced(worker, usage, app, cls, sequences, capped):
        return Verdict.APP_PACED
    bg_prefill = worker.background_prefill
    if (
        not interactive
        and bg_prefill is not None
        and usage.background_prefill_requests >= bg_prefill
    ):
        return Verdict.PREFILL
    if lim.max_in_flight is not None:
        slots = lim.max_in_flight - (0 if interactive else lim.interactive_reserved_slots)
        alone = sequences > 1 and usage.in_flight == 0  # too big to ever fit: runs alone
        if usage.in_flight + sequences > slots and not alone:
            return Verdict.SLOTS
    budget = lim.prefill_token_budget
    if budget is not None and usage.prefill_tokens > 0:
        reserved = lim.interactive_reserved_prefill_tokens
        after = usage.prefill_tokens + prompt_tokens
        if interactive:
            fits = after <= budget or usage.interactive_prefill_tokens + prompt_tokens <= reserved
        else:
            fits = after <= budget - reserved
        if not fits:
            return Verdict.PREFILL
    return Verdict.FITS


def app_paced(
    worker: WorkerSnapshot,
    usage: WorkerUsage,
    app: str,
    cls: str,
    sequences: int = 1,
    capped: bool = True,
) -> bool:
    """Whether ``app``'s next request of interactive class ``cls`` waits for the worker.

    - ``app`` is at the worker's per-app pacing cap for interactive work: it has some
      interactive sequences there and ``sequences`` more would pass the cap (only when
      ``capped``: another app shares its class, ``policies.class_apps``);
    - or it floods the worker (``flood_at`` sequences or more) and has ``flood_prefill``
      prompts in prefill there already (with ``flood_until_first_token``, while another
      app shares its class: prompts without a first token, past their early prefill
      release too): vLLM prefills its waiting prompts first come first served, so a light
      app's prompt would wait behind all of the flooding app's;
    - or it floods the worker while a lighter app's request of ``cls`` there waits for its
      first token (``flood_yields``): vLLM would prefill the flood's next prompt in the
      same steps, and the light app's first token would wait for both. Within the class
      only: a flood of chat turns does not wait on voice turns, which a more urgent class
      already puts ahead of it; such waits would only add to chat's first tokens.
    """
    held = usage.interactive_by_app.get(app, 0)
    if held == 0:
        return False
    cap = worker.app_cap
    if capped and cap is not None and held + sequences > cap:
        return True
    flood_at = worker.flood_at
    if flood_at is None or held < flood_at:
        return False
    limit = worker.flood_prefill
    if limit is not None:
        if capped and worker.flood_until_first_token:
            in_prefill = usage.awaiting_of(app)
        else:
            in_prefill = usage.interactive_prefill_by_app.get(app, 0)
        if in_prefill >= limit:
            return True
    return worker.flood_yields and light_app_waits(usage, cls, flood_at)


def light_app_waits(usage: WorkerUsage, cls: str, flood_at: int) -> bool:
    """Whether an app that does not flood the worker (fewer than ``flood_at`` interactive
    sequences there) has a request of ``cls`` waiting for its first token."""
    return any(
        c == cls and usage.interactive_by_app.get(app, 0) < flood_at for c, app in usage.awaiting
    )


def flooding_apps(usage: WorkerUsage, flood_at: int | None) -> list[str]:
    """The apps that flood this worker (``flood_at`` interactive sequences or more there):
    the flood limit holds their prompts in prefill (None: the limit is off)."""
    if flood_at is None:
        return []
    return sorted(app for app, held in usage.interactive_by_app.items() if held >= flood_at)


def upstream_priority(class_priority: int, floods: bool) -> int:
    """The priority to send a worker that schedules by it (vLLM: lower runs first): the
    class's own, and within it a request of an app flooding the worker after every other
    app's. Class order is kept: ``2p + 1 < 2q`` for any ``p < q``."""
    return 2 * class_priority + (1 if floods else 0)
