"""Policy sections for routing across several upstreams (issue 10, items 2-4).

- :class:`Deployment`: one base URL (and key) serving a backend's models; a backend with
  ``deployments`` is a *deployment group* (several vLLM / SGLang / engine replicas, several
  provider accounts) and its own ``base_url`` defaults to the first deployment's.
- :class:`Timeouts`: connect, first byte (the response head), idle between chunks, total.
- :class:`RetrySettings`: tries per deployment, exponential backoff with full jitter, the
  largest ``retry-after`` the proxy waits out.
- :class:`BreakerSettings`: a circuit breaker per deployment.
- :class:`AffinitySettings`: prefix affinity among a group's deployments with a load guard.
- :class:`HealthCheckSettings`: optional active health checks (``GET <base_url>/models``).
- :class:`FallbackTarget`: a route's fallback backend, with the model name it knows the model by.

Every section has defaults, so a policy written before these existed loads unchanged.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def check_base_url(v: str) -> str:
    """``v`` without trailing slashes; ValueError unless it starts with http:// or https://."""
    if not v.startswith(("http://", "https://")):
        raise ValueError("base_url must start with http:// or https://")
    return v.rstrip("/")


class KVEventsSettings(_Strict):
    """Where a deployment publishes its KV cache events (vLLM's ``--kv-events-config``, our
    engine's ``--kv-events-endpoint``), for exact prefix-aware routing (issue 24).

    ``endpoint``: the ZMQ PUB endpoint to subscribe to (``tcp://host:5557``); ``replay``: its
    replay socket (``tcp://host:5558``; None: gaps are repaired by nothing, the index waits for
    the next full state); ``topic``: the PUB topic; ``block_size``: tokens per block, the
    engine's (vLLM's ``--block-size``); ``hash``: how the router recomputes block hashes —
    ``sha256_cbor`` (vLLM's ``--prefix-caching-hash-algo sha256_cbor``, with ``seed`` = the
    engine's ``PYTHONHASHSEED``, default ``vllm-none-hash``) or ``sha256`` (our engine's
    default form); ``max_staleness_s``: the index is trusted only while the stream was seen
    alive (an event or an answered replay probe) this recently; ``subscribe``: False when this
    proxy replica does not follow the stream itself but routes on the index summary another
    replica shares through Redis (:mod:`prefixgate.proxy.routing.kv_shared`)."""

    endpoint: str
    replay: str | None = None
    topic: str = ""
    block_size: int = Field(16, ge=1, le=4096)
    hash: Literal["sha256", "sha256_cbor"] = "sha256"
    seed: str | None = None
    max_staleness_s: float = Field(5.0, gt=0)
    subscribe: bool = True

    @field_validator("endpoint", "replay")
    @classmethod
    def _zmq_endpoint(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError("a KV events endpoint is a ZMQ address like tcp://host:5557")
        return v

    def hash_seed(self) -> str:
        """The seed of the block hash: ``seed``, else the engine's default for ``hash``."""
        if self.seed is not None:
            return self.seed
        return "vllm-none-hash" if self.hash == "sha256_cbor" else ""


class Deployment(_Strict):
    """One replica / account of a backend. ``name`` (default ``<backend>#<index>``) is what the
    ledger, ``/healthz`` and the metrics call it; the URL (which may hold credentials) never is.
    ``api_key``: a ``${ENV_VAR}`` template (checked by the backend), default the backend's.
    ``kv_events``: where it publishes its KV cache events (None: it is routed without them)."""

    base_url: str
    api_key: str | None = None
    name: str = ""
    kv_events: KVEventsSettings | None = None

    @field_validator("base_url")
    @classmethod
    def _url_has_scheme(cls, v: str) -> str:
        return check_base_url(v)


class Timeouts(_Strict):
    """Seconds. ``None`` = the backend's ``timeout_s`` (the single timeout of older policies).

    - ``connect_s``: TCP (+TLS) connect.
    - ``first_byte_s``: from the send to the response head (prefill of a long prompt included).
    - ``idle_s``: the longest gap between two chunks of the answer.
    - ``total_s``: the whole answer, first byte to last.
    """

    connect_s: float = Field(10.0, gt=0)
    first_byte_s: float | None = Field(None, gt=0)
    idle_s: float | None = Field(None, gt=0)
    total_s: float | None = Field(None, gt=0)


class RetrySettings(_Strict):
    """Retries of one deployment before the next is tried (only before the client has a byte).

    ``attempts``: tries per deployment (1 = no retry). Backoff before try ``n`` (n >= 1):
    uniform in ``[0, min(backoff_max_s, backoff_base_s * 2**(n-1))]`` ("full jitter", AWS
    Architecture Blog, *Exponential Backoff And Jitter*, 2015). A ``retry-after`` header is
    honoured when it is at most ``max_retry_after_s``; a longer one ends this deployment's
    tries (the next deployment or fallback is tried, or the client gets the answer and its
    ``retry-after``). ``on_status``: the statuses that are retried (connect errors always are).

    Bounds (issue 20, class 6): a deployment is tried once per request while another deployment
    or fallback remains, again only when its answer says ``retry-after`` (within
    ``max_retry_after_s``); the last one of the plan up to ``attempts`` times. Every send after a
    request's first spends one token of its primary backend's retry budget, shared by the requests
    sent to that backend (``budget_ratio`` tokens earned per request, at most ``budget_burst``
    saved: retries stay near ``budget_ratio`` of live traffic, as Envoy's per-cluster
    ``retry_budget`` and gRPC's retry throttling do; one backend's failures never spend another's,
    issue 34 item 7). Waits and sends
    stop where they would pass the backend's ``timeouts.total_s``.
    """

    attempts: int = Field(3, ge=1, le=10)
    budget_ratio: float = Field(0.2, ge=0, le=10)
    budget_burst: float = Field(10.0, ge=0)
    backoff_base_s: float = Field(0.1, ge=0)
    backoff_max_s: float = Field(2.0, ge=0)
    max_retry_after_s: float = Field(5.0, ge=0)
    on_status: list[int] = Field(default_factory=lambda: [408, 429, 500, 502, 503, 504, 529])


class BreakerSettings(_Strict):
    """A circuit breaker per deployment. Opens after ``consecutive_failures`` failures in a row,
    or when at least ``min_requests`` outcomes in the last ``window_s`` seconds hold a failure
    share of ``error_rate`` or more; stays open ``cooldown_s``; then lets one probe through
    (half-open): its success closes the breaker, its failure opens it again. A failure is a
    retryable status, a connect error, a reset or a timeout before the first byte.
    ``enabled: false``: never open."""

    enabled: bool = True
    consecutive_failures: int = Field(5, ge=1)
    error_rate: float = Field(0.5, gt=0, le=1)
    min_requests: int = Field(20, ge=1)
    window_s: float = Field(30.0, gt=0)
    cooldown_s: float = Field(30.0, gt=0)


class AffinitySettings(_Strict):
    """How a group's deployment is picked (the two-part rule of SGLang's cache-aware router).

    ``mode``: ``prefix`` — the request's stable-prefix key (its session: system text + first
    user message) is placed once by rendezvous hashing with bounded loads (no deployment holds
    more than ``ceil(session_balance * mean)`` of the keys seen in the last ``session_ttl_s``)
    and kept, so one conversation keeps hitting one replica's prefix cache; ``exact`` — ask
    each deployment ``POST /cache/match`` (our engine: cached tokens for this prompt,
    read-only; or, for deployments with ``kv_events``, the router's own block index fed by
    their KV events: one ``/tokenize``, no query per deployment) and take the longest match
    (the ``prefix`` placement on ties / no match / a stale index);
    ``least_load`` — fewest requests in flight; ``round_robin``.
    Load guard: when ``max - min > imbalance_abs`` and ``max > imbalance_rel * min`` (in-flight
    requests per deployment), the least loaded deployment is taken whatever the prefix says.
    ``match_timeout_ms``: the budget of the ``exact`` queries (past it: ``prefix``)."""

    mode: Literal["prefix", "exact", "least_load", "round_robin"] = "prefix"
    session_balance: float = Field(1.0, ge=1.0)
    session_ttl_s: float = Field(600.0, gt=0)
    imbalance_abs: int = Field(2, ge=0)
    imbalance_rel: float = Field(1.5, ge=1)
    match_timeout_ms: int = Field(50, ge=1)


class HealthCheckSettings(_Strict):
    """Optional active health checks: every ``interval_s`` seconds each deployment gets
    ``GET <base_url>/models`` (``timeout_s``); a failure counts against its breaker, a success
    closes a half-open one. ``interval_s: 0`` (default): off, passive breakers only."""

    interval_s: float = Field(0.0, ge=0)
    timeout_s: float = Field(2.0, gt=0)


class FallbackTarget(_Strict):
    """A fallback of a route: ``backend`` name and the ``model`` name it is asked for (default:
    the name the route sends to its own backend)."""

    backend: str
    model: str | None = None


class RouteTargets(_Strict):
    """Route fields beyond ``match`` / ``backend`` (mixed into :class:`prefixgate.config.schema.Route`).

    ``backends``: an ordered list, the first is the primary (instead of ``backend``);
    ``fallbacks``: tried after the route's own backends, in order (a name, or ``{backend,
    model}``); ``model``: the model name sent upstream (an alias: the client says ``match``,
    the backend hears ``model``)."""

    backend: str | None = None
    backends: list[str] = Field(default_factory=list)
    fallbacks: list[str | FallbackTarget] = Field(default_factory=list)
    model: str | None = None

    @model_validator(mode="after")
    def _one_primary(self) -> RouteTargets:
        if self.backend is None and not self.backends:
            raise ValueError("a route needs backend or backends")
        if self.backend is not None and self.backends:
            raise ValueError("give backend or backends, not both")
        if self.backend is None:
            self.backend = self.backends[0]
        return self

    def chain(self) -> list[FallbackTarget]:
        """Every backend this route may use, in order: its own, then its fallbacks."""
        own = self.backends or [self.backend or ""]
        out = [FallbackTarget(backend=b, model=self.model) for b in own]
        for f in self.fallbacks:
            out.append(FallbackTarget(backend=f, model=self.model) if isinstance(f, str) else f)
        return out
