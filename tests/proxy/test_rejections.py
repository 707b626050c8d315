"""Rejections are counted, never hidden (issue 10, item 4): the proxy's own rate limit, a 429
upstream after the retries, and a request every deployment's breaker was open for each raise
``prefixgate_rejections_total{by}`` and appear in ``prefixgate report --errors``."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import httpx
from typer.testing import CliRunner

from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from prefixgate.proxy.cli import app as cli
from prefixgate.proxy.http.auth import hash_key, new_key
from prefixgate.proxy.observe.metrics import rejected_by
from tests.proxy.upstream import Script, ScriptedUpstream, completion, wait_rows
from tests.servers import serve_app

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
CHAT = "/v1/chat/completions"


def _rejections(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("prefixgate_rejections_total{"):
            by = line.split('by="')[1].split('"')[0]
            out[by] = out.get(by, 0.0) + float(line.split()[-1])
    return out


def _report_errors(ledger: Path) -> list[dict[str, Any]]:
    res = CliRunner().invoke(cli, ["report", "--ledger", str(ledger), "--errors", "--json"])
    assert res.exit_code == 0, res.output
    return list(json.loads(res.output)["errors"])


def _closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/v1"


def _policy(tmp: Path, backends: dict[str, Any], **extra: Any) -> Any:
    return parse_policy({"backends": backends, "routes": [{"match": "*", "backend": "e"}],
                         "retry": {"attempts": 1}, "ledger": {"path": str(tmp / "l.sqlite")},
                         **extra})


def test_the_proxys_rate_limit_is_a_counted_rejection(tmp_path: Path) -> None:
    key = new_key()
    up = ScriptedUpstream(script=Script(body=completion()))
    with serve_app(up.app()) as up_url:
        policy = _policy(tmp_path, {"e": {"kind": "openai_compat", "base_url": up_url + "/v1"}},
                         auth={"keys": [{"id": "k1", "hash": hash_key(key), "rpm": 1}]})
        app = build_app(policy, rewrite_fn=None, analyze=False)
        with serve_app(app) as url:
            auth = {"authorization": f"Bearer {key}"}
            codes = [httpx.post(url + CHAT, json=BODY, headers=auth, timeout=30).status_code
                     for _ in range(3)]
            assert codes == [200, 429, 429]
            assert _rejections(url) == {"proxy_rate_limit": 2.0}
        wait_rows(app.state.proxy.ledger, 3)
    errs = _report_errors(tmp_path / "l.sqlite")
    assert [(e["status"], e["http_status"], e["count"]) for e in errs] == [
        ("RateLimited", 429, 2)]


def test_an_upstream_429_after_the_retries_is_a_counted_rejection(tmp_path: Path) -> None:
    up = ScriptedUpstream(script=Script(body={"error": {"message": "slow down"}}, status=429))
    with serve_app(up.app()) as up_url:
        policy = _policy(tmp_path, {"e": {"kind": "openai_compat", "base_url": up_url + "/v1"}})
        app = build_app(policy, rewrite_fn=None, analyze=False)
        with serve_app(app) as url:
            assert httpx.post(url + CHAT, json=BODY, timeout=30).status_code == 429
            assert _rejections(url) == {"upstream_429": 1.0}
        wait_rows(app.state.proxy.ledger, 1)
    errs = _report_errors(tmp_path / "l.sqlite")
    assert [(e["status"], e["http_status"], e["error"]) for e in errs] == [
        ("upstream_error", 429, "upstream 429")]


def test_a_request_every_breaker_was_open_for_is_a_counted_rejection(tmp_path: Path) -> None:
    """Both deployments refuse connections: the first request opens both breakers (threshold
    1); the second finds every breaker open, is tried anyway (the panic rule) and fails: that
    one is a rejection by open breakers, the first an ordinary upstream failure."""
    group = {"e": {"kind": "openai_compat", "deployments": [
        {"base_url": _closed_port_url(), "name": "d1"},
        {"base_url": _closed_port_url(), "name": "d2"}]}}
    policy = _policy(tmp_path, group, breaker={"consecutive_failures": 1, "cooldown_s": 60})
    app = build_app(policy, rewrite_fn=None, analyze=False)
    with serve_app(app) as url:
        assert httpx.post(url + CHAT, json=BODY, timeout=30).status_code == 502
        assert _rejections(url) == {}
        assert httpx.post(url + CHAT, json=BODY, timeout=30).status_code == 502
        assert _rejections(url) == {"breakers_open": 1.0}
    rows = wait_rows(app.state.proxy.ledger, 2)
    assert rows[1]["error"].startswith("breakers open; ") and rows[1]["attempts"] == 2
    errs = _report_errors(tmp_path / "l.sqlite")
    assert sum(e["count"] for e in errs if e["error"].startswith("breakers open")) == 1
    assert sum(e["count"] for e in errs) == 2


def test_rejected_by_names_who_rejected() -> None:
    assert rejected_by("RateLimited", 429, "over rpm") == "proxy_rate_limit"
    assert rejected_by("upstream_error", 529, "upstream 529") == "upstream_529"
    assert rejected_by("upstream_error", 500, "upstream 500") is None
    assert rejected_by("UpstreamUnavailable", 502, "breakers open; refused") == "breakers_open"
    assert rejected_by("ok", 200, None) is None
