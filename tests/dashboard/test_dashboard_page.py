"""/dashboard as HTTP: what is served, its size budget, no third-party loads, and proxy keys
(Bearer, x-api-key and HTTP Basic with the key as password)."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from prefixgate.proxy.http.auth import basic_password, hash_key, presented_key
from prefixgate.proxy.observe import dashboard
from tests.dashboard.savings_fixture import (
    KEY,
    busy_payload,
    contract_errors,
    fixture_app,
    idle_payload,
    keyed_guard,
    quiet_payload,
)


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def referenced(html: str) -> list[str]:
    return re.findall(r'(?:src|href)="([^"]+)"', html)


def test_page_and_every_file_it_loads_are_served_within_150_kb() -> None:
    client = TestClient(fixture_app({"1h": busy_payload()}))
    page = client.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    refs = [r for r in referenced(page.text) if not r.startswith("data:")]
    assert sorted(refs) == sorted(f"/dashboard/static/{n}" for n in dashboard.STATIC
                                  if not n.endswith(".txt"))
    total = len(page.content)
    for ref in refs:
        r = client.get(ref)
        assert r.status_code == 200, ref
        assert "charset=utf-8" in r.headers["content-type"]
        total += len(r.content)
    assert total == dashboard.page_bytes()
    assert total <= dashboard.PAGE_BUDGET_BYTES, f"page + scripts are {total} bytes"


def test_nothing_is_loaded_from_another_origin_and_csp_says_so() -> None:
    client = TestClient(fixture_app({"1h": busy_payload()}))
    page = client.get("/dashboard")
    for ref in referenced(page.text):
        assert ref.startswith("/dashboard/static/") or ref == "data:,", ref
    js = client.get("/dashboard/static/dashboard.js").text
    assert "http://" not in js and "https://" not in js
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "unsafe-inline" not in csp
    assert "<script>" not in page.text  # no inline script (the CSP would block it)


def test_uplot_is_vendored_with_its_mit_license() -> None:
    client = TestClient(fixture_app({"1h": busy_payload()}))
    lic = client.get("/dashboard/static/uPlot.LICENSE.txt")
    assert lic.status_code == 200 and "MIT License" in lic.text and "Leon Sorokin" in lic.text
    assert client.get("/dashboard/static/uPlot.iife.min.js").text.startswith(
        "/*! https://github.com/leeoniya/uPlot (v1.6.32) */")


def test_unknown_static_name_is_a_404_in_openai_shape() -> None:
    client = TestClient(fixture_app({"1h": busy_payload()}))
    for name in ("nope.js", "dashboard.html", "LICENSE", "uplot"):
        r = client.get(f"/dashboard/static/{name}")
        assert r.status_code == 404
        assert r.json()["error"]["code"] == "unknown_url"


def test_static_files_are_declared_as_package_data() -> None:
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    line = next(x for x in pyproject.splitlines() if x.startswith('"prefixgate.proxy.observe" = ['))
    for pattern in ("static/*.html", "static/*.js", "static/*.css", "static/uplot/*"):
        assert f'"{pattern}"' in line


def test_fixture_payloads_follow_the_savings_contract() -> None:
    for p in (busy_payload("1h"), busy_payload("24h"), busy_payload("7d"), quiet_payload(), idle_payload()):
        assert contract_errors(p) == []
    broken = busy_payload()
    broken["totals"]["saved_usd"] = "0.1"
    del broken["series"]["ttft_ms"]["p99"]
    assert contract_errors(broken) == ["totals.saved_usd: '0.1' is not a number or null",
                                       "series.ttft_ms.p99: not a list of 24 numbers / nulls"]


@pytest.mark.parametrize("path", ["/dashboard", "/dashboard/static/dashboard.js"])
def test_with_keys_no_key_gets_401_with_a_basic_challenge(path: str) -> None:
    client = TestClient(fixture_app({"1h": busy_payload()}, keyed_guard()))
    for headers in ({}, {"authorization": basic("me", "pgk-wrong")}, {"authorization": "Basic !!"}):
        r = client.get(path, headers=headers)
        assert r.status_code == 401
        assert r.headers["www-authenticate"] == 'Basic realm="prefixgate", charset="UTF-8"'
        assert r.json()["error"]["code"] == "invalid_api_key"
        assert KEY not in r.text


@pytest.mark.parametrize("headers", [{"authorization": f"Bearer {KEY}"}, {"x-api-key": KEY},
                                     {"authorization": basic("", KEY)},
                                     {"authorization": basic("anyone", KEY)}])
def test_with_keys_any_standard_header_carrying_the_key_opens_the_page(headers: dict[str, str]) -> None:
    client = TestClient(fixture_app({"1h": busy_payload()}, keyed_guard()))
    assert client.get("/dashboard", headers=headers).status_code == 200
    assert client.get("/dashboard/static/uPlot.min.css", headers=headers).status_code == 200


def test_basic_password_parsing() -> None:
    assert basic_password(base64.b64encode(b"u:p:with:colons").decode()) == "p:with:colons"
    assert basic_password(base64.b64encode(b"no-colon").decode()) == ""
    assert basic_password("not base64!") == ""
    assert basic_password(base64.b64encode(b"\xff\xfe:x").decode()) == ""
    # the model endpoints read it too, after Bearer / x-api-key rules
    assert presented_key({"authorization": basic("u", KEY)}, "openai") == KEY
    assert presented_key({"authorization": basic("u", KEY), "x-api-key": "other"}, "anthropic") == "other"


def test_the_proxy_serves_the_dashboard_behind_its_keys(tmp_path: Path) -> None:
    policy = parse_policy({"backends": {"up": {"kind": "openai_compat", "base_url": "http://127.0.0.1:9/v1"}},
                           "routes": [{"match": "*", "backend": "up"}],
                           "ledger": {"path": str(tmp_path / "l.sqlite")},
                           "auth": {"keys": [{"id": "k_dash", "hash": hash_key(KEY)}]}})
    app = build_app(policy, ledger=Ledger(tmp_path / "l.sqlite"), rewrite_fn=None, analyze=False)
    with TestClient(app) as client:
        assert client.get("/dashboard").status_code == 401
        r = client.get("/dashboard/", headers={"authorization": basic("", KEY)})  # trailing slash too
        assert r.status_code == 200 and "uPlot.iife.min.js" in r.text
        assert client.head("/dashboard", headers={"authorization": f"Bearer {KEY}"}).status_code == 200
        for path in ("/dashboard/static/..%2Fdashboard.py", "/dashboard/static/../dashboard.py",
                     "/dashboard/static/uplot/LICENSE"):
            r = client.get(path, headers={"authorization": f"Bearer {KEY}"})
            assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url", path
