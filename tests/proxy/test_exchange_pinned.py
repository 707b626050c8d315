"""One request's :class:`Exchange` and the shared :class:`ProxyState` pinned point by point
(issue 21): :mod:`prefixgate.proxy.pipeline.exchange`.

Source of each rule: the docstrings there — ``Exchange.record`` writes the row exactly once,
ends the deployment's in-flight count (``release``), notes a rejection with every breaker open,
fills a measured counterfactual for a body sent as the client sent it
(:func:`prefixgate.cache.savings.counterfactual.measured_counterfactual`), settles the rate-limit ticket
with the request's usage and writes a ledger row only for a model call; ``ProxyState.record``
bounds the text columns, feeds the stand-back judge, the ledger, the metrics and OTel, and never
raises; ``ProxyState`` builds its routing parts from the policy. Collaborators are fakes that
note what they were given, so each test reads the exact figures handed on.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from prefixgate.cache.ledger.store import LedgerRow
from prefixgate.cache.savings.stand_back import EVERY
from prefixgate.cache.state.shared_state import LocalState
from prefixgate.proxy.api.chat import CHAT
from prefixgate.proxy.api.count_tokens import COUNT_TOKENS
from prefixgate.proxy.core.bounded import ROW_CHARS
from prefixgate.proxy.observe.health import IN_USE_DEGRADED, LAG_DEGRADED_S
from prefixgate.proxy.observe.metrics import BREAKERS_OPEN, RequestObs
from prefixgate.proxy.pipeline import exchange
from prefixgate.proxy.pipeline.exchange import Exchange, ProxyState
from prefixgate.proxy.routing.breaker import BreakerBoard
from prefixgate.proxy.routing.retries import Picked, Step
from prefixgate.proxy.routing.router import Target
from prefixgate.proxy.routing.shared import SharedRouting
from tests.proxy.conftest import make_policy


class Sink:
    """A ledger / metrics / OTel exporter noting each row it is handed (``fail``: raise)."""

    def __init__(self, fail: bool = False) -> None:
        self.rows: list[tuple[LedgerRow, Any]] = []
        self.fail = fail

    def write(self, row: LedgerRow) -> int:
        if self.fail:
            raise RuntimeError("disk full")
        self.rows.append((row, None))
        return 1

    def observe(self, row: LedgerRow, obs: Any = None) -> None:
        self.rows.append((row, obs))


class FakeGuard:
    def __init__(self, reasons: list[str] | None = None) -> None:
        self.settled: list[tuple[Any, int | None, int | None, int]] = []
        self._reasons = reasons or []

    def settle(self, ticket: Any, prompt: int | None, output: int | None, http_status: int) -> None:
        self.settled.append((ticket, prompt, output, http_status))

    def reasons(self) -> list[str]:
        return list(self._reasons)


class Upstream:
    def __init__(self, in_use: int = 0, max_connections: int = 100, queued: int = 0) -> None:
        self.in_use, self.max_connections, self.queued = in_use, max_connections, queued

    def pool_stats(self) -> dict[str, int]:
        return {"queued": self.queued} if self.queued else {}


def make_state(tmp_path: Path, *, ledger: Any = None, otel: Any = None, **policy: Any) -> ProxyState:
    return ProxyState(policy=make_policy("http://127.0.0.1:9", tmp_path / "l.sqlite", **policy),
                      ledger=ledger if ledger is not None else Sink(), sessions=None,  # type: ignore[arg-type]
                      rewrite_fn=None, upstream=Upstream(), metrics=Sink(), insight=None,  # type: ignore[arg-type]
                      guard=FakeGuard(), otel=otel)  # type: ignore[arg-type]


def target(name: str = "up", deployment: str | None = None) -> Target:
    dep = SimpleNamespace(name=deployment) if deployment else None
    return Target(route="m*", backend_name=name, backend=None, provider="openai", wire="openai",  # type: ignore[arg-type]
                  translate=False, deployment=dep)  # type: ignore[arg-type]


# ---- ProxyState: built from the policy -------------------------------------------------------

def test_the_stand_back_judge_takes_the_policys_settings(tmp_path: Path) -> None:
    """enabled, min requests, off time, the holdout seed; a verdict every min(EVERY, min) rows."""
    s = make_state(tmp_path, rewrite={"stand_back": False, "stand_back_min_requests": 3,
                                      "stand_back_s": 42.0}, holdout={"seed": 7})
    j = s.judge
    assert (j.enabled, j.min_requests, j.off_s, j.seed, j.every) == (False, 3, 42.0, 7, 3)
    d = make_state(tmp_path).judge
    assert (d.enabled, d.min_requests, d.off_s, d.seed, d.every) == (True, 20, 900.0, 0, EVERY)


def test_the_routing_parts_come_from_the_policy_unless_given(tmp_path: Path) -> None:
    s = make_state(tmp_path, retry={"budget_ratio": 0.3, "budget_burst": 4.0},
                   breaker={"consecutive_failures": 2}, fanout={"enabled": True})
    assert s.breakers is not None and s.breakers.settings.consecutive_failures == 2
    assert s.fanout is not None and s.fanout.settings.enabled is True
    assert s.retry_budget is not None and (s.retry_budget.ratio, s.retry_budget.burst) == (0.3, 4.0)
    assert s.retry_budget.of("any").tokens == 4.0
    assert s.salt_key is not None and s.salt_key.reasons() == []
    assert s.routing is None and isinstance(s.shared, LocalState)  # one process: no shared routing
    board = BreakerBoard(make_policy("http://x", tmp_path / "l.sqlite").breaker)
    given = ProxyState(policy=make_policy("http://x", tmp_path / "l.sqlite"), ledger=Sink(),  # type: ignore[arg-type]
                       sessions=None, rewrite_fn=None, upstream=Upstream(), metrics=Sink(),  # type: ignore[arg-type]
                       insight=None, breakers=board)
    assert given.breakers is board


def test_replicas_share_routing_through_a_shared_state(tmp_path: Path) -> None:
    class Shared(LocalState):
        pass

    s = ProxyState(policy=make_policy("http://x", tmp_path / "l.sqlite"), ledger=Sink(),  # type: ignore[arg-type]
                   sessions=None, rewrite_fn=None, upstream=Upstream(), metrics=Sink(),  # type: ignore[arg-type]
                   insight=None, shared=object())  # type: ignore[arg-type]
    assert isinstance(s.routing, SharedRouting)
    assert (s.routing.shared, s.routing.board, s.routing.balancer) == (s.shared, s.breakers, s.balancer)
    local = ProxyState(policy=make_policy("http://x", tmp_path / "l.sqlite"), ledger=Sink(),  # type: ignore[arg-type]
                       sessions=None, rewrite_fn=None, upstream=Upstream(), metrics=Sink(),  # type: ignore[arg-type]
                       insight=None, shared=Shared())
    assert local.routing is None  # a LocalState (any subclass) is this process's own


def test_health_adds_the_pool_the_loop_the_guard_and_the_salt_key(tmp_path: Path) -> None:
    s = make_state(tmp_path)
    s.loop_lag = SimpleNamespace(recent_max_s=0.0)  # type: ignore[assignment]
    assert s.health() == []
    s.upstream = Upstream(in_use=9, max_connections=10, queued=2)  # type: ignore[assignment]
    assert IN_USE_DEGRADED * 10 <= 9
    s.loop_lag = SimpleNamespace(recent_max_s=LAG_DEGRADED_S)  # type: ignore[assignment]
    s.guard = FakeGuard(["key store unreachable"])  # type: ignore[assignment]
    s.salt_key.problem = "no salt key"  # type: ignore[union-attr]
    assert s.health() == ["upstream responses in use: 9 of a pool of 10",
                          "requests waiting for an upstream connection: 2",
                          f"event loop lag {LAG_DEGRADED_S * 1e3:.0f} ms (limit {LAG_DEGRADED_S * 1e3:.0f} ms)",
                          "key store unreachable", "no salt key"]
    s.salt_key = None
    assert s.health()[-1] == "key store unreachable"


# ---- ProxyState.record: every sink, bounded, never raises ------------------------------------

def test_record_writes_the_row_once_to_the_ledger_metrics_and_otel(tmp_path: Path) -> None:
    otel = Sink()
    s = make_state(tmp_path, otel=otel)
    row, obs = LedgerRow(model="m1", route="m*", status="ok", prompt_tokens=10, rewrite=True), RequestObs()
    s.record(row, obs)
    assert s.ledger.rows == [(row, None)]  # type: ignore[attr-defined]
    assert s.metrics.rows == [(row, obs)] and otel.rows == [(row, obs)]  # type: ignore[attr-defined]
    assert s.judge._routes[("m*", "")].fresh == 1  # the stand-back judge counted it


def test_record_bounds_each_text_column_first(tmp_path: Path) -> None:
    s = make_state(tmp_path)
    limit = ROW_CHARS["error"]
    row = LedgerRow(model="m", error="x" * (limit + 50))
    s.record(row)
    written = s.ledger.rows[0][0]  # type: ignore[attr-defined]
    assert len(written.error) <= limit and written.error.startswith("x")


def test_record_never_raises_and_a_failed_step_skips_only_itself(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    s = make_state(tmp_path, ledger=Sink(fail=True))
    with caplog.at_level(logging.ERROR, logger="prefixgate.proxy"):
        s.record(LedgerRow(model="m"))
    assert caplog.messages == ["ledger write failed"] and s.metrics.rows == []  # type: ignore[attr-defined]
    caplog.clear()
    ok = make_state(tmp_path)
    ok.judge = None  # type: ignore[assignment]  # observe raises AttributeError
    with caplog.at_level(logging.ERROR, logger="prefixgate.proxy"):
        ok.record(LedgerRow(model="m2"))
    assert caplog.messages == ["stand-back observation failed"]
    assert [r.model for r, _ in ok.ledger.rows] == ["m2"]  # type: ignore[attr-defined]
    caplog.clear()

    def broken(row: object) -> None:
        raise ValueError("clip")

    monkeypatch.setattr(exchange, "clip_fields", broken)
    with caplog.at_level(logging.ERROR, logger="prefixgate.proxy"):
        ok.record(LedgerRow(model="m3"))
    assert caplog.messages[0] == "row clip failed"
    assert [r.model for r, _ in ok.ledger.rows] == ["m2", "m3"]  # type: ignore[attr-defined]


def test_record_logs_one_line_of_figures_never_text(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    s = make_state(tmp_path)
    row = LedgerRow(endpoint="/v1/chat/completions", model="m1", backend="up", status="ok", http_status=200,
                    prompt_tokens=120, cached_tokens=64, ttft_ms=12.345, edits="hoist_volatile")
    with caplog.at_level(logging.INFO, logger="prefixgate.access"):
        s.record(row)
    assert caplog.messages == ["POST /v1/chat/completions 200 model=m1 ttft_ms=12.3 cached=64/120 "
                               "backend=up status=ok edits=hoist_volatile"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="prefixgate.access"):
        s.record(LedgerRow(endpoint="/v1/messages", model="m2"))
    assert caplog.messages == ["POST /v1/messages 200 model=m2 ttft_ms=- cached=-/- backend=- "
                               "status=ok edits=-"]


# ---- Exchange ---------------------------------------------------------------------------------

def test_target_is_the_one_that_served_else_the_primary() -> None:
    ex = Exchange(CHAT, LedgerRow())
    assert ex.target is None and ex.api == "openai"
    a, b = target("a"), target("b")
    ex.targets = [a, b]
    assert ex.target is a
    ex.served = b
    assert ex.target is b
    assert Exchange(COUNT_TOKENS, LedgerRow()).api == "anthropic"


def test_output_seen_reads_the_streams_usage_else_its_content_events() -> None:
    ex = Exchange(CHAT, LedgerRow())
    assert ex.output_seen() == 0
    ex.watcher = SimpleNamespace(usage=SimpleNamespace(output_tokens=None), deltas=3)  # type: ignore[assignment]
    assert ex.output_seen() == 3
    ex.watcher.usage.output_tokens = 17  # type: ignore[union-attr]
    assert ex.output_seen() == 17


class Bridge:
    def __init__(self) -> None:
        self.asked: list[Any] = []

    def stream(self, model: str, body: dict[str, Any]) -> tuple[str, str]:
        self.asked.append((model, body))
        return "watcher", "mapper"

    def end_mapper(self, watcher: Any) -> str:
        return f"end-of-{watcher}"


def test_picked_takes_the_deployments_bridge_and_names() -> None:
    br, released = Bridge(), []
    t = target("up", deployment="up-2")
    ex = Exchange(CHAT, LedgerRow(model="m1", stream=True), body={"model": "m1"})
    ex.picked(Picked(Step(t, br, b"{}"), t, lambda: released.append(1)))  # type: ignore[arg-type]
    assert (ex.served, ex.bridge) == (t, br)
    assert (ex.row.backend, ex.row.deployment) == ("up", "up-2")
    assert (ex.watcher, ex.mapper, ex.end_mapper) == ("watcher", "mapper", "end-of-watcher")
    assert br.asked == [("m1", {"model": "m1"})]
    ex.release()  # type: ignore[misc]
    assert released == [1]
    plain = Exchange(CHAT, LedgerRow(model="m1", stream=False))
    plain.picked(Picked(Step(target("b"), Bridge(), b"{}"), target("b"), lambda: None))  # type: ignore[arg-type]
    assert (plain.watcher, plain.mapper, plain.end_mapper) == (None, None, None)
    assert plain.row.deployment == "b"  # a plain backend: its own name


def test_record_writes_once_releases_once_and_fills_the_row(tmp_path: Path) -> None:
    s = make_state(tmp_path)
    released: list[int] = []
    ex = Exchange(CHAT, LedgerRow(model="m1", prompt_tokens=100, output_tokens=7))
    ex.release, ex.ticket = (lambda: released.append(1)), "ticket"  # type: ignore[assignment]
    ex.attempts.count = 3
    ex.attempts.failed("up-1", "status-503")
    ex.attempts.failed("up-2", "connect")
    ex.timing.start, ex.timing.end = 10.0, 10.25
    ex.record(s, "ok", 200)
    ex.record(s, "upstream_error", 502)  # a second call is a no-op
    row = ex.row
    assert released == [1] and ex.recorded
    assert [r for r, _ in s.ledger.rows] == [row]  # type: ignore[attr-defined]
    assert s.metrics.rows == [(row, ex.obs)]  # type: ignore[attr-defined]  # the request's observations go along
    assert (row.status, row.http_status, row.attempts) == ("ok", 200, 3)
    assert row.attempt_reasons == "up-1:status-503,up-2:connect"
    assert row.total_ms == pytest.approx(250.0) and row.error == ""
    assert s.guard.settled == [("ticket", 100, 7, 200)]  # type: ignore[attr-defined]


def test_record_keeps_a_total_time_already_set_and_writes_without_a_release(tmp_path: Path) -> None:
    s = make_state(tmp_path)
    ex = Exchange(CHAT, LedgerRow(model="m1", total_ms=5.0))
    ex.timing.start, ex.timing.end = 10.0, 11.0
    ex.record(s, "ok", 200)
    assert ex.row.total_ms == 5.0 and len(s.ledger.rows) == 1  # type: ignore[attr-defined]


def test_a_rejection_with_every_breaker_open_says_so_bounded(tmp_path: Path) -> None:
    s = make_state(tmp_path)
    ex = Exchange(CHAT, LedgerRow(model="m1", error="connect refused"))
    ex.attempts.all_open = True
    ex.record(s, "upstream_error", 503)
    assert ex.row.error == f"{BREAKERS_OPEN}; connect refused"
    none = Exchange(CHAT, LedgerRow(model="m1"))
    none.attempts.all_open = True
    none.record(s, "upstream_error", 503)
    assert none.row.error == f"{BREAKERS_OPEN}; "
    long = Exchange(CHAT, LedgerRow(model="m1", error="e" * 300))
    long.attempts.all_open = True
    long.record(s, "upstream_error", 503)
    assert long.row.error == (f"{BREAKERS_OPEN}; " + "e" * 300)[:200]
    ok = Exchange(CHAT, LedgerRow(model="m1", error="retried"))
    ok.attempts.all_open = True
    ok.record(s, "ok", 200)  # tried anyway and answered: not a rejection
    assert ok.row.error == "retried"


def test_attempt_reasons_are_bounded_to_1000_chars(tmp_path: Path) -> None:
    s = make_state(tmp_path)
    ex = Exchange(CHAT, LedgerRow(model="m1"))
    for i in range(200):
        ex.attempts.failed(f"deployment-{i}", "timeout")
    ex.record(s, "upstream_error", 504)
    full = ",".join(f"deployment-{i}:timeout" for i in range(200))
    assert ex.row.attempt_reasons == full[:1000]


@pytest.mark.parametrize("edits,holdout,source", [("", False, "measured"), ("none", True, "holdout")])
def test_a_body_sent_as_the_client_sent_it_records_its_own_measured_counterfactual(
        tmp_path: Path, edits: str, holdout: bool, source: str) -> None:
    """Nothing rewrote it: what the client's body would have cached is what it did cache."""
    s = make_state(tmp_path)
    ex = Exchange(CHAT, LedgerRow(model="m1", prompt_tokens=2000, cached_tokens=1536, input_usd=0.0021,
                                  edits=edits, holdout=holdout))
    ex.record(s, "ok", 200)
    written = s.ledger.rows[0][0]  # type: ignore[attr-defined]
    assert (written.cf_cached_tokens, written.cf_input_usd, written.cf_source) == (1536, 0.0021, source)


def test_a_rewritten_body_gets_no_measured_counterfactual(tmp_path: Path) -> None:
    s = make_state(tmp_path)
    ex = Exchange(CHAT, LedgerRow(model="m1", prompt_tokens=2000, cached_tokens=1536, edits="hoist_volatile"))
    ex.record(s, "ok", 200)
    assert ex.row.cf_cached_tokens is None and ex.row.cf_source != "measured"


def test_count_tokens_settles_its_ticket_but_writes_no_ledger_row(tmp_path: Path) -> None:
    s = make_state(tmp_path)
    released: list[int] = []
    ex = Exchange(COUNT_TOKENS, LedgerRow(model="claude-x", prompt_tokens=30))
    ex.release = lambda: released.append(1)
    ex.record(s, "ok", 200)
    assert s.ledger.rows == [] and s.metrics.rows == []  # type: ignore[attr-defined]
    assert released == [1] and s.guard.settled == [(None, 30, None, 200)]  # type: ignore[attr-defined]
