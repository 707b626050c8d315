"""Retries, fallbacks and breakers against real fault-injecting upstreams (issue 10, item 3).

Two fault servers (:mod:`tests.faults.fault_server`) stand for two backends / deployments; the
route's fallback asks the second one for model ``ok`` (a fallback ``model``), so whatever fault
the client's model names on the primary, the fallback answers properly.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from tests.faults.conftest import FaultRig, body_for
from tests.faults.fault_server import FaultServer, serve_faults
from tests.faults.outcomes import events, is_error_event
from tests.faults.test_fault_classes import wait_idle
from tests.proxy.upstream import wait_rows
from tests.servers import serve_app

RETRY = {"attempts": 2, "backoff_base_s": 0.01, "backoff_max_s": 0.02, "max_retry_after_s": 2}


@dataclass
class Pair:
    """``url``: the proxy; ``a`` / ``b``: primary and fallback upstreams; ``ledger``."""

    url: str
    a: FaultServer
    b: FaultServer
    ledger: Ledger

    def idle(self) -> tuple[float, float]:
        return wait_idle(FaultRig(self.url, self.a, self.ledger))


def _closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there: a connect is refused
    return f"http://127.0.0.1:{port}"


@contextmanager
def _pair(tmp_path: Path, policy_for: Any) -> Iterator[Pair]:
    a, b = FaultServer(stall_s=30), FaultServer(stall_s=30)
    with ExitStack() as stack:
        ua, ub = stack.enter_context(serve_faults(a)), stack.enter_context(serve_faults(b))
        data = policy_for(ua, ub)
        data.setdefault("ledger", {"path": str(tmp_path / "ledger.sqlite")})
        policy = parse_policy(data)
        ledger = Ledger(policy.ledger.path)
        app = build_app(policy, ledger=ledger, rewrite_fn=None, analyze=False)
        yield Pair(stack.enter_context(serve_app(app)), a, b, ledger)


def _fallback_policy(kind_a: str = "openai_compat", **retry: Any) -> Any:
    def make(ua: str, ub: str) -> dict[str, Any]:
        return {"backends": {"a": {"kind": kind_a, "base_url": ua + "/v1", "timeout_s": 1},
                             "b": {"kind": "openai_compat", "base_url": ub + "/v1"},
                             "dead": {"kind": "openai_compat",
                                      "base_url": _closed_port_url() + "/v1"}},
                "routes": [{"match": "connect", "backend": "dead",
                            "fallbacks": [{"backend": "b", "model": "ok"}]},
                           {"match": "*", "backend": "a",
                            "fallbacks": [{"backend": "b", "model": "ok"}]}],
                "retry": {**RETRY, **retry}}
    return make


# fault on the primary -> (sends to the primary, the reason logged for each). A deployment is
# tried once while a fallback remains (issue 20, class 6: retries do not multiply); only an
# answer's own short retry-after is retried there (test_retry_after_is_waited_out_when_short_enough).
KINDS = {"connect": (0, "connect"), "status-408": (1, "status-408"),
         "status-429": (1, "status-429"), "status-500": (1, "status-500"),
         "status-502": (1, "status-502"), "status-503": (1, "status-503"),
         "status-504": (1, "status-504"), "status-529": (1, "status-529"),
         "reset-before": (1, "reset"), "stall-before": (1, "timeout")}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("fault", list(KINDS))
def test_each_failure_kind_falls_back_to_the_next_backend(tmp_path: Path, fault: str,
                                                          stream: bool) -> None:
    """Retried on the primary where that can help (not a 429 whose retry-after of 7 s is past
    the 2 s the policy waits, not a reset or a timeout), then answered by the fallback: the
    client sees a proper 200, the ledger names the fallback, every send and why it failed."""
    sends, why = KINDS[fault]
    with _pair(tmp_path, _fallback_policy()) as p:
        path = "/v1/chat/completions"
        r = httpx.post(p.url + path, json=body_for(path, fault, stream), timeout=30)
        assert r.status_code == 200, r.text[:300]
        assert ("[DONE]" in r.text) if stream else ("choices" in r.json())
        (row,) = wait_rows(p.ledger, 1)
        assert (row["status"], row["backend"], row["deployment"]) == ("ok", "b", "b")
        dead = "dead" if fault == "connect" else "a"
        assert row["attempts"] == (1 if fault == "connect" else sends) + 1
        assert row["attempt_reasons"].split(",") == [f"{dead}:{why}"] * (
            1 if fault == "connect" else sends)
        assert p.a.requests == sends and p.b.requests == 1
        assert p.idle() == (0, 0)
        rig = FaultRig(p.url, p.a, p.ledger)
        assert rig.gauge("prefixgate_upstream_failed_sends_total",
                         f'deployment="{dead}",reason="{why}"') == row["attempts"] - 1


def test_an_anthropic_primary_falls_back_to_an_openai_backend_through_its_own_bridge(
        tmp_path: Path) -> None:
    """The bridge is chosen per target: an OpenAI client's request goes to the Anthropic
    primary translated, and to the OpenAI-compatible fallback as sent."""
    with _pair(tmp_path, _fallback_policy("anthropic")) as p:
        path = "/v1/chat/completions"
        r = httpx.post(p.url + path, json=body_for(path, "status-529", False), timeout=30)
        assert r.status_code == 200 and r.json()["object"] == "chat.completion"
        assert (p.a.requests, p.b.requests) == (1, 1)


@pytest.mark.parametrize("fault", ["reset-after", "stall-after"])
def test_no_retry_once_the_first_byte_reached_the_client(tmp_path: Path, fault: str) -> None:
    with _pair(tmp_path, _fallback_policy()) as p:
        path = "/v1/chat/completions"
        r = httpx.post(p.url + path, json=body_for(path, fault, True), timeout=30)
        assert r.status_code == 200
        assert is_error_event(events(r.text)[-1], path)
        (row,) = wait_rows(p.ledger, 1)
        assert (row["status"], row["attempts"], row["attempt_reasons"]) == (
            "upstream_error", 1, "")
        assert (p.a.requests, p.b.requests) == (1, 0)
        assert p.idle() == (0, 0)


def _single(ua: str, ub: str) -> dict[str, Any]:
    return {"backends": {"a": {"kind": "openai_compat", "base_url": ua + "/v1"}},
            "routes": [{"match": "*", "backend": "a"}], "retry": {**RETRY, "attempts": 3}}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_without_fallback_the_client_gets_the_last_error_after_the_retries(tmp_path: Path,
                                                                           path: str) -> None:
    with _pair(tmp_path, _single) as p:
        r = httpx.post(p.url + path, json=body_for(path, "status-503", False), timeout=30)
        assert r.status_code == 503
        assert (r.json()["type"] == "error") if path == "/v1/messages" else "error" in r.json()
        (row,) = wait_rows(p.ledger, 1)
        assert (row["status"], row["http_status"], row["attempts"]) == ("upstream_error", 503, 3)
        assert p.a.requests == 3


def test_a_retry_that_succeeds_answers_from_the_same_deployment(tmp_path: Path) -> None:
    with _pair(tmp_path, _single) as p:
        p.a.script["x"] = ["status-500", "status-429-ra0", "ok"]
        path = "/v1/chat/completions"
        r = httpx.post(p.url + path, json=body_for(path, "seq/x", False), timeout=30)
        assert r.status_code == 200
        (row,) = wait_rows(p.ledger, 1)
        assert row["attempts"] == 3
        assert row["attempt_reasons"] == "a:status-500,a:status-429"


def test_retry_after_is_waited_out_when_short_enough(tmp_path: Path) -> None:
    with _pair(tmp_path, _single) as p:
        p.a.script["x"] = ["status-429-ra1", "ok"]
        path = "/v1/chat/completions"
        t0 = time.monotonic()
        r = httpx.post(p.url + path, json=body_for(path, "seq/x", False), timeout=30)
        assert r.status_code == 200 and time.monotonic() - t0 >= 1.0
        assert p.a.requests == 2


def _group(ua: str, ub: str) -> dict[str, Any]:
    return {"backends": {"g": {"kind": "openai_compat", "deployments": [
                {"base_url": ua + "/v1", "name": "ga"}, {"base_url": ub + "/v1", "name": "gb"}],
                "affinity": {"mode": "round_robin"}}},
            "routes": [{"match": "*", "backend": "g"}],
            "retry": {**RETRY, "attempts": 1},
            "breaker": {"consecutive_failures": 2, "cooldown_s": 3.0}}


def test_a_breaker_opens_half_opens_and_closes(tmp_path: Path) -> None:
    """Deployment ga fails (503): its requests fall over to gb; after 2 failures its breaker
    opens, ga gets nothing and /healthz names it; once ga recovers and the cooldown passes one
    probe goes to it, succeeds, and the breaker closes."""
    with _pair(tmp_path, _group) as p:
        path = "/v1/chat/completions"
        p.a.force = "status-503"

        def ask() -> None:
            r = httpx.post(p.url + path, json=body_for(path, "ok", False), timeout=30)
            assert r.status_code == 200

        while p.a.requests < 2:
            ask()
        health = httpx.get(p.url + "/healthz").json()
        assert list(health["down"]) == ["ga"] and health["down"]["ga"].startswith("open")
        for _ in range(6):
            ask()
        assert p.a.requests == 2  # open: skipped while gb can serve
        p.a.force = None
        time.sleep(3.1)
        for _ in range(2):  # round robin: ga's turn comes within two requests
            ask()
        assert p.a.requests == 3  # the one probe
        assert httpx.get(p.url + "/healthz").json()["down"] == {}
        rows = wait_rows(p.ledger, 8 + p.a.requests - 2 + 2)
        assert {r["status"] for r in rows} == {"ok"}


def test_active_health_checks_open_a_dead_deployments_breaker_and_healthz_names_it(
        tmp_path: Path) -> None:
    def make(ua: str, ub: str) -> dict[str, Any]:
        return {"backends": {"g": {"kind": "openai_compat", "deployments": [
                    {"base_url": ua + "/v1", "name": "alive"},
                    {"base_url": _closed_port_url() + "/v1", "name": "dead"}]}},
                "routes": [{"match": "*", "backend": "g"}],
                "breaker": {"consecutive_failures": 2},
                "health_checks": {"interval_s": 0.05, "timeout_s": 1}}
    with _pair(tmp_path, make) as p:
        end = time.monotonic() + 20
        down: dict[str, str] = {}
        while "dead" not in down and time.monotonic() < end:
            time.sleep(0.05)
            down = httpx.get(p.url + "/healthz").json()["down"]
        assert list(down) == ["dead"] and "health_check" in down["dead"]
        path = "/v1/chat/completions"
        for _ in range(4):  # every request goes to the live deployment, first time
            r = httpx.post(p.url + path, json=body_for(path, "ok", False), timeout=30)
            assert r.status_code == 200
        rows = wait_rows(p.ledger, 4)
        assert {(r["deployment"], r["attempts"]) for r in rows} == {("alive", 1)}


def _timeouts(**t: float) -> Any:
    def make(ua: str, ub: str) -> dict[str, Any]:
        return {"backends": {"a": {"kind": "openai_compat", "base_url": ua + "/v1",
                                   "timeout_s": 30, "timeouts": t}},
                "routes": [{"match": "*", "backend": "a"}], "retry": {**RETRY, "attempts": 1}}
    return make


def test_a_first_byte_timeout_shorter_than_the_idle_one_ends_the_wait_for_the_head(
        tmp_path: Path) -> None:
    with _pair(tmp_path, _timeouts(first_byte_s=0.3, idle_s=30)) as p:
        path = "/v1/chat/completions"
        t0 = time.monotonic()
        r = httpx.post(p.url + path, json=body_for(path, "stall-before", False), timeout=30)
        assert r.status_code == 504 and time.monotonic() - t0 < 10
        (row,) = wait_rows(p.ledger, 1)
        assert (row["status"], row["attempt_reasons"]) == ("UpstreamTimeout", "a:timeout")
        assert p.idle() == (0, 0)


def test_an_idle_timeout_shorter_than_the_first_byte_one_ends_a_silent_stream(
        tmp_path: Path) -> None:
    with _pair(tmp_path, _timeouts(first_byte_s=30, idle_s=0.3)) as p:
        path = "/v1/chat/completions"
        t0 = time.monotonic()
        r = httpx.post(p.url + path, json=body_for(path, "stall-after", True), timeout=30)
        assert r.status_code == 200 and time.monotonic() - t0 < 10
        assert is_error_event(events(r.text)[-1], path)
        (row,) = wait_rows(p.ledger, 1)
        assert row["status"] == "upstream_error"
        assert p.idle() == (0, 0)
