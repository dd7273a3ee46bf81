"""Gateway settings: one YAML file plus ``HEARTHGATE_*`` environment overrides.

Environment variables win over the file; nested keys use ``__``
(``HEARTHGATE_LISTEN__PORT=9000``). Every key is validated at start and unknown keys are
errors, so a typo is reported instead of silently ignored.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from hearthgate.gateway.endpoints import ENDPOINTS


class SettingsError(Exception):
    """The settings file or the environment holds a bad value; the message names the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Listen(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=1, le=65535)
    # Longer than clients' idle pools (aiohttp 15 s, httpx 5 s): they close first, so a
    # reused connection is never reset under a request.
    keep_alive_s: float = Field(75.0, gt=0)
    # uvicorn's event loop; asyncio measured lower added TTFT than uvloop at 64 streams, so
    # uvloop is not a dependency ("uvloop" needs `pip install uvloop`).
    loop: Literal["auto", "asyncio", "uvloop"] = "asyncio"

    @field_validator("loop")
    @classmethod
    def _loop_installed(cls, v: str) -> str:
        if v == "uvloop" and importlib.util.find_spec("uvloop") is None:
            raise ValueError("loop: uvloop is not installed (pip install uvloop), or use asyncio")
        return v


class Limits(_Strict):
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    # Speech-to-text uploads (multipart): OpenAI's and vLLM's own limit is 25 MB.
    max_upload_bytes: int = Field(25 * 1000 * 1000, ge=1024)
    # JSON nesting deeper than this is refused (400) before it can exhaust the parser.
    max_json_depth: int = Field(64, ge=4, le=1000)
    # The most completions one request may ask for (`n`); each runs as its own sequence.
    max_n: int = Field(8, ge=1)
    # The most inputs in one embeddings request (OpenAI's own limit is 2048).
    max_embedding_inputs: int = Field(2048, ge=1)
    # Bytes the bodies of all queued requests may hold together; more get 429.
    max_queued_bytes: int = Field(256 * 1024 * 1024, ge=1024)


class Upstream(_Strict):
    connect_timeout_s: float = Field(5.0, gt=0)
    read_timeout_s: float = Field(600.0, gt=0)
    # The longest a worker may take to its first byte (a streamed answer's first event; a
    # whole non-streamed answer, which vLLM sends at once) before the request fails over or
    # gets 503; classes may set their own (first_byte_timeout_ms).
    first_byte_timeout_s: float = Field(300.0, gt=0)
    max_connections: int = Field(1024, ge=1)
    # Idle pooled connections are closed after this; keep it below the workers' own
    # keep-alive (vLLM: 5 s) so the gateway never reuses one the worker just closed.
    keepalive_s: float = Field(3.0, gt=0)


class Health(_Strict):
    interval_s: float = Field(1.0, gt=0)
    timeout_s: float = Field(2.0, gt=0)
    unhealthy_after: int = Field(3, ge=1)  # failed checks in a row (refused: at once)
    retry_after_s: int = Field(2, ge=1)
    scrape_metrics: bool = True  # read vllm:num_requests_waiting and KV usage each interval


# transcription: vLLM serving a speech-to-text (Whisper-family) model. speech: an
# OpenAI-compatible text-to-speech server (not vLLM: no /metrics to scrape; its health is
# its /v1/models).
WorkerRole = Literal["general", "long_prefill", "embeddings", "transcription", "speech"]
_NAME = r"^[A-Za-z0-9_.-]+$"


class WorkerLimits(_Strict):
    """Admission budgets for one worker (see policies.types.WorkerBudget); None = unlimited."""

    max_in_flight: int | None = Field(None, ge=1)
    max_in_flight_per_class: dict[str, int] = Field(default_factory=dict)
    # Prompt tokens admitted and not yet past their first token. 4096 with 512 kept for
    # interactive prompts: at RAG 21 req/s, 3072 held chat but gave fewer background tokens,
    # 8192 gave 259 tok/s against 427 (loadtests/results/pacing-tune.md); with prefill
    # pacing and 1,024-token steps, 6144 and 8192 gave later voice and chat first tokens,
    # fewer background tokens and less RAG on target (loadtests/results/prefill-budget.md).
    prefill_token_budget: int | None = Field(4096, ge=1)
    interactive_reserved_slots: int = Field(0, ge=0)
    interactive_reserved_prefill_tokens: int = Field(512, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _reserve_within_budget(cls, data: Any) -> Any:
        """A smaller budget set by hand keeps background admissible: the default reserve
        shrinks to an eighth of it."""
        if isinstance(data, dict) and "interactive_reserved_prefill_tokens" not in data:
            budget = data.get("prefill_token_budget", 4096)
            if isinstance(budget, int) and budget < 4096:
                return {**data, "interactive_reserved_prefill_tokens": budget // 8}
        return data

    @model_validator(mode="after")
    def _reserve_below_budget(self) -> WorkerLimits:
        budget = self.prefill_token_budget
        if budget is not None and self.interactive_reserved_prefill_tokens >= budget:
            raise ValueError(
                "interactive_reserved_prefill_tokens must be below prefill_token_budget, "
                "or background prompts could never be admitted"
            )
        return self

    max_scraped_waiting: float | None = Field(None, ge=0)
    max_kv_usage: float | None = Field(None, ge=0, le=1)


class Worker(_Strict):
    name: str = Field(min_length=1, pattern=_NAME)
    url: str
    models: list[str] = Field(min_length=1)
    role: WorkerRole = "general"
    priority_scheduling: bool = False
    limits: WorkerLimits = WorkerLimits()
    # Logical model name (as listed in `models`, what clients send) -> the name this worker's
    # vLLM serves (--served-model-name), when they differ. The gateway rewrites `model` in
    # the body it forwards and back to the logical name in the answer.
    upstream_models: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _embeddings_unbudgeted(cls, data: Any) -> Any:
        """The prefill budget protects decoding streams: an embeddings worker has none, so
        by default its coalesced calls are not held to it."""
        if isinstance(data, dict) and data.get("role") in ("embeddings", "speech"):
            limits = data.get("limits") or {}
            if isinstance(limits, dict) and "prefill_token_budget" not in limits:
                reserve = {"interactive_reserved_prefill_tokens": 0}
                return {**data, "limits": {"prefill_token_budget": None, **reserve, **limits}}
        return data

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _upstream_models_listed(self) -> Worker:
        extra = sorted(set(self.upstream_models) - set(self.models))
        if extra:
            raise ValueError(
                f"upstream_models: {', '.join(extra)} not in this worker's models "
                f"({', '.join(self.models)})"
            )
        empty = sorted(k for k, v in self.upstream_models.items() if not v)
        if empty:
            raise ValueError(f"upstream_models: empty upstream name for {', '.join(empty)}")
        return self

    def upstream_model(self, model: str) -> str:
        """The name this worker serves the logical ``model`` under."""
        return self.upstream_models.get(model, model)


class Metrics(_Strict):
    recent_window: int = Field(256, ge=1)


class Window(_Strict):
    """A class's batching window (see policies.windows): how long a request may wait for
    partners to be dispatched with. Embeddings of the class are coalesced into one upstream
    call per batch."""

    min_wait_ms: float = Field(0.0, ge=0)
    max_wait_ms: float = Field(20.0, ge=0)
    max_batch_size: int | None = Field(64, ge=1)  # items (inputs) per upstream call
    max_batch_tokens: int | None = Field(16384, ge=1)  # prompt-token estimate per call
    ttft_margin_ms: float = Field(50.0, ge=0)  # dispatch this long before the TTFT target

    @model_validator(mode="after")
    def _order(self) -> Window:
        if self.min_wait_ms > self.max_wait_ms:
            raise ValueError("min_wait_ms must be <= max_wait_ms")
        return self


ZERO_WINDOW = Window(max_wait_ms=0.0)


class RequestClass(_Strict):
    """One request class: its band, latency targets, starvation guard and queue limits."""

    priority: int = Field(ge=0)  # lower number = higher band; also sent to vLLM as priority
    interactive: bool = False
    ttft_ms: float | None = Field(None, gt=0)
    itl_ms: float | None = Field(None, gt=0)
    min_share: float | None = Field(None, gt=0, le=1)
    max_wait_ms: float | None = Field(None, gt=0)
    max_queue: int | None = Field(1024, ge=1)
    max_queued_tokens: int | None = Field(None, ge=1)
    queue_timeout_ms: float | None = Field(None, gt=0)
    # A background class with a ttft_ms target answers 429 at once, with the Retry-After
    # its drain rate justifies, to a request whose wait in line plus its own prefill would
    # pass that target (interactive classes and classes without ttft_ms never shed so).
    # Off unless set; the shipped embed and rag classes set it. Alone it also refused RAG
    # the box would have served in time in bursts (loadtests/results/rag-shed.md), hence:
    shed_late: bool = False
    # With shed_late: shed only once the line has stood, i.e. the oldest request in the
    # class's queue has waited this long (work arrives faster than the box serves it, not
    # a burst it will catch up with), and from then on until this long has passed with no
    # request shed. null: whenever the prediction says so. The shipped rag class: 15000
    # (5x its target): in the recent matrices on the AVX-512 boxes RAG's queue wait p99
    # was at most 8.4 s in bursts (rag-burst x3) and 23-32 s under a flood (home-mix x10).
    shed_after_wait_ms: float | None = Field(None, gt=0)
    # With shed_after_wait_ms: once the line stands, also answer 429 (Retry-After as above)
    # to the queued requests that would wait shed_after_wait_ms again, newest first: the
    # backlog that piled up before the line stood, which otherwise waits its turn (up to
    # 300 s on a box too slow for its load: loadtests/results/matrix-avx2.md). Off: over
    # three rounds the RAG requests answered came in seconds instead of minutes, but almost
    # none were answered and voice and chat were on target less often at home-mix x4 and
    # x10 (loadtests/results/shed-queued.md, shed-queued-3.md).
    shed_queued: bool = False
    ordering: Literal["fcfs", "edf"] = "fcfs"
    fair_share: Literal["vtc", "fcfs"] = "vtc"
    # This class's own first-byte limit (null: upstream.first_byte_timeout_s).
    first_byte_timeout_ms: float | None = Field(None, gt=0)
    # Batching window; null: zero wait for interactive classes, Window() defaults otherwise.
    window: Window | None = None

    def batching_window(self) -> Window:
        """The window in effect: the configured one, else the default for the class kind."""
        if self.window is not None:
            return self.window
        return ZERO_WINDOW if self.interactive else Window()


def _default_classes() -> dict[str, RequestClass]:
    return {
        # A conversation turn that has not started within a minute is better failed over
        # (or answered 503) than left waiting on a worker that hangs.
        "voice": RequestClass(
            priority=0,
            interactive=True,
            ttft_ms=300,
            itl_ms=50,
            max_wait_ms=2000,
            first_byte_timeout_ms=60_000,
        ),
        "chat": RequestClass(
            priority=1, interactive=True, ttft_ms=800, itl_ms=80, first_byte_timeout_ms=60_000
        ),
        # Told early once its line stands instead of queued for minutes on a box too slow
        # for its load: loadtests/results/rag-standing-avx2.md.
        "rag": RequestClass(
            priority=2, ttft_ms=3000, itl_ms=150, shed_late=True, shed_after_wait_ms=15000
        ),
        # An indexing backlog told to come back (429, Retry-After) beats every text
        # answered late: loadtests/results/embed-shed.md.
        "embed": RequestClass(priority=3, ttft_ms=2000, shed_late=True),
        "batch": RequestClass(priority=4, min_share=0.05),
    }


_SHA256_HEX = re.compile(r"^[0-9a-fA-F]{64}$")


def _sha256_hex(v: str | None) -> str | None:
    """A key's SHA-256 as 64 hex digits, normalised to lower case."""
    if v is None:
        return None
    if not _SHA256_HEX.match(v):
        raise ValueError(
            "must be the SHA-256 of the key as 64 hex digits "
            "(printf '%s' \"$KEY\" | sha256sum), not the key itself"
        )
    return v.lower()


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address to listen on or a client address) is this machine only:
    127.0.0.0/8, ::1 (also IPv4-mapped) or ``localhost``. Any other name counts as the
    network."""
    if host.lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


class Auth(_Strict):
    """Who may use the gateway beyond the apps' keys: anonymous access from the network on
    purpose, and the admin key that guards /status and /metrics."""

    # Serve requests without any key although listen.host is reachable from the network.
    # Without it, such a configuration refuses to start. No effect once an app has a key.
    allow_anonymous: bool = False
    # The admin key (`Authorization: Bearer <key>` on /status and /metrics), from the
    # environment variable named, or given as its SHA-256. Without one, /status and
    # /metrics answer only clients on the gateway's own machine (loopback).
    admin_key_env: str | None = Field(None, min_length=1)
    admin_key_sha256: str | None = None

    _hex = field_validator("admin_key_sha256")(_sha256_hex)

    @model_validator(mode="after")
    def _one_admin_key(self) -> Auth:
        if self.admin_key_env is not None and self.admin_key_sha256 is not None:
            raise ValueError("set admin_key_env or admin_key_sha256, not both")
        return self


class App(_Strict):
    """A client app, recognised by its API key: read from the environment variable named
    by ``key_env``, or given as its SHA-256 (``key_sha256``)."""

    name: str = Field(min_length=1, pattern=_NAME)
    key_env: str | None = Field(None, min_length=1)
    key_sha256: str | None = None
    default_class: str | None = None
    weight: float = Field(1.0, gt=0)
    # Whether the app may pick its class with the X-Hearthgate-Class header: a list names
    # the classes it may pick; true: its default class and any class below it (so an app
    # cannot lift itself into the voice band); false: never.
    may_choose_class: bool | list[str] = False
    # The most requests this app may have waiting in queues at once; more get 429.
    max_queued: int | None = Field(256, ge=1)
    # The most requests this app may have admitted at once (all classes and workers); more
    # wait in their queue while other apps' requests go ahead. null: no limit.
    max_in_flight: int | None = Field(None, ge=1)

    _hex = field_validator("key_sha256")(_sha256_hex)

    @model_validator(mode="after")
    def _one_key(self) -> App:
        if self.key_env is not None and self.key_sha256 is not None:
            raise ValueError("set key_env or key_sha256, not both")
        return self

    @property
    def has_key(self) -> bool:
        """Whether the settings give this app a key (its value may still be missing)."""
        return self.key_env is not None or self.key_sha256 is not None


class Rule(_Strict):
    """Classification rule; every condition given must hold. The first matching rule wins."""

    endpoint: str | None = None  # an endpoint's name (gateway/endpoints): chat, rerank...
    model: str | None = None
    stream: bool | None = None
    min_prompt_tokens: int | None = Field(None, ge=0)
    max_prompt_tokens: int | None = Field(None, ge=0)
    min_max_tokens: int | None = Field(None, ge=0)
    max_max_tokens: int | None = Field(None, ge=0)
    class_: str = Field(alias="class")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("endpoint")
    @classmethod
    def _known_endpoint(cls, v: str | None) -> str | None:
        if v is not None and v not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {v!r}; one of {', '.join(ENDPOINTS)}")
        return v


class Tokens(_Strict):
    """How prompt tokens are estimated before a request is admitted."""

    chars_per_token: float = Field(4.0, gt=0)  # heuristic: characters / this, rounded up
    use_worker_tokenizer: bool = False  # ask the worker's /tokenize for long prompts
    tokenizer_min_chars: int = Field(2000, ge=0)  # shorter prompts use the heuristic only
    default_max_tokens: int = Field(256, ge=1)  # assumed output when the client sets none


class Pacing(_Strict):
    """Decode pacing (policies.pacing): cap each worker's background sequences so that the
    mean gap between tokens there (what every stream on the worker sees) stays under a
    target, adjusted from the gaps the gateway relays."""

    # On: it beat every static cap tried, faster streams and more background tokens
    # (loadtests/results/pacing-tune.md, home-mix-paced-sweep.md, defaults-sweep.md).
    # Left on with no target to hold (no target_gap_ms, no interactive itl_ms) it stays off.
    enabled: bool = True
    # The gap to hold; null: target_fraction x the smallest itl_ms of the interactive classes.
    target_gap_ms: float | None = Field(None, gt=0)
    # 0.3 x 50 ms = 15 ms: at RAG 21 req/s 14 ms beat 20 ms (482 vs 371 tok/s, chat TPOT
    # 10 vs 15 ms) and matched 10 ms (pacing-tune.md, runs 2 and 3).
    target_fraction: float = Field(0.3, gt=0, le=1)
    # Prefill pacing: background prompts may use a share of each worker's measured prefill
    # speed (their duty), cut while the interactive streams' mean gap, prefill stalls
    # included, is above prefill_fraction x the smallest interactive itl_ms or an
    # interactive first token is late; the decode cap then counts only gaps no prefill
    # overlapped. null: off, every gap moves the decode cap. 0.5 (25 ms at a 50 ms itl):
    # more background tokens, faster RAG first tokens and 2-3x RAG bursts held where decode
    # pacing alone queued chat in the gateway (loadtests/results/prefill-pacing.md, run 6;
    # 0.4 gave no more, runs 2-3).
    prefill_fraction: float | None = Field(0.5, gt=0, le=1)
    # While a background class's oldest queued request has waited more than half its
    # ttft_ms, the duty may grow until the interactive gap reaches this fraction x the
    # smallest interactive itl_ms instead (not below prefill_fraction); null: off, the
    # duty holds prefill_fraction whatever waits. 0.8 (40 ms at a 50 ms itl): over every
    # matrix point, 3 rounds beside the previous defaults (off), background +24% at
    # home-mix x10 and +6% at rag-burst x2, within -1..+3% elsewhere, interactive work at
    # 99% or more in 9 of 10 points as before; chat TPOT 25 against 13 ms at home-mix x10
    # (loadtests/results/prefill-behind-full.md).
    prefill_behind_fraction: float | None = Field(0.8, gt=0, le=1)
    interval_ms: float = Field(500.0, gt=0)  # how often a worker's cap moves
    # The cap at start and its ceiling: 32 long-prompt sequences in flight gave 427 tok/s
    # where 64 gave 259 (pacing-tune.md, run 3).
    max_cap: int = Field(32, ge=1)
    # Also cap the interactive sequences any one app has on a worker, from the same gaps,
    # once background is at its floor: an app flooding a chat class waits in the gateway,
    # where fair sharing puts the other apps first (policies/pacing.py WorkerPacer). An app
    # is held to it only while another app sent its class a request in the last 10 s
    # (policies/class_apps.py): alone in its class, it would only queue its own turns.
    per_app: bool = True
    # The per-app cap never goes below this: 4 per app kept the chat UI's TTFT p99 at its
    # solo value beside a scraper flood (loadtests/results/noisy-flood-caps.md).
    app_min_cap: int = Field(4, ge=1)
    # The gap the per-app cap holds, as a fraction of the smallest interactive itl_ms
    # (whether or not target_gap_ms is set); null: background's gap (target_fraction's or
    # target_gap_ms). A tighter gap holds a flooding app to fewer sequences: the light
    # app's first tokens come sooner, the flood gets less. With app_gap_steps (the
    # default) it holds only until the worker's light-load speed is measured. Fixed at
    # 0.16 (8 ms at a 50 ms itl) on a CPU with AVX-512, beside a scraper flood and a flood
    # twice as heavy the chat UI's TTFT p99 was 36-44 ms against 50-64 ms at background's
    # 15 ms gap, the scraper keeping 0.71-0.89x of its tokens through vLLM alone, but
    # 0.61x in a slow hour; 6 ms left the scraper 0.62x (loadtests/results/app-gap.md,
    # app-gap-shipped.md, flood-first.md, matrix-tight-1round.md). The per-app cap holds
    # an app only while another app shares its class.
    app_target_fraction: float | None = Field(None, gt=0, le=1)
    # The per-app cap's gap as this many times the worker's own token gap under light load
    # (the shortest mean gap of a 500 ms interval with at most app_min_cap sequences in
    # flight, over the last 10 minutes), so that it follows the box's speed from hour to
    # hour and box to box, never looser than background's gap; the gap above holds until
    # such an interval is seen. null: the gap above always. 3 (the default since
    # 2026-12-07; on an AVX-512 box 6.1-9.3 ms in fast hours, 9.3-10.9 ms with a fifth of
    # the worker's core taken by another process): against a fixed 8 ms the chat UI's
    # TTFT p99 beside a flood was 32 against 36-37 ms in the fast hour and 38-43 against
    # 36 ms in the slowed one, the flood keeping 0.84-0.91x against 0.89-0.96x and
    # 0.82-0.87x against 0.78-0.84x of its tokens through vLLM alone: the flood's share
    # steadier as the box's speed moves (loadtests/results/app-speed3.md,
    # app-speed3-slowed.md). Without AVX-512 the light gap is 7-9 ms, so background's gap
    # holds there as before.
    app_gap_steps: float | None = Field(3.0, ge=1)
    # An app with at least app_min_cap interactive sequences on a worker floods it: it may
    # have only this many prompts in prefill there at once, so a light app's prompt does
    # not wait in vLLM's first-come-first-served queue behind all of its prompts; null: no
    # limit. Only with per_app. A prompt is in prefill until its first token or, sooner,
    # early_prefill_release x its estimated prefill time, so this paces how fast the
    # flooding app's prompts reach the worker rather than counting vLLM's own prefills.
    # 1: beside a scraper flood the chat UI's TTFT p99 96-114 ms
    # where no limit gave 140-296 ms (loadtests/results/flood-1.md).
    flood_prefill: int | None = Field(1, ge=1)
    # Such an app's requests also wait while another app's request of their class on that
    # worker waits for its first token (its real first token, not the early prefill
    # release; for an answer that does not stream, its estimated prefill): vLLM would put
    # the flood's next prompt in the same steps as the light app's. Only with per_app.
    # Beside a scraper flood and a flood twice as heavy the chat UI's TTFT p99 was 39 / 46
    # ms against 52 / 48 ms without, the scraper keeping as much (1,397 / 1,427 tok/s
    # against 1,215 / 1,439; loadtests/results/flood-first.md, three rounds).
    flood_yields: bool = True
    # While another app shares its class, a flooding app's prompt counts against
    # flood_prefill until its first token, not only until early_prefill_release x its
    # estimated prefill time (the estimate runs ahead of a busy worker, and two or three of
    # the flood's prompts were often queued in vLLM when a light app's came). Off: beside
    # the yield it changed neither the chat UI's p99 (43 / 46 ms against 39 / 46) nor the
    # scraper's tokens beyond the rounds' spread (flood-first.md). An app alone in its
    # class keeps the early release either way: it would only queue its own prompts.
    flood_until_first_token: bool = False
    # Background prompts a general worker may have in prefill at once (counted as for
    # flood_prefill), so an interactive prompt waits in vLLM's first-come-first-served
    # queue behind at most these; null: only the prefill token budget and duty hold them.
    # Long-prefill and embeddings workers are not held to it. Off: 1 gave more background
    # at home-mix x4 and x10 (+5%, +14%) but let chat miss in one round of each doubled and
    # tripled RAG burst (91.5%, 96.3%; loadtests/results/bg-prefill.md, bg-prefill-rest.md).
    # `make run` sets it to 1 on a CPU without AVX-512, where each prompt chunk is longer
    # than a token gap may be (deploy/run_local.py gateway_defaults).
    background_prefill: int | None = Field(None, ge=1)
    # A late interactive first token cuts the background (decode) cap as well as the duty:
    # "when_blind" (the default), only in an interval with no decode-only gap to judge the
    # decode batch by (the case the cut is there for: long prompts in prefill all the
    # time), or "always". At light load and in RAG bursts "always" cut the cap 3-4 times in
    # 40 s while no decode-only gap was over target; "when_blind" kept interactive >= 99.1%
    # in every run, RAG on target 88 -> 100% at home-mix x1 and 27 -> 55% at rag-burst x2,
    # background tok/s within noise (-3.5% to +6.8%; loadtests/results/late-blind.md).
    late_cuts_decode_cap: Literal["always", "when_blind"] = "when_blind"
    # How the background cap climbs while the decode gap is under its target and the cap
    # holds work back: "proportional" (the default), the cap times the room the gap leaves
    # (headroom x target / gap - 1), at least one and at most doubling an interval; or
    # "additive", one sequence an interval. A late first token at a RAG burst's start cut
    # the cap to 1 and one a step took the whole burst to climb back (4 ms gaps against 15).
    # Proportional: RAG on target 26 against 16% at home-mix x4 and 76 against 72% at
    # rag-burst x2, background and interactive work as before (loadtests/results/cap-growth.md).
    cap_growth: Literal["additive", "proportional"] = "proportional"


class Shutdown(_Strict):
    """What SIGTERM does: /readyz turns 503 and new and queued requests get 503 at once;
    streams in flight may finish for ``drain_s``, then end with an error event."""

    drain_s: float = Field(10.0, ge=0)


class Scheduler(_Strict):
    w_in: float = Field(1.0, ge=0)
    w_out: float = Field(2.0, ge=0)
    tick_ms: float = Field(50.0, gt=0)  # the ticker that enforces queue timeouts
    # Release a streaming request's prefill budget at this fraction of its estimated
    # prefill time if its first token has not come yet (keeps the worker's prefill
    # pipeline full); null: only the first token releases it.
    early_prefill_release: float | None = Field(0.8, gt=0)
    pacing: Pacing = Pacing()


class RoutingWeights(_Strict):
    """Weights of the router's score terms, each normalised to 0..1 (see policies.routing)."""

    in_flight: float = Field(1.0, ge=0)  # the gateway's own in-flight count on the worker
    waiting: float = Field(1.0, ge=0)  # vLLM's scraped num_requests_waiting
    kv: float = Field(1.0, ge=0)  # vLLM's scraped kv_cache_usage_perc


class Routing(_Strict):
    """Which worker a request goes to (policies.routing)."""

    # Generation requests whose prompt estimate reaches this go to a `long_prefill` worker
    # when one is healthy (null: never); shorter ones go to `general` workers.
    long_prefill_min_tokens: int | None = Field(1024, ge=1)
    weights: RoutingWeights = RoutingWeights()
    # What an unknown (never scraped or stale) gauge counts as, 0..1: 1 = as loaded as the
    # busiest worker, so a worker whose metrics went quiet is not mistaken for an idle one.
    unknown_load: float = Field(1.0, ge=0, le=1)


class RedisConfig(_Strict):
    """Where background jobs (the Batch API) and the fair-share counters are kept."""

    # redis://host:port/db (rediss:// for TLS); null: no Batch API, live traffic only.
    url: str | None = None
    key_prefix: str = Field("hearthgate:", min_length=1)
    # A Redis that does not answer within this counts as down: batches pause, live
    # traffic goes on, the batch and file endpoints answer 503 with Retry-After.
    timeout_s: float = Field(2.0, gt=0)
    # How often each app's fair-share counters are written to Redis (and read at start).
    fairness_snapshot_s: float = Field(5.0, gt=0)
    # Connections to Redis per gateway. Commands beyond this wait (up to timeout_s) for
    # one to come free rather than failing: a burst of batch lines ending at once is
    # queued, not reported as "Redis down".
    max_connections: int = Field(16, ge=1)

    @field_validator("url")
    @classmethod
    def _scheme(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return v


class BatchConfig(_Strict):
    """The OpenAI Batch and Files API (needs ``redis.url``)."""

    # The class every batch line runs in (the lowest band by default: batches fill what
    # interactive and live background work leave over).
    class_: str = Field("batch", alias="class")
    max_lines: int = Field(50_000, ge=1)
    # Uploaded files live in Redis (replicas share them; append-only persistence keeps them).
    max_file_bytes: int = Field(100 * 1024 * 1024, ge=1024)
    # The completion window: OpenAI's "24h". Lines not done by then end as batch_expired.
    completion_window_s: float = Field(24 * 3600, gt=0)
    # Files, batches and their results are removed this long after they end (or upload).
    retention_hours: float = Field(7 * 24, gt=0)
    # Lines one gateway keeps in its scheduler at a time, over all batches (they wait there
    # like live requests of their app; the rest wait in Redis). 128 kept the workers busier
    # than 64: 0.87 against 0.80 of a client sending straight to vLLM (two single runs of
    # `hearthgate bench batch --lines 2000`); 5000 lines at 128: 0.95 (results/batch.md).
    max_waiting: int = Field(128, ge=1)
    # A line claimed by a gateway that stopped renewing its claim this long ago (killed,
    # or cut off from Redis) is run again by another gateway, or by this one restarted.
    claim_timeout_s: float = Field(60.0, gt=0)
    # The name this gateway claims lines under; null: host name and listen port, so a
    # restarted gateway takes its own unfinished lines back at once.
    runner_id: str | None = Field(None, min_length=1)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Settings(BaseSettings):
    """The whole gateway configuration (see ``deploy/settings.example.yaml``)."""

    model_config = SettingsConfigDict(
        env_prefix="HEARTHGATE_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    listen: Listen = Listen()
    auth: Auth = Auth()
    limits: Limits = Limits()
    upstream: Upstream = Upstream()
    health: Health = Health()
    metrics: Metrics = Metrics()
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = False
    workers: list[Worker] = Field(min_length=1)
    classes: dict[str, RequestClass] = Field(default_factory=_default_classes)
    default_class: str = "chat"
    apps: list[App] = Field(default_factory=list)
    rules: list[Rule] = Field(default_factory=lambda: [Rule(endpoint="embeddings", class_="embed")])
    tokens: Tokens = Tokens()
    scheduler: Scheduler = Scheduler()
    routing: Routing = Routing()
    shutdown: Shutdown = Shutdown()
    redis: RedisConfig = RedisConfig()
    batch: BatchConfig = BatchConfig()

    @field_validator("workers")
    @classmethod
    def _unique_names(cls, v: list[Worker]) -> list[Worker]:
        names = [w.name for w in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"worker names must be unique, repeated: {', '.join(dup)}")
        return v

    @model_validator(mode="after")
    def _classes_exist(self) -> Settings:
        known = set(self.classes)
        problems = []
        if self.default_class not in known:
            problems.append(f"default_class: unknown class {self.default_class!r}")
        for i, app in enumerate(self.apps):
            if app.default_class is not None and app.default_class not in known:
                problems.append(f"apps.{i}.default_class: unknown class {app.default_class!r}")
            if isinstance(app.may_choose_class, list):
                for c in app.may_choose_class:
                    if c not in known:
                        problems.append(f"apps.{i}.may_choose_class: unknown class {c!r}")
        for i, rule in enumerate(self.rules):
            if rule.class_ not in known:
                problems.append(f"rules.{i}.class: unknown class {rule.class_!r}")
        if "class_" in self.batch.model_fields_set and self.batch.class_ not in known:
            problems.append(f"batch.class: unknown class {self.batch.class_!r}")
        for w in self.workers:
            for cls in w.limits.max_in_flight_per_class:
                if cls not in known:
                    problems.append(
                        f"workers.{w.name}.limits.max_in_flight_per_class: unknown class {cls!r}"
                    )
        names = [a.name for a in self.apps]
        if len(set(names)) != len(names):
            problems.append("apps: app names must be unique")
        pacing = self.scheduler.pacing
        if (
            "enabled" in pacing.model_fields_set
            and pacing.enabled
            and pacing.target_gap_ms is None
            and self.pacing_gap_ms() is None
        ):
            problems.append(
                "scheduler.pacing: set target_gap_ms, or itl_ms on an interactive class"
            )
        if problems:
            raise ValueError("; ".join(problems) + f" (classes: {', '.join(sorted(known))})")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The YAML file arrives as init values; the environment overrides it.
        return (env_settings, init_settings)

    def has_app_keys(self) -> bool:
        """Whether any app has a key: then every proxied request needs one."""
        return any(a.has_key for a in self.apps)

    def exposure_problem(self) -> str | None:
        """Why these settings must not be served, or None: a listen address reachable from
        the network with no app key would open every endpoint to anyone there, unless
        ``auth.allow_anonymous`` says that is meant. ``hearthgate serve`` refuses to start
        and ``hearthgate check`` fails on it."""
        host = self.listen.host
        if is_loopback(host) or self.has_app_keys() or self.auth.allow_anonymous:
            return None
        return (
            f"listen.host is {host or '(empty)'} (reachable from the network) but no app has "
            "a key: add `key_env` or `key_sha256` to your apps (see "
            "deploy/settings.example.yaml), or set `auth: {allow_anonymous: true}` to serve "
            "anyone on the network on purpose"
        )

    def batch_class(self) -> str:
        """The class batch lines run in: ``batch.class`` if set, else ``batch`` if defined,
        else the lowest band."""
        if "class_" in self.batch.model_fields_set or self.batch.class_ in self.classes:
            return self.batch.class_
        return max(self.classes, key=lambda name: (self.classes[name].priority, name))

    def _tightest_itl_ms(self) -> float | None:
        """The smallest itl_ms of the interactive classes (None: none has one)."""
        itls = [c.itl_ms for c in self.classes.values() if c.interactive and c.itl_ms]
        return min(itls) if itls else None

    def pacing_gap_ms(self) -> float | None:
        """The token gap decode pacing holds (None: pacing is off or has no target)."""
        p = self.scheduler.pacing
        if not p.enabled:
            return None
        if p.target_gap_ms is not None:
            return p.target_gap_ms
        itl = self._tightest_itl_ms()
        return None if itl is None else p.target_fraction * itl

    def app_pacing_gap_ms(self) -> float | None:
        """The token gap the per-app cap holds (None: pacing is off or has no target)."""
        gap = self.pacing_gap_ms()
        fraction = self.scheduler.pacing.app_target_fraction
        itl = self._tightest_itl_ms()
        if gap is None or fraction is None or itl is None:
            return gap
        return fraction * itl

    def prefill_gap_ms(self) -> float | None:
        """The interactive token gap, prefill stalls included, that prefill pacing holds
        (None: decode pacing or prefill pacing is off, or no interactive class has itl_ms)."""
        p = self.scheduler.pacing
        if p.prefill_fraction is None or self.pacing_gap_ms() is None:
            return None
        itl = self._tightest_itl_ms()
        return None if itl is None else p.prefill_fraction * itl

    def prefill_behind_gap_ms(self) -> float | None:
        """The interactive gap prefill pacing may allow while background work is behind
        (None: off, or prefill pacing is off)."""
        p = self.scheduler.pacing
        prefill_ms = self.prefill_gap_ms()
        if p.prefill_behind_fraction is None or prefill_ms is None:
            return None
        itl = self._tightest_itl_ms()
        assert itl is not None  # prefill_gap_ms is only set when there is one
        return max(prefill_ms, p.prefill_behind_fraction * itl)

    def choosable_classes(self, app: App) -> list[str]:
        """The classes ``app`` may pick with the X-Hearthgate-Class header."""
        choice = app.may_choose_class
        if choice is False:
            return []
        if isinstance(choice, list):
            return [c for c in choice if c in self.classes]
        own = self.classes[app.default_class or self.default_class].priority
        return [name for name, c in self.classes.items() if c.priority >= own]

    def models(self) -> list[str]:
        """Every model name served by some worker, in settings order, without repeats."""
        seen: dict[str, None] = {}
        for w in self.workers:
            for m in w.models:
                seen.setdefault(m, None)
        return list(seen)


def _format_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"  {key}: {msg}")
    return "\n".join(lines)


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Read ``path`` (YAML), apply environment overrides, validate; raise SettingsError."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as exc:
            raise SettingsError(f"cannot read settings file {p}: {exc.strerror}") from exc
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SettingsError(f"settings file {p} is not valid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise SettingsError(f"settings file {p} must hold a mapping at the top level")
        data = loaded
    data.update(overrides)
    try:
        return Settings(**data)
    except ValidationError as exc:
        where = f" in {path}" if path is not None else ""
        raise SettingsError(f"invalid settings{where}:\n{_format_error(exc)}") from exc
