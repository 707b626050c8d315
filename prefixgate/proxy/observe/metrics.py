"""Prometheus metrics of the proxy (``GET /metrics``), one registry per app.

Every request metric carries ``route`` (the policy's model glob), ``model`` and ``backend``
labels, bounded by :class:`LabelGuard` (issue 20, class 5). The ``model`` label comes from a
vocabulary fixed when the app is built, never from a client's text: a model the policy names
(:func:`label_vocabulary`: literal route matches, upstream and fallback model names, aliases)
is itself; a model a glob route matched is the dated price table's id it is a snapshot of
(``claude-sonnet-4-5-20250929`` reads ``claude-sonnet-4-5``, :func:`price_family`); anything
else — a model no route matched, a name over :data:`~prefixgate.proxy.core.bounded.LABEL_CHARS`
characters, a name the price table does not know — is ``other``. Past :data:`MAX_LABEL_SETS`
distinct (route, model, backend) sets every new one is ``other`` too. So ``/metrics`` (served
without a key) neither grows with nor shows what clients send: its size is bounded by the
policy and the price table, whatever the traffic.

Names (``prefixgate_`` prefix):

==============================================  ====================================  ==
``rejections_total{route, model, backend, by}``: requests rejected — by the proxy's rate limit,
by open breakers, by a 429 / 529 upstream (:func:`rejected_by`); they are ledger rows too, so
``prefixgate report --errors`` lists them.
Resource gauges, read when scraped (:meth:`ProxyMetrics.watch_resources`):
``upstream_responses_in_use`` (upstream responses opened and not yet closed — counted by the
proxy itself), ``upstream_pool_connections{state="active"|"idle"}`` and
``upstream_pool_queued`` (httpx's pool, when readable), ``event_loop_lag_seconds`` (the newest
sample of :class:`prefixgate.proxy.observe.health.LoopLagMonitor`).
``pd_decisions_total{decision, reason}``: P/D backends' per-request split / colocate decisions
(:mod:`prefixgate.proxy.routing.pd.drive`).
Meaning guard (issue 36; :meth:`ProxyMetrics.watch_guard`), read when scraped:
``guard_trial_events_total{event}`` (this process's trial runner: :data:`GUARD_EVENTS`) and
``guard_verdicts{state}`` (the (route, tenant, move) verdicts it has seen, by ``trialling`` /
``on`` / ``off``; no names). Trial sends are never in the request metrics above.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from prefixgate.cache.ledger.store import LedgerRow
from prefixgate.config.cache_rules import normalize_model_id
from prefixgate.config.prices import PRICES, price_for
from prefixgate.config.schema import Policy
from prefixgate.proxy.core.bounded import LABEL_CHARS, clip
from prefixgate.proxy.routing.pd.drive import DECISIONS as PD_DECISIONS

_LATENCY_BUCKETS = (.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120)
_TPOT_BUCKETS = (.001, .0025, .005, .01, .02, .04, .08, .16, .32, .64)
_OVERHEAD_BUCKETS = (.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1)
OTHER = "other"
NONE = "none"
MAX_LABEL_SETS = 200
"""Distinct (route, model, backend) label sets before new ones collapse to ``other``."""
TOKEN_KINDS = ("prompt", "cached", "cache_write", "output", "pruned", "unrewritten_cached",
               "span_reused")
BASE = ["route", "model", "backend"]
BREAKERS_OPEN = "breakers open"
"""How a failed row's ``error`` starts when every deployment's breaker was open."""
GUARD_EVENTS = ("trials", "sends", "failed", "undecided", "busy", "no_budget", "not_applied")
"""``prefixgate_guard_trial_events_total{event}``: trials begun (a budget reserved), trial sends
begun, trials ended by a failed send, trials whose original answer decided nothing, requests
skipped while ``concurrency`` trials ran, trials refused by the day's budget, requests the
trialling moves did not change (:class:`prefixgate.proxy.pipeline.guard_trial.MeaningGuard`)."""
GUARD_STATES = ("trialling", "on", "off")
REJECTING_STATUSES = (429, 529)
"""Upstream answers that refuse the request for load (rate limit, Anthropic's overloaded)."""


def rejected_by(status: str, http_status: int, error: str | None) -> str | None:
    """Who rejected a finished request, for ``prefixgate_rejections_total{by}`` (None: not a
    rejection): ``proxy_rate_limit`` (a proxy key over its rpm / tpm, :mod:`prefixgate.proxy.http.auth`),
    ``breakers_open`` (every deployment's breaker was open and the attempt anyway failed),
    ``upstream_429`` / ``upstream_529`` (the backend refused, after the retries)."""
    if status == "RateLimited":
        return "proxy_rate_limit"
    if status == "ok":
        return None
    if (error or "").startswith(BREAKERS_OPEN):
        return "breakers_open"
    if status == "upstream_error" and http_status in REJECTING_STATUSES:
        return f"upstream_{http_status}"
    return None


@dataclass
class RequestObs:
    """What a request's path learned beyond its ledger row, for metrics and traces.

    ``read_done`` / ``sent_at``: ``time.perf_counter()`` at the end of the body read and at the
    send (None when not reached); ``response_model``: the ``model`` the backend answered with;
    ``break_kind``: the :mod:`prefixgate.cache.savings.breaks` kind of this request's cache break, if any;
    ``headers``: extra response headers for the client (``x-prefixgate-edit-detail``).
    """

    read_done: float | None = None
    sent_at: float | None = None
    response_model: str | None = None
    break_kind: str | None = None
    headers: dict[str, str] | None = None

    @property
    def overhead_s(self) -> float | None:
        """Seconds from the body read to the send, or None."""
        if self.read_done is None or self.sent_at is None:
            return None
        return max(0.0, self.sent_at - self.read_done)


_PRICE_IDS = {normalize_model_id(k): k for k in PRICES}
_SNAPSHOT = re.compile(r"-(?:\d{8}|\d{4}-\d{2}-\d{2}|latest)$")
"""A dated or ``-latest`` snapshot suffix (``-20250929``, ``-2024-08-06``, ``-latest``), as
Anthropic and OpenAI name a model's versions."""


def price_family(model: str) -> str | None:
    """The price table's id (:data:`prefixgate.config.prices.PRICES`, as spelled there) that
    ``model`` is, or is a dated / ``-latest`` snapshot of, after
    :func:`~prefixgate.config.cache_rules.normalize_model_id`; None otherwise. Exact, not by
    prefix (``gpt-4o-anything`` is None): the result is one of a fixed, finite set of ids."""
    if len(model) > LABEL_CHARS:
        return None
    m = normalize_model_id(model)
    return _PRICE_IDS.get(m) or _PRICE_IDS.get(_SNAPSHOT.sub("", m))


class LabelGuard:
    """Bounded (route, model, backend) label values (module docstring). Thread-safe.

    ``models``: model ids always kept as themselves (:func:`label_vocabulary`); other models of
    a matched route read as their :func:`price_family`, else ``other``; a request no route
    matched has model ``other``. ``max_sets``: distinct label sets admitted before every new one
    is ``(other, other, other)``. Every value is at most ``LABEL_CHARS`` characters.
    """

    def __init__(self, models: Iterable[str] = (), max_sets: int = MAX_LABEL_SETS) -> None:
        self.models = frozenset(m for m in models if len(m) <= LABEL_CHARS)
        self.max_sets = max_sets
        self._seen: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()

    def model(self, route: str, model: str) -> str:
        """The ``model`` label of ``model`` sent on ``route`` ("" = no route matched)."""
        if not model:
            return NONE
        if model in self.models:
            return model
        if not route:
            return OTHER
        return price_family(model) or OTHER

    def labels(self, route: str, model: str, backend: str) -> tuple[str, str, str]:
        """The label values for one request (empty strings read ``none``)."""
        key = (clip(route or NONE, LABEL_CHARS), self.model(route, model),
               clip(backend or NONE, LABEL_CHARS))
        with self._lock:
            if key in self._seen:
                return key
            if len(self._seen) >= self.max_sets:
                return (OTHER, OTHER, OTHER)
            self._seen.add(key)
            return key


def output_cost_usd(model: str, output_tokens: int | None) -> float | None:
    """USD of ``output_tokens`` at the dated price of ``model``; None when unpriced/unreported."""
    price = price_for(model) if output_tokens is not None else None
    if price is None or output_tokens is None:
        return None
    return output_tokens * price.output / 1e6


class ProxyMetrics:
    """Counters and histograms fed from finished :class:`~prefixgate.cache.ledger.store.LedgerRow` records.

    ``models``: model ids kept as label values (see :class:`LabelGuard`); ``max_label_sets``:
    its cap.
    """

    def __init__(self, models: Iterable[str] = (), max_label_sets: int = MAX_LABEL_SETS) -> None:
        self.registry = CollectorRegistry()
        self.guard = LabelGuard(models, max_label_sets)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        r = self.registry
        self.requests = Counter("prefixgate_requests_total", "Proxied requests",
                                [*BASE, "status"], registry=r)
        self.prompt = Counter("prefixgate_prompt_tokens_total", "Prompt tokens (upstream usage)",
                              BASE, registry=r)
        self.cached = Counter("prefixgate_cached_tokens_total", "Prompt tokens served from cache",
                              BASE, registry=r)
        self.output = Counter("prefixgate_output_tokens_total", "Output tokens", BASE, registry=r)
        self.pruned = Counter("prefixgate_pruned_tokens_total", "Tokens removed by rewriting",
                              BASE, registry=r)
        self.tokens = Counter("prefixgate_tokens_total", "Tokens by kind (module docstring)",
                              [*BASE, "kind"], registry=r)
        self.cost = Counter("prefixgate_cost_usd_total", "USD by kind (input, output)",
                            [*BASE, "kind"], registry=r)
        self.cf_cost = Counter("prefixgate_unrewritten_input_cost_usd_total",
                               "Input USD the client's own bodies would have cost", BASE,
                               registry=r)
        self.saved = Counter("prefixgate_saved_usd_total", "Input USD saved by rewriting",
                             BASE, registry=r)
        self.overspent = Counter("prefixgate_overspent_usd_total",
                                 "Input USD rewriting cost more than the unrewritten body",
                                 BASE, registry=r)
        self.breaks = Counter("prefixgate_cache_breaks_total", "Cache breaks by kind",
                              [*BASE, "kind"], registry=r)
        self.ttft = Histogram("prefixgate_ttft_seconds", "Time to first content token",
                              BASE, buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("prefixgate_tpot_seconds", "Time per output token after the first",
                              BASE, buckets=_TPOT_BUCKETS, registry=r)
        self.total = Histogram("prefixgate_request_seconds", "Whole request latency",
                               BASE, buckets=_LATENCY_BUCKETS, registry=r)
        self.overhead = Histogram("prefixgate_proxy_overhead_seconds",
                                  "Time the proxy adds before the send (parse, route, passes)",
                                  ["route", "backend"], buckets=_OVERHEAD_BUCKETS, registry=r)
        self.failed_sends = Counter("prefixgate_upstream_failed_sends_total",
                                    "Upstream sends that failed and were retried or fell over",
                                    ["deployment", "reason"], registry=r)
        self.rejections = Counter("prefixgate_rejections", "Requests rejected, by whom "
                                  "(rejected_by): the proxy's rate limit, open breakers, a 429 / "
                                  "529 upstream", BASE + ["by"], registry=r)
        r.register(PDDecisionCollector())

    def watch_resources(self, in_use: Callable[[], float], pool: Callable[[], dict[str, int]],
                        loop_lag_s: Callable[[], float]) -> None:
        """Register the resource gauges (module docstring), each read from its callable at
        scrape time: ``in_use()`` responses, ``pool()`` ``{"active", "idle", "queued"}`` (a
        missing key reads 0), ``loop_lag_s()`` seconds."""
        r = self.registry
        Gauge("prefixgate_upstream_responses_in_use", "Upstream responses opened, not yet closed",
              registry=r).set_function(in_use)
        conns = Gauge("prefixgate_upstream_pool_connections", "Upstream pool connections",
                      ["state"], registry=r)
        for state in ("active", "idle"):
            conns.labels(state).set_function(_reader(pool, state))
        Gauge("prefixgate_upstream_pool_queued", "Requests waiting for an upstream connection",
              registry=r).set_function(_reader(pool, "queued"))
        Gauge("prefixgate_event_loop_lag_seconds", "Event-loop lag, newest sample",
              registry=r).set_function(loop_lag_s)

    def watch_ledger(self, state: Callable[[], dict[str, Any]]) -> None:
        """Register the ledger gauges (issue 26), read from ``state()``
        (:meth:`prefixgate.cache.ledger.store.Ledger.state`) at scrape time:
        ``prefixgate_ledger_up`` (1: the last write reached the database; a SQLite file is
        always 1), ``prefixgate_ledger_spooled_rows`` (rows waiting in the on-disk spool while
        PostgreSQL is down), ``prefixgate_ledger_spool_dropped_rows`` (rows refused by a full
        spool since start), ``prefixgate_ledger_queued_rows`` (in memory, not yet
        acknowledged), ``prefixgate_ledger_bad_rows_dropped`` (rows the database refused alone
        for their content, their batch kept: issue 34)."""
        r = self.registry
        Gauge("prefixgate_ledger_up", "1 when the ledger's last write reached its database",
              registry=r).set_function(lambda: float(bool(state().get("up"))))
        for key, name, doc in (("spooled_rows", "spooled_rows", "Ledger rows waiting in the spool"),
                               ("spool_dropped", "spool_dropped_rows",
                                "Ledger rows refused by a full spool"),
                               ("queued", "queued_rows", "Ledger rows queued, not yet written"),
                               ("bad_rows_dropped", "bad_rows_dropped",
                                "Ledger rows refused alone for their content, dropped")):
            Gauge(f"prefixgate_ledger_{name}", doc, registry=r).set_function(
                _reader(state, key))

    def watch_guard(self, events: Callable[[], dict[str, int]],
                    states: Callable[[], dict[str, int]]) -> None:
        """Register the meaning guard's series (module docstring), read at scrape time from
        ``events()`` (the trial runner's counts) and ``states()`` (``{state: verdicts}``); a
        callable that fails reads as zeros (a scrape never fails for the guard)."""
        self.registry.register(GuardCollector(events, states))

    def _of(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, kept: a request's dozen label lookups were ~15 % of its
        after-answer work (issue 25; prometheus_client validates and locks on each). The label
        values are bounded (:class:`LabelGuard`, clipped statuses and kinds), so this holds no
        more children than the registry does."""
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def observe(self, row: LedgerRow, obs: RequestObs | None = None) -> None:
        """Count one finished request (``obs``: what the row does not hold)."""
        lab = self.guard.labels(row.route, row.model, row.backend)
        self._of(self.requests, *lab, clip(row.status, LABEL_CHARS)).inc()
        by = rejected_by(row.status, row.http_status, row.error)
        if by is not None:
            self._of(self.rejections, *lab, by).inc()
        self._of(self.prompt, *lab).inc(row.prompt_tokens or 0)
        self._of(self.cached, *lab).inc(row.cached_tokens or 0)
        self._of(self.output, *lab).inc(row.output_tokens or 0)
        self._of(self.pruned, *lab).inc(row.tokens_pruned)
        for kind, n in zip(TOKEN_KINDS, (row.prompt_tokens, row.cached_tokens,
                                         row.cache_write_tokens, row.output_tokens,
                                         row.tokens_pruned, row.cf_cached_tokens,
                                         row.span_reused_tokens)):
            if n:  # None: not reported; 0 adds nothing either way
                self._of(self.tokens, *lab, kind).inc(n)
        self._money(lab, row)
        if row.ttft_ms is not None:
            self._of(self.ttft, *lab).observe(row.ttft_ms / 1e3)
        if row.tpot_ms is not None:
            self._of(self.tpot, *lab).observe(row.tpot_ms / 1e3)
        if row.total_ms is not None:
            self._of(self.total, *lab).observe(row.total_ms / 1e3)
        if obs is not None:
            if obs.break_kind:
                self._of(self.breaks, *lab, clip(obs.break_kind, LABEL_CHARS)).inc()
            if obs.overhead_s is not None:
                self._of(self.overhead, lab[0], lab[2]).observe(obs.overhead_s)
        for failed in filter(None, row.attempt_reasons.split(",")):
            deployment, _, reason = failed.rpartition(":")
            self._of(self.failed_sends, clip(deployment, LABEL_CHARS),
                     clip(reason, LABEL_CHARS)).inc()

    def _money(self, lab: tuple[str, str, str], row: LedgerRow) -> None:
        if row.input_usd is not None:
            self._of(self.cost, *lab, "input").inc(row.input_usd)
        out_usd = output_cost_usd(row.model, row.output_tokens)
        if out_usd is not None:
            self._of(self.cost, *lab, "output").inc(out_usd)
        if row.input_usd is not None and row.cf_input_usd is not None:
            self._of(self.cf_cost, *lab).inc(row.cf_input_usd)
            diff = row.cf_input_usd - row.input_usd
            self._of(self.saved if diff >= 0 else self.overspent, *lab).inc(abs(diff))

    def metric_names(self) -> set[str]:
        """Every sample name the registry can expose (``_total``, ``_bucket``, ... included)."""
        names: set[str] = set()
        for fam in self.registry.collect():
            names.add(fam.name)
            for suffix in ("_total", "_bucket", "_count", "_sum", "_created"):
                names.add(fam.name + suffix)
        return names

    def render(self) -> bytes:
        """Text exposition format."""
        return generate_latest(self.registry)


def policy_models(routes: Iterable[object]) -> list[str]:
    """Model ids named literally (no glob character) by the policy's routes."""
    out = []
    for r in routes:
        match = getattr(r, "match", "")
        if match and not any(c in match for c in "*?["):
            out.append(match)
    return out


def label_vocabulary(policy: Policy) -> list[str]:
    """Every model id the policy itself names, kept as a ``model`` label value: the literal
    route matches (:func:`policy_models`), each route's upstream ``model`` and its fallbacks'
    ``model``, and the aliases' names and targets. Fixed when the app is built."""
    out = policy_models(policy.routes)
    for r in policy.routes:
        out += [t.model for t in r.chain() if t.model]
    for name, target in policy.aliases.items():
        out += [name, target]
    return sorted(set(out))


class PDDecisionCollector(Collector):
    """``prefixgate_pd_decisions_total{decision, reason}``: P/D split or colocate per request
    (``routing.pd.drive.DECISIONS``, read at scrape time)."""

    def collect(self) -> Iterator[Metric]:
        fam = CounterMetricFamily("prefixgate_pd_decisions", "P/D split decisions by reason",
                                  labels=["decision", "reason"])
        for (decision, reason), n in sorted(PD_DECISIONS.items()):
            fam.add_metric([decision, reason], float(n))
        yield fam


class GuardCollector(Collector):
    """``prefixgate_guard_trial_events_total{event}`` over :data:`GUARD_EVENTS` and
    ``prefixgate_guard_verdicts{state}`` over :data:`GUARD_STATES`, every label value always
    present (0 until it happens), nothing else: no route, tenant or move names."""

    def __init__(self, events: Callable[[], dict[str, int]],
                 states: Callable[[], dict[str, int]]) -> None:
        self.events, self.states = events, states

    def collect(self) -> Iterator[Metric]:
        fam = CounterMetricFamily("prefixgate_guard_trial_events",
                                  "Meaning-guard trial events (GUARD_EVENTS)", labels=["event"])
        got = _safe(self.events)
        for event in GUARD_EVENTS:
            fam.add_metric([event], float(got.get(event, 0)))
        yield fam
        gauge = GaugeMetricFamily("prefixgate_guard_verdicts",
                                  "Meaning-guard verdicts this process has seen, by state",
                                  labels=["state"])
        got = _safe(self.states)
        for state in GUARD_STATES:
            gauge.add_metric([state], float(got.get(state, 0)))
        yield gauge


def _safe(read: Callable[[], dict[str, int]]) -> dict[str, int]:
    """``read()``, or ``{}`` when it raises."""
    try:
        return dict(read())
    except Exception:
        return {}


def _reader(stats: Callable[[], dict[str, int]], key: str) -> Callable[[], float]:
    """A gauge callback reading ``stats()[key]`` (0 when missing)."""
    return lambda: stats().get(key, 0)
