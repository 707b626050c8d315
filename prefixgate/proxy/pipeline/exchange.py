"""The state the handlers share (:class:`ProxyState`) and one request's (:class:`Exchange`).

:class:`Exchange` is the interface between the pipeline's steps and the endpoints (``api/``): an
endpoint makes one, the steps fill it in order (prepare -> send -> answer -> record), and
:meth:`Exchange.record` writes its ledger row exactly once. Filling a row from the answer is
:func:`prefixgate.proxy.pipeline.record.finish`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from prefixgate.cache.ledger.store import Ledger, LedgerRow
from prefixgate.cache.savings.counterfactual import measured_counterfactual
from prefixgate.cache.savings.stand_back import EVERY, RouteJudge
from prefixgate.cache.state.session import SessionStore
from prefixgate.cache.state.shared_state import LocalState, SharedState
from prefixgate.config.schema import Policy, RewriteSettings
from prefixgate.proxy.bridges.base import Bridge
from prefixgate.proxy.core.bounded import clip_fields
from prefixgate.proxy.core.engine_timings import EngineTimings
from prefixgate.proxy.core.errors import Api
from prefixgate.proxy.core.logsafe import safe
from prefixgate.proxy.core.sse import EventMapper
from prefixgate.proxy.core.usage import StreamWatcher
from prefixgate.proxy.http.auth import Guard
from prefixgate.proxy.http.ratelimit import Ticket
from prefixgate.proxy.http.salt_key import SaltKey
from prefixgate.proxy.observe.health import LoopLagMonitor, health_reasons
from prefixgate.proxy.observe.insight import Insight
from prefixgate.proxy.observe.metrics import BREAKERS_OPEN, ProxyMetrics, RequestObs
from prefixgate.proxy.observe.otel import GenAITelemetry
from prefixgate.proxy.pipeline.after_answer import RecordOrder
from prefixgate.proxy.pipeline.endpoint import Endpoint
from prefixgate.proxy.pipeline.rewrite import RewriteFn, RewriteOutcome
from prefixgate.proxy.routing.balance import Balancer
from prefixgate.proxy.routing.breaker import BreakerBoard
from prefixgate.proxy.routing.fanout import FanoutGate
from prefixgate.proxy.routing.kv_events import KVEventHub
from prefixgate.proxy.routing.retries import Attempts, Picked, RetryBudgets, Step
from prefixgate.proxy.routing.router import Target
from prefixgate.proxy.routing.shared import SharedRouting
from prefixgate.proxy.upstream.client import Upstream
from prefixgate.proxy.upstream.relay import Timing
from prefixgate.rewriter.types import Context

log = logging.getLogger("prefixgate.proxy")
access_log = logging.getLogger("prefixgate.access")
"""One INFO line per client request (:meth:`ProxyState.record`, and unknown paths' 404s):
method, path, HTTP status, model, TTFT, cached / prompt tokens, backend; never prompt text.
Off (WARNING) where the app is embedded; ``prefixgate serve`` turns it on (``--no-access-log``
keeps it off)."""
access_log.setLevel(logging.WARNING)


@dataclass
class ProxyState:
    """Everything the handlers share: policy, ledger, session store, rewriter, client, and the
    routing state (breakers per deployment, in-flight counts per deployment)."""

    policy: Policy
    ledger: Ledger
    sessions: SessionStore
    rewrite_fn: RewriteFn | None
    upstream: Upstream
    metrics: ProxyMetrics
    insight: Insight | None
    guard: Guard = field(default_factory=Guard.open)  # proxy keys + rate limits (http.auth)
    loop_lag: LoopLagMonitor = field(default_factory=LoopLagMonitor)
    breakers: BreakerBoard | None = None
    balancer: Balancer = field(default_factory=Balancer)
    side: httpx.AsyncClient | None = None  # cache-match queries, health checks, /v1/models
    otel: GenAITelemetry | None = None  # OTLP export, only when OTEL_EXPORTER_OTLP_* is set
    shared: SharedState = field(default_factory=LocalState)  # counters shared by replicas
    routing: SharedRouting | None = None  # breakers / loads shared (None with LocalState)
    fanout: FanoutGate | None = None  # concurrent identical prefixes wait for one writer
    retry_budget: RetryBudgets | None = None  # retries as a share of live traffic, per backend
    judge: RouteJudge = field(default_factory=RouteJudge)  # per-route stand-back (replaced below)
    salt_key: SaltKey | None = None  # keys the tenants' cache_salt (http.salt_key)
    kv_events: KVEventHub | None = None  # deployments' KV event indexes (routing.kv_events)
    record_order: RecordOrder = field(default_factory=RecordOrder)  # rows in answer order
    meaning_guard: Any = None  # the meaning guard (issue 36), its verdicts as ``.book``; None: off

    def __post_init__(self) -> None:
        rw = self.policy.rewrite
        self.judge = RouteJudge(rw.stand_back, min_requests=rw.stand_back_min_requests,
                                off_s=rw.stand_back_s, seed=self.policy.holdout.seed,
                                every=min(EVERY, rw.stand_back_min_requests))
        if self.breakers is None:
            self.breakers = BreakerBoard(self.policy.breaker)
        if self.fanout is None:
            self.fanout = FanoutGate(self.policy.fanout)
        if self.retry_budget is None:
            self.retry_budget = RetryBudgets(self.policy.retry.budget_ratio,
                                             self.policy.retry.budget_burst)
        if self.salt_key is None:
            self.salt_key = SaltKey(self.policy.tenants)
        if self.routing is None and not isinstance(self.shared, LocalState):
            self.routing = SharedRouting(self.shared, self.breakers, self.balancer)

    def record(self, row: LedgerRow, obs: RequestObs | None = None) -> None:
        """Write the row and count it (metrics, OTel); never raises (a ledger failure must not
        fail a request). A row whose body went upstream as the client sent it (no pass edited
        it; the side endpoints never rewrite) and that has no counterfactual yet gets its own
        measured cached tokens as one (``cf_source`` ``measured``, or ``holdout``), so cached
        and counterfactual shares are taken over the same rows. Every text column is bounded
        first (:func:`prefixgate.proxy.core.bounded.clip_fields`, issue 20 class 5): this is
        the one place each row passes before the ledger, the metrics, OTel and the log."""
        try:
            clip_fields(row)
        except Exception:
            log.exception("row clip failed")
        try:
            self.judge.observe(vars(row))  # the route's stand-back verdict (cache.stand_back)
        except Exception:
            log.exception("stand-back observation failed")
        try:
            self.ledger.write(row)
            self.metrics.observe(row, obs)
            if self.otel is not None:
                self.otel.observe(row, obs)
        except Exception:
            log.exception("ledger write failed")
        if access_log.isEnabledFor(logging.INFO):
            access_log.info("POST %s %d model=%s ttft_ms=%s cached=%s/%s backend=%s status=%s "
                            "edits=%s", safe(row.endpoint), row.http_status, safe(row.model),
                            "-" if row.ttft_ms is None else f"{row.ttft_ms:.1f}",
                            "-" if row.cached_tokens is None else row.cached_tokens,
                            "-" if row.prompt_tokens is None else row.prompt_tokens,
                            row.backend or "-", row.status, row.edits or "-")

    def health(self) -> list[str]:
        """Reasons the proxy is degraded now (empty: healthy), see :mod:`prefixgate.proxy.observe.health`."""
        return health_reasons(self.upstream.in_use, self.upstream.max_connections,
                              self.upstream.pool_stats().get("queued", 0),
                              self.loop_lag.recent_max_s) + self.guard.reasons() + (
                                  self.salt_key.reasons() if self.salt_key is not None else [])


@dataclass
class Exchange:
    """One request, from parse to record: what each step of the handler found or made.

    ``endpoint``: what the endpoint declared; ``targets``: the backends it may use, primary
    first; ``bridge_of``: ``(exchange, target) -> bridge`` (default:
    :func:`prefixgate.proxy.bridges.bridge_for` over the endpoint's API and the backend's; the
    exchange is passed in, never closed over: a closure over it kept in the exchange is a
    reference cycle, and the body stays until a full collection, issue 34 item 4); ``steps``:
    those ready to send (bridge + bytes);
    ``served``: the target (deployment chosen) whose answer the client gets; ``bridge``: its
    bridge. ``row`` is written exactly once (:meth:`record`; a ledger row only for a model
    call), which also ends the deployment's in-flight count.
    """

    endpoint: Endpoint
    row: LedgerRow
    timing: Timing = field(default_factory=Timing)
    raw: bytes = b""
    body: dict[str, Any] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    session_id: str = ""
    rw: RewriteOutcome | None = None
    steps: list[Step] = field(default_factory=list)
    served: Target | None = None
    bridge: Bridge | None = None
    watcher: StreamWatcher | None = None
    mapper: EventMapper | None = None
    end_mapper: EventMapper | None = None
    bridge_of: Callable[[Exchange, Target], Bridge] | None = None
    pass_view: dict[str, Any] | None = None  # the primary bridge's pass body, before the passes
    ctx: Context | None = None  # the passes' context (None: not rewritten), for attribution
    resolved_settings: RewriteSettings | None = None  # the passes' switches, guarded moves
    # resolved for this route and tenant (pipeline.guard_moves); None: not rewritten
    primary_bridge: Bridge | None = None
    attempts: Attempts = field(default_factory=Attempts)
    release: Callable[[], None] | None = None
    recorded: bool = False
    obs: RequestObs = field(default_factory=RequestObs)  # for metrics / traces (observe.metrics)
    reported: EngineTimings = field(default_factory=EngineTimings)  # the backend's timings
    ticket: Ticket | None = None  # the rate limits' charges, settled once by record (http.auth)

    @property
    def api(self) -> Api:
        """The client's API (its error shape)."""
        return self.endpoint.api

    @property
    def target(self) -> Target | None:
        """The target that served, else the primary one (None before routing)."""
        return self.served or (self.targets[0] if self.targets else None)

    def output_seen(self) -> int:
        """Output tokens streamed so far: the stream's usage, else its content events (0
        before the answer streams)."""
        w = self.watcher
        return 0 if w is None else (w.usage.output_tokens or w.deltas)

    def picked(self, p: Picked) -> None:
        """The failover loop chose ``p``: its bridge, stream watcher and mapper apply."""
        self.served, self.bridge, self.release = p.target, p.step.bridge, p.release
        self.row.backend, self.row.deployment = p.target.backend_name, p.target.deployment_name
        if self.row.stream:
            self.watcher, self.mapper = p.step.bridge.stream(self.row.model, self.body)
            self.end_mapper = p.step.bridge.end_mapper(self.watcher)

    def record(self, state: ProxyState, status: str, http_status: int) -> None:
        """Write the row with ``status`` / ``http_status``; a second call is a no-op."""
        if self.recorded:
            return
        self.recorded = True
        if self.release is not None:
            self.release()
        self.row.status, self.row.http_status = status, http_status
        if self.attempts.all_open and status != "ok":  # a rejection (observe.metrics.rejected_by)
            self.row.error = f"{BREAKERS_OPEN}; {self.row.error or ''}"[:200]
        self.row.attempts = self.attempts.count
        measured_counterfactual(self.row)
        self.row.attempt_reasons = ",".join(self.attempts.reasons)[:1000]
        if self.row.total_ms is None:
            self.row.total_ms = self.timing.total_ms()
        state.guard.settle(self.ticket, self.row.prompt_tokens, self.row.output_tokens,
                           http_status)
        if self.endpoint.ledger:
            state.record(self.row, self.obs)
