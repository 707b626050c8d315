"""Pydantic schema of the policy file (YAML).

Shape of a policy file::

    listen: {host: 127.0.0.1, port: 8080}
    max_body_bytes: 33554432            # bodies above this get a 413 (case B19)
    backends:
      local: {kind: local, base_url: http://127.0.0.1:8081/v1, model_path: null, spawn: true}
      openai: {kind: openai, base_url: https://api.openai.com/v1, api_key: ${OPENAI_API_KEY}}
    routes:
      - {match: "claude-*", backend: anthropic}
      - {match: "*", backend: local, default_max_tokens: 512}
    default_max_tokens: 1024            # cap for requests that name none (0 = no cap)
    rewrite: {enabled: true, canonicalize_tools: true, hoist_volatile: guarded, ...}
    meaning_guard: {enabled: true, margin: 0.15}   # when a guarded move turns on (guard_settings)
    ledger: {path: ~/.cache/prefixgate/ledger.sqlite, store_prompt_text: false}
    limits: {max_json_depth: 128, max_header_bytes: 65536, header_timeout_s: 10, ...}
    holdout: {fraction: 0.1, seed: 7}   # A/B: that share of sessions is sent unrewritten
    slo: {default: {ttft_ms: 2000, tpot_ms: 200}, routes: {"claude-*": {ttft_ms: 1500}}}
    auth:                               # optional proxy keys (prefixgate keys add)
      keys_file: policy.keys.yaml       # relative to the policy file
      keys: [{id: k_3f9a, name: ci, hash: "sha256:...", rpm: 60, tpm: 100000}]

API keys are kept as the literal ``${ENV_VAR}`` template and resolved only when a request is sent
(:func:`prefixgate.config.secrets.resolve_secret`), so a key never sits in a parsed policy object or a log.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from prefixgate.config.engine_settings import EngineSettings
from prefixgate.config.guard_settings import MOVES, GuardSettings, MoveMode, TrialBudget, move_mode
from prefixgate.config.pd_settings import PDSettings
from prefixgate.config.routing import (
    AffinitySettings,
    BreakerSettings,
    Deployment,
    HealthCheckSettings,
    RetrySettings,
    RouteTargets,
    Timeouts,
    check_base_url,
)

BackendKind = Literal["local", "openai_compat", "llamacpp", "openai", "anthropic"]

_ENV_TEMPLATE = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*\}$")
KEY_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
KEY_HASH_PATTERN = r"^sha256:[0-9a-f]{64}$"
_TENANT_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,64}(/[A-Za-z0-9_.-]{1,64})?$")


class _Strict(BaseModel):
    # attribute docstrings become field descriptions (docs/policy.md, prefixgate/config/reference.py)
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class Listen(_Strict):
    """Address the proxy listens on."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=1, le=65535)


class Backend(_Strict):
    """One upstream.

    ``kind``: ``local`` (our engine, spawned by ``prefixgate serve`` when ``spawn``),
    ``openai_compat`` (vLLM, SGLang, llama.cpp, our engine run elsewhere), ``llamacpp``
    (llama.cpp's server with each conversation pinned to one of its ``slots``), ``openai``,
    ``anthropic``. ``api_key`` must be a ``${ENV_VAR}`` template, never a literal key.
    ``deployments``: several base URLs / keys serving the same models (a deployment group,
    :mod:`prefixgate.config.routing`); without it the backend is one deployment, ``base_url`` +
    ``api_key``. ``timeouts``: connect / first byte / idle / total (``timeout_s`` fills the
    ones left unset). ``affinity``: how a group's deployment is picked.
    """

    kind: BackendKind
    base_url: str
    api_key: str | None = None
    deployments: list[Deployment] = Field(default_factory=list)
    timeouts: Timeouts = Field(default_factory=Timeouts)
    affinity: AffinitySettings = Field(default_factory=AffinitySettings)
    model_path: str | None = None
    spawn: bool = False
    """``local`` only: ``prefixgate serve`` starts the engine itself, on a random loopback port
    that only the proxy uses (an SDK pointed at ``base_url`` by mistake finds nothing there, so
    no request bypasses the proxy and its ledger); an engine already answering at ``base_url``
    with the model is reused instead."""
    device: str = "cpu"
    timeout_s: float = Field(600.0, gt=0)
    cache_salt: bool | None = None
    """Send the request's tenant as a ``cache_salt`` body field (our engine and vLLM >= 0.9 key
    their prefix cache by it, so tenants never share cached KV). None: on for ``local``, off
    otherwise (a backend that rejects unknown fields would 400); set true for a vLLM fleet."""
    price_per_mtok: float | None = Field(None, ge=0)
    """USD per 1M uncached input tokens on this backend, for models the dated price table
    (``prefixgate/config/prices.py``) does not price or prices as self-hosted (0): the ledger's
    ``input_usd`` / ``cf_input_usd`` of this backend's rows then come from it, so a vLLM /
    llama.cpp / local deployment's savings read in dollars. None: not priced here."""
    cached_price_per_mtok: float = Field(0.0, ge=0)
    """USD per 1M input tokens served from the prefix cache, with ``price_per_mtok`` (default
    0: on an engine you run a cached token costs no prefill compute)."""
    tenant_keys: dict[str, str] = Field(default_factory=dict)
    """Per-tenant upstream keys, tenant -> ``${ENV_VAR}``: a request of that tenant (or of a
    sub-tenant ``<tenant>/...``) is sent with that key instead of ``api_key`` (on every
    deployment of the backend). A hosted API keeps one prompt cache per organisation, so
    tenants sharing the proxy's one key share one provider cache; a key of the tenant's own
    organisation (an Anthropic workspace) keeps its prompts out of the others' reach. A tenant
    named here whose variable is unset is refused (424), never sent with the shared key."""
    tenant_keys_required: bool = False
    """Refuse (403) a tenant's request to this backend when ``tenant_keys`` has no key for it,
    instead of sending it with the shared ``api_key``. Requests without a tenant are not
    affected."""
    slots: int = Field(1, ge=1, le=1024)
    """``llamacpp``: slots per deployment (its server's ``--parallel``); each conversation is
    pinned to one (``id_slot``, :mod:`prefixgate.proxy.routing.slots`)."""
    pd: PDSettings | None = None
    """Prefill/decode disaggregation: a prefill and a decode endpoint, the contract they speak
    and when to split (:mod:`prefixgate.config.pd_settings`). None: one endpoint does both."""
    usd_per_hour: float | None = Field(None, ge=0)
    """What the deployment costs per hour (GPU rental, amortised hardware): the report prices
    the prefill time saved at it (``prefill_usd_saved`` = prefill seconds saved x this / 3600;
    a busy engine turns a second of prefill saved into a second of capacity). Exclusive with
    ``price_per_mtok``."""

    @model_validator(mode="before")
    @classmethod
    def _base_url_from_group(cls, data: object) -> object:
        if isinstance(data, dict) and "base_url" not in data and data.get("deployments"):
            first = data["deployments"][0]
            if isinstance(first, dict) and "base_url" in first:
                return {**data, "base_url": first["base_url"]}
        return data

    @field_validator("api_key")
    @classmethod
    def _key_is_env_template(cls, v: str | None) -> str | None:
        if v is not None and not _ENV_TEMPLATE.match(v):
            raise ValueError("api_key must be an environment reference like ${OPENAI_API_KEY}")
        return v

    @field_validator("base_url")
    @classmethod
    def _url_has_scheme(cls, v: str) -> str:
        return check_base_url(v)

    @model_validator(mode="after")
    def _one_price(self) -> Backend:
        if self.price_per_mtok is not None and self.usd_per_hour is not None:
            raise ValueError("set price_per_mtok or usd_per_hour, not both")
        return self

    @model_validator(mode="after")
    def _tenant_keys(self) -> Backend:
        for tenant, ref in self.tenant_keys.items():
            if not _TENANT_KEY.match(tenant):
                raise ValueError(f"tenant_keys: {tenant[:70]!r} is not a tenant name (1-64 of "
                                 "A-Z a-z 0-9 _ . -, optionally /<sub-tenant>)")
            if not _ENV_TEMPLATE.match(ref):
                raise ValueError(f"tenant_keys[{tenant}] must be an environment reference like "
                                 "${ACME_OPENAI_KEY}, never the key itself")
        return self

    @model_validator(mode="after")
    def _deployment_keys(self) -> Backend:
        for i, d in enumerate(self.deployments):
            if d.api_key is not None and not _ENV_TEMPLATE.match(d.api_key):
                raise ValueError(f"deployments[{i}].api_key must be an environment reference "
                                 "like ${OPENAI_API_KEY}")
        return self

    _groups: dict[tuple[Any, ...], tuple[Deployment, ...]] = PrivateAttr(default_factory=dict)

    def group(self, name: str) -> list[Deployment]:
        """This backend's deployments, named (``<name>#<i>`` unless named), keys defaulted to
        the backend's; one deployment (``base_url``, ``api_key``) for a plain backend.

        Asked on every request (the router's order): the validated ``Deployment`` s are built
        once per ``(name, base_url, api_key, each deployment's fields)`` and the same objects
        returned in a new list (building them validated each URL again: ~40 us a request in
        issue 25's profile). A field changed since gives another key, so new objects."""
        key = (name, self.base_url, self.api_key,
               tuple((d.base_url, d.api_key, d.name, id(d.kv_events)) for d in self.deployments))
        made = self._groups.get(key)
        if made is None:
            if not self.deployments:
                made = (Deployment(base_url=self.base_url, api_key=self.api_key, name=name),)
            else:
                made = tuple(Deployment(base_url=d.base_url, api_key=d.api_key or self.api_key,
                                        name=d.name or f"{name}#{i}", kv_events=d.kv_events)
                             for i, d in enumerate(self.deployments))
            if len(self._groups) >= 16:  # a backend's name / fields rarely change: stay small
                self._groups.clear()
            self._groups[key] = made
        return list(made)

    def timeouts_s(self) -> tuple[float, float, float, float | None]:
        """(connect, first byte, idle, total) seconds, unset ones from ``timeout_s``."""
        t = self.timeouts
        return (min(t.connect_s, self.timeout_s), t.first_byte_s or self.timeout_s,
                t.idle_s or self.timeout_s, t.total_s)


class Route(RouteTargets):
    """Model-name glob (fnmatch, e.g. ``gpt-*``) mapped to a backend name (``backend``), or to
    an ordered list (``backends``) with ``fallbacks`` and an upstream ``model`` name
    (:class:`prefixgate.config.routing.RouteTargets`).

    ``default_max_tokens``: the output cap a request of this route gets when it names none
    (OpenAI ``max_tokens`` / ``max_completion_tokens``, Responses ``max_output_tokens``); unset =
    the policy's ``default_max_tokens``; ``0`` = no cap for this route (the backend's own).
    """

    match: str
    default_max_tokens: int | None = Field(None, ge=0)
    cache_diagnostics: bool | None = None
    """Ask the provider why its prefix cache missed (Anthropic cache diagnostics: the beta
    header and ``diagnostics.previous_message_id`` = the session's previous answer; OpenAI
    Responses: ``prompt_cache_options.comparison_response_id``); None: the policy's
    ``rewrite.cache_diagnostics``. Read whenever an answer carries them, asked or not
    (:mod:`prefixgate.proxy.core.diagnostics`)."""
    meaning_guard_budget: TrialBudget | None = None
    """What this route's meaning-guard trials may spend per day; None: the guard's
    ``local_budget`` or ``hosted_budget`` by the backend's price
    (:mod:`prefixgate.config.guard_settings`)."""


HoistTarget = Literal["auto", "end", "last_user", "system_end", "reminder"]
HOIST_TARGET_BY_API: dict[str, str] = {"openai": "reminder", "anthropic": "end"}
"""Where ``hoist_target: auto`` puts the hoisted note when ``hoist_volatile`` is on, per client
API (placements in ``prefixgate/rewriter/analysis/note_placement.py``). Chosen by measurement
(``bench/answer_stability.py`` -> ``bench/results/answer_stability.json``,
``figures.default_placement``; 101 agent turns, greedy on our engine, the moves on): among the
placements that keep the prefix reusable (cached share from the third request on within 0.02 of
the best), the fewest answers about the note, then the fewest changed answers. OpenAI
``reminder``: 48 changed, 6 about the note (``end`` 51 / 9, ``system_end`` 61 / 33;
``last_user`` 45 / 4 re-reads a tool loop's history: 0.767 cached against 0.812); Anthropic
``end``: 50 / 5 (``reminder`` 48 / 6). ``tests/config/test_hoist_default.py`` keeps the two equal."""


MOVES_THE_MODEL_READS = ("hoist_volatile", "stabilise_passages")
"""The passes that move text the model reads to where the client did not put it. Measured
(``bench/answer_stability.py`` -> ``bench/results/answer_stability.json``, 101 agent turns,
greedy on our engine): with them off 0 answers change; with them on, 48 of 101 at the best
placement (taking the clock out of the system prompt alone: 22 of the 61 turns where it moved;
restoring a retrieval's first-seen order alone: 2 of 7 reordered turns), against 1 of 101 for
the clock's value advancing; what they buy there: cached share from the third request on 0.245
-> 0.804. DESIGN.md: "a pass that changes what the model answers is a defect", and whether they
change a given backend's answers is a fact about that backend: like the pruning passes they
ship ``guarded`` (:data:`prefixgate.config.guard_settings.MOVES`), on for a route only after a
bounded trial on that route's own backend shows its changed-answer rate within the floor's
margin (DESIGN.md "Meaning at the model level"; ``docs/changes.md``); ``on`` / ``off`` force
them."""


def switch_on(settings: RewriteSettings, switch: str) -> bool:
    """Whether the pass switch ``switch`` of ``settings`` is on: a bool switch when True, a
    move's :data:`MoveMode` only when exactly ``"on"``. ``"guarded"`` unresolved is NOT on: the
    proxy resolves it per route before the passes run
    (:mod:`prefixgate.proxy.pipeline.guard_moves`); anything else that runs them (the
    ``prefixgate rewrite`` dry run, the benchmarks) has no verdict. Every reader of a pass switch
    goes through here. Raises AttributeError for a name that is no ``RewriteSettings`` field."""
    value = getattr(settings, switch)
    return value is True or value == "on"


class RewriteSettings(_Strict):
    """Switches for each rewrite pass; ``enabled: false`` turns the whole pipeline off. The
    moves (:data:`prefixgate.config.guard_settings.MOVES`) take ``off | on | guarded`` (a bool
    is read as on / off); read a switch with :func:`switch_on`.

    ``hoist_target``: where ``hoist_volatile`` puts its note (``auto``: per API,
    :data:`HOIST_TARGET_BY_API`); ``learn_volatility``: also hoist system lines no detector
    recognises once seen changing (a detector's clock or id is hoisted once seen changing, or
    when its line marks it per-request, with or without this switch).
    """

    enabled: bool = True
    canonicalize_tools: bool = True
    tool_order: Literal["name", "first_seen"] = "first_seen"
    """``first_seen``: a session's first request keeps its tools as sent, later ones get that
    form back; ``name``: sorted by name and canonical on every request
    (:mod:`prefixgate.rewriter.passes.canonicalize_tools`)."""
    tool_schema_sort_properties: bool = False
    hoist_volatile: MoveMode = "guarded"
    """A move (:data:`MOVES_THE_MODEL_READS`; ``off | on | guarded``): move a clock / id /
    changing line out of the system prompt into a note after the conversation."""
    hoist_target: HoistTarget = "auto"
    learn_volatility: bool = True
    stabilise_passages: MoveMode = "guarded"
    """A move (:data:`MOVES_THE_MODEL_READS`; ``off | on | guarded``): injected passages keep
    the order the session first saw them in (nothing removed)."""
    place_breakpoints: bool = True
    breakpoint_ttl: Literal["5m", "1h", "auto"] = "auto"
    """TTL of the breakpoints prefixgate places; ``auto``: the lower expected cost over the
    session's measured inter-arrival times (``prefixgate/rewriter/analysis/ttl_choice.py``; 5m until
    3 are known)."""
    openai_prompt_cache_key: bool = True
    """OpenAI routes (``provider: openai`` only): add ``prompt_cache_key`` = tenant + a hash of
    prefixgate's session id, one key per conversation, unless the client sent one. Request
    metadata the model never reads; keeps each conversation on the machine holding its prefix
    (``bench/results/prompt_cache_key.json``; :mod:`prefixgate.rewriter.passes.breakpoints`)."""
    openai_prompt_cache_retention: str | None = None
    """OpenAI routes: ``prompt_cache_retention`` to add when the client sent none (``"24h"``
    extended retention, ``"in_memory"``); the client's own value always passes through."""
    cache_diagnostics: bool = False
    """Anthropic routes: ask for the provider's cache-miss reason (beta
    ``cache-diagnosis-2026-04-07``, ``diagnostics.previous_message_id`` from the session's
    previous answer; the first request sends ``null`` so the provider keeps a fingerprint to
    compare with); Responses requests to OpenAI: ``prompt_cache_options.comparison_response_id``
    = the session's previous response (GPT-5.6 and later serve it). Off by default: a beta, the
    provider keeps a fingerprint (hashes and token counts) of each request that asks, and older
    models may refuse the field; per route: ``routes[].cache_diagnostics``. What an answer
    reports is read whether asked or not."""
    tenant: str = "default"
    prune_tools: MoveMode = "guarded"
    """A move (``off | on | guarded``): only the tools the conversation can need."""
    prune_tools_min_catalog: int = Field(30, ge=1)
    pinned_tools: list[str] = Field(default_factory=list)
    prune_history: MoveMode = "guarded"
    """A move (``off | on | guarded``): old turns compacted past the high watermark."""
    history_high_watermark_tokens: int = Field(6000, ge=1)
    history_low_watermark_tokens: int = Field(3000, ge=1)
    prune_rag: MoveMode = "guarded"
    """A move (``off | on | guarded``): retrieved passages cut to ``rag_budget_tokens``."""
    rag_budget_tokens: int = Field(2000, ge=1)
    rag_delimiters: list[str] = Field(default_factory=list)
    time_budget_ms: int = Field(1000, ge=1, le=600_000)
    """Wall-clock budget of one request's rewrite (worker thread, queueing included); past it
    the request goes upstream exactly as the client sent it (edit summary ``over_budget``).
    Typical agent requests take 5-15 ms (bench/results/rewrite_overhead.json)."""
    edit_detail_header: bool = False
    """Opt-in: answer with ``x-prefixgate-edit-detail``, compact JSON of every Edit (pass,
    region, tokens before / after, token offsets; no prompt text), bounded in size
    (:mod:`prefixgate.proxy.pipeline.edit_detail`)."""
    stand_back: bool = True
    """Per route and tenant (each judged on its own requests), switch off the passes that add
    tokens while the holdout or the counterfactual shows the rewritten arm no better than the
    client's own bodies (:mod:`prefixgate.cache.savings.stand_back`)."""
    stand_back_min_requests: int = Field(20, ge=2, le=10_000)
    """Requests (per arm for the holdout) a verdict needs."""
    stand_back_s: float = Field(900.0, gt=0)
    """Seconds a stand-back lasts; then the passes run again and a fresh verdict is taken."""

    @field_validator(*MOVES, mode="before")
    @classmethod
    def _move_mode(cls, v: Any) -> Any:
        return move_mode(v)  # a bool is a mode: True -> on, False -> off (guard_settings)

    @model_validator(mode="after")
    def _watermarks_ordered(self) -> RewriteSettings:
        if self.history_low_watermark_tokens > self.history_high_watermark_tokens:
            raise ValueError("history_low_watermark_tokens must not exceed the high watermark")
        return self


class LedgerSettings(_Strict):
    """Where per-request records go. Prompt text is never stored unless ``store_prompt_text``.

    ``redis_url``: shared state of several proxy replicas (session memory, counters; see
    :mod:`prefixgate.cache.state.redis_link`); ``redis_prefix``: prefix of every key prefixgate writes there;
    ``batch_writes``: ledger rows go to SQLite from a background writer thread, many rows per
    transaction (:mod:`prefixgate.cache.ledger.writer`), flushed on shutdown.

    Issue 26, one ledger for many replicas: ``url`` (``postgresql://...``) puts the ledger in
    PostgreSQL instead of the file at ``path`` (:mod:`prefixgate.cache.ledger.pg`); ``replica``
    names this process in the rows' ``replica`` column (default ``<hostname>:<pid>``);
    ``flush_interval_s``: the writer commits what has queued at least this often (seconds);
    ``spool_path`` / ``spool_max_rows``: while PostgreSQL is unreachable rows wait in this SQLite
    file, at most this many (later ones are dropped and counted), and drain when it returns;
    ``write_timeout_s``: the writer's client-side deadline on one round with PostgreSQL
    (connect, batch, spool drain; a hung server: past it the batch spools, issue 34), which
    also bounds what a SIGKILL can lose (``docs/workers.md``)."""

    path: str = "~/.cache/prefixgate/ledger.sqlite"
    redis_url: str | None = None
    redis_prefix: str = "prefixgate:"
    store_prompt_text: bool = False
    batch_writes: bool = True
    url: str | None = None
    replica: str | None = Field(None, min_length=1, max_length=128)
    flush_interval_s: float = Field(0.02, gt=0, le=60)
    spool_path: str = "~/.cache/prefixgate/ledger-spool.sqlite"
    spool_max_rows: int = Field(100_000, ge=1)
    write_timeout_s: float = Field(5.0, gt=0, le=600)

    @field_validator("url")
    @classmethod
    def _postgres_url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("postgresql://", "postgres://")):
            raise ValueError("ledger.url must be a postgresql:// URL (or unset for SQLite)")
        return v


class Limits(_Strict):
    """Bounds on what one client connection or request may cost (issue 8, HTTP hygiene).

    - ``max_json_depth``: arrays / objects nested deeper than this are a 400 before any pass or
      bridge runs. 128 is far above real bodies (deep JSON schemas stay under ~20) and well
      under orjson's serialisation limit of 255 levels, leaving room for the levels a bridge
      adds when it wraps content; capped at 200 for that reason.
    - ``max_header_bytes``: request line + headers of one request, bytes, up to the blank line
      that ends them (431 above it); body bytes never count, however they arrive
      (:mod:`prefixgate.proxy.http.server`).
    - ``header_timeout_s``: a request's headers must be complete this many seconds after its
      first byte (or after the connection opened); else the connection is closed.
    - ``body_timeout_s``: the whole body must arrive within this many seconds after the headers
      (408 in the caller's shape); 60 s means at least ~0.5 MB/s for a 32 MB body.
    - ``keep_alive_s``: an idle keep-alive connection is closed after this many seconds.
    - ``max_connections``: open connections + running requests; above it new requests get 503
      (uvicorn ``limit_concurrency``). ``backlog``: the listen socket's accept queue.
    """

    max_json_depth: int = Field(128, ge=8, le=200)
    max_header_bytes: int = Field(64 * 1024, ge=1024, le=16 * 1024 * 1024)
    header_timeout_s: float = Field(10.0, gt=0)
    body_timeout_s: float = Field(60.0, gt=0)
    keep_alive_s: float = Field(5.0, gt=0)
    max_connections: int = Field(1024, ge=1)
    backlog: int = Field(2048, ge=1)


class HoldoutSettings(_Strict):
    """Holdout A/B (issue 9): ``fraction`` (0-1) of sessions, chosen by a hash of the session
    id and ``seed``, are sent unrewritten (as with ``x-prefixgate-rewrite: off``) and flagged
    in the ledger, so rewriting can be compared with not rewriting on the same traffic.
    0 (the default) = off."""

    fraction: float = Field(0.0, ge=0.0, le=1.0)
    seed: int = 0


class Slo(_Strict):
    """Latency objectives of a route, milliseconds: TTFT (time to first token) and TPOT (time
    per output token after the first). A request meets its SLO when both hold (goodput)."""

    ttft_ms: float = Field(2000.0, gt=0)
    tpot_ms: float = Field(200.0, gt=0)


class SloSettings(_Strict):
    """``default`` applies to every route not named in ``routes`` (keys: a route's ``match``
    glob, as the ledger's ``route`` column stores it)."""

    default: Slo = Field(default_factory=Slo)
    routes: dict[str, Slo] = Field(default_factory=dict)

    def for_route(self, route: str) -> Slo:
        """The SLO of ``route`` (its own, else the default)."""
        return self.routes.get(route, self.default)


class ProxyKey(_Strict):
    """One proxy-facing key, as stored: never the key itself, only ``hash`` =
    ``sha256:<hex>`` of it (see :mod:`prefixgate.proxy.http.auth` for why a plain SHA-256 suffices for a
    256-bit random key). ``id`` is public (it goes into the ledger); ``rpm`` / ``tpm``: requests
    and tokens (prompt + output) per minute, None = unlimited; tokens are charged as they are
    spent (:mod:`prefixgate.proxy.http.auth`)."""

    id: str = Field(pattern=KEY_ID_PATTERN)
    name: str = ""
    hash: str = Field(pattern=KEY_HASH_PATTERN)
    rpm: int | None = Field(None, ge=1)
    tpm: int | None = Field(None, ge=1)
    created: str = ""
    tenant: str | None = Field(None, pattern=KEY_ID_PATTERN)
    """The tenant this key's requests belong to (None: the key's own ``id``)."""
    admin: bool = False
    """An operator's key: ``/api/savings`` and the dashboard show every tenant's traffic to
    it (any other key sees its own tenant's only, :mod:`prefixgate.proxy.observe.savings_api`)."""


class AuthSettings(_Strict):
    """Optional proxy keys: inline ``keys`` and / or a ``keys_file`` (YAML ``{keys: [...]}``,
    written by ``prefixgate keys add``; a relative path is resolved against the policy file's
    folder by :func:`prefixgate.config.loader.load_policy`). No key at all = no authentication, allowed
    only on a loopback address."""

    keys: list[ProxyKey] = Field(default_factory=list)
    keys_file: str | None = None
    """Unset: ``prefixgate serve`` reads the default keys file, ``~/.config/prefixgate/keys.yaml``
    (``$PREFIXGATE_KEYS_FILE``), which ``prefixgate keys add`` without ``--policy`` writes."""

    @model_validator(mode="after")
    def _ids_unique(self) -> AuthSettings:
        ids = [k.id for k in self.keys]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"auth.keys ids must be unique; repeated: {dup}")
        return self


class FanoutSettings(_Strict):
    """First-writer gating of fan-outs (``prefixgate/proxy/routing/fanout.py``): when requests sharing a
    prefix nobody has cached yet arrive together, the first goes upstream and the others wait until
    its response headers arrive (its cache write is then readable) or ``max_hold_ms`` /
    ``ttft_factor`` x the observed TTFT passes, whichever comes first.

    ``warm_s``: a prefix whose writer answered is sent through without holding for this many
    seconds; ``min_prefix_bytes``: shorter shared prefixes are never held (below any
    provider's minimum cacheable length); ``providers``: whose backends are gated — not
    ``radix`` by default: our engine already reuses a prefix within one batch
    (``bench/results/fanout_engine.json``: holding saved no prefill there)."""

    enabled: bool = False
    providers: list[str] = Field(default_factory=lambda: ["anthropic", "openai"])
    max_hold_ms: int = Field(5000, ge=1, le=120_000)
    ttft_factor: float = Field(2.0, gt=0)
    warm_s: float = Field(300.0, gt=0)
    min_prefix_bytes: int = Field(4096, ge=0)


class TenantSettings(_Strict):
    """Who a request belongs to (:mod:`prefixgate.proxy.http.tenants`). ``header``: whether the
    ``x-prefixgate-tenant`` header names the tenant — ``off`` (ignored), ``on`` (without proxy
    keys it is the tenant; with keys it names a sub-tenant inside the key's own tenant, so a key
    never reaches another key's namespace)."""

    header: Literal["off", "on"] = "off"
    salt_secret: str | None = None
    """The secret the tenants' ``cache_salt`` is keyed with (HMAC-SHA256,
    :mod:`prefixgate.proxy.http.salt_key`): a ``${ENV_VAR}`` reference to at least 32 bytes.
    None: a per-install secret generated on first need in
    ``~/.cache/prefixgate/tenant_salt.key`` (mode 0600). Set it when several hosts serve one
    engine fleet, so they send the same salts. No usable secret: a tenant's request to a backend
    that takes a salt is refused (424), never sent unsalted."""

    @field_validator("salt_secret")
    @classmethod
    def _secret_is_env_template(cls, v: str | None) -> str | None:
        if v is not None and not _ENV_TEMPLATE.match(v):
            raise ValueError("salt_secret must be an environment reference like "
                             "${PREFIXGATE_SALT_SECRET}, never the secret itself")
        return v


class Policy(_Strict):
    """The whole policy file. Raises ``pydantic.ValidationError`` on bad input."""

    listen: Listen = Field(default_factory=Listen)
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    backends: dict[str, Backend]
    routes: list[Route]
    rewrite: RewriteSettings = Field(default_factory=RewriteSettings)
    meaning_guard: GuardSettings = Field(default_factory=GuardSettings)
    """When a ``guarded`` move turns on per route (:mod:`prefixgate.config.guard_settings`)."""
    ledger: LedgerSettings = Field(default_factory=LedgerSettings)
    limits: Limits = Field(default_factory=Limits)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    holdout: HoldoutSettings = Field(default_factory=HoldoutSettings)
    slo: SloSettings = Field(default_factory=SloSettings)
    fanout: FanoutSettings = Field(default_factory=FanoutSettings)
    tenants: TenantSettings = Field(default_factory=TenantSettings)
    aliases: dict[str, str] = Field(default_factory=dict)
    """Model names a client may use for another: ``{fast: gpt-4o-mini}`` routes and sends
    ``gpt-4o-mini`` when the client asks for ``fast`` (one level, no chains)."""
    retry: RetrySettings = Field(default_factory=RetrySettings)
    breaker: BreakerSettings = Field(default_factory=BreakerSettings)
    health_checks: HealthCheckSettings = Field(default_factory=HealthCheckSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    """The local engines ``prefixgate serve`` spawns (:mod:`prefixgate.config.engine_settings`)."""
    default_max_tokens: int = Field(1024, ge=0)
    """Output-token cap (tokens) given to a request that names none, unless its route says
    otherwise; ``0`` = no cap. A client that sends no cap (LangChain sends none) would otherwise
    get the backend's own: for our engine and vLLM, the rest of the context window — minutes of
    decode on a CPU."""

    @model_validator(mode="after")
    def _routes_name_backends(self) -> Policy:
        for i, r in enumerate(self.routes):
            for t in r.chain():
                if t.backend not in self.backends:
                    raise ValueError(f"routes[{i}] names backend {t.backend!r}, which is not "
                                     f"one of {sorted(self.backends)}")
        if not self.routes:
            raise ValueError("routes must not be empty")
        return self
