"""Tenants see their own figures only (issue 20, Medium 8: any key's ``/api/savings`` and dashboard
showed every tenant's traffic and model names; the unauthenticated ``/metrics`` too).

A key sees its tenant's rows, rollups and breaks (sub-tenants included); an ``admin`` key sees
all; ``/metrics`` carries no tenant-identifying label: no tenant, key or session label, and no
model name a tenant chose."""

from __future__ import annotations

import base64
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx

from prefixgate.cache.ledger import rollup
from prefixgate.cache.ledger.store import Ledger, LedgerRow
from prefixgate.cache.savings.summary import savings_document
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from prefixgate.proxy.http.auth import hash_key
from tests.proxy.upstream import Script, ScriptedUpstream, completion
from tests.servers import serve_app

KEYS = {"acme": "pgk-" + "a" * 43, "globex": "pgk-" + "g" * 43, "ops": "pgk-" + "o" * 43,
        "acme2": "pgk-" + "c" * 43}
# (tenant, model, route) of each stored request; "" = written before tenants existed
TRAFFIC = [("acme", "acme-secret-ft", "ft-*"), ("acme/team-a", "gpt-4o", "gpt-*"),
           ("globex", "globex-private-model", "g-*"), ("globex", "gpt-4o", "gpt-*"),
           ("globex", "gpt-4o", "gpt-*"), ("", "legacy-model", "*")]


def _fill(ledger: Ledger, now: float) -> None:
    for i, (tenant, model, route) in enumerate(TRAFFIC):
        ledger.write(LedgerRow(ts=now - 60 + i, tenant=tenant, model=model, route=route,
                               backend="up", prompt_tokens=1000 * (i + 1), cached_tokens=100,
                               output_tokens=5, ttft_ms=40.0))
        ledger.write_break("s", {"region": "system", "kind": f"kind-of-{model}",
                                 "token_offset": i, "tokens_lost": 10}, tenant)


def _models(doc: dict[str, Any]) -> set[str]:
    return {r["model"] for r in doc["routes"]}


def test_the_document_holds_one_tenants_rows_rollups_and_breaks(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "l.sqlite")
    now = time.time()
    _fill(led, now)
    acme = savings_document(led, "1h", now=now, tenant="acme")
    assert acme["totals"]["requests"] == 2 and sum(acme["series"]["requests"]) == 2
    assert acme["totals"]["prompt_tokens"] == 1000 + 2000
    assert _models(acme) == {"acme-secret-ft", "gpt-4o"}  # its sub-tenant's included
    assert {b["kind"] for b in acme["breaks"]} == {"kind-of-acme-secret-ft", "kind-of-gpt-4o"}
    assert {s["route"] for s in acme["slo"]} == {"ft-*", "gpt-*"}
    team = savings_document(led, "1h", now=now, tenant="acme/team-a")
    assert team["totals"]["requests"] == 1 and _models(team) == {"gpt-4o"}
    globex = savings_document(led, "1h", now=now, tenant="globex")
    assert globex["totals"]["requests"] == 3 and "acme-secret-ft" not in str(globex)
    everyone = savings_document(led, "1h", now=now)
    assert everyone["totals"]["requests"] == 6 and "legacy-model" in _models(everyone)
    # a tenant whose name starts like another's is not its sub-tenant
    assert savings_document(led, "1h", now=now, tenant="acm")["totals"]["requests"] == 0


def test_an_old_ledger_is_refolded_per_tenant(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    Ledger(path).close()
    db = sqlite3.connect(path)  # as the previous version left it: rollups without a tenant
    db.execute(f"DROP TABLE {rollup.TABLE}")
    db.execute("CREATE TABLE rollup_minutes (minute INTEGER, route TEXT, model TEXT, "
               "backend TEXT, data TEXT, PRIMARY KEY (minute, route, model, backend))")
    for tenant in ("acme", "globex", "globex"):
        db.execute("INSERT INTO requests (ts, route, model, backend, status, prompt_tokens, "
                   "tenant) VALUES (1800000000.0, 'r', 'm', 'b', 'ok', 10, ?)", (tenant,))
    db.commit()
    db.close()
    led = Ledger(path)
    assert rollup.total(led.rollups(0, 2e9, "globex"))["requests"] == 2
    assert rollup.total(led.rollups(0, 2e9))["requests"] == 3
    tables = {r[0] for r in led.query("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "rollup_minutes" not in tables


def _policy(tmp_path: Path, up_url: str = "http://127.0.0.1:1", **extra: Any) -> Any:
    return parse_policy({
        "backends": {"up": {"kind": "openai_compat", "base_url": up_url + "/v1"}},
        "routes": [{"match": "*", "backend": "up"}],
        "tenants": {"header": "on"},
        "auth": {"keys": [
            {"id": "k_acme", "tenant": "acme", "hash": hash_key(KEYS["acme"])},
            {"id": "k_acme2", "tenant": "acme", "hash": hash_key(KEYS["acme2"])},
            {"id": "globex", "hash": hash_key(KEYS["globex"])},  # no tenant: its id
            {"id": "k_ops", "hash": hash_key(KEYS["ops"]), "admin": True}]},
        "ledger": {"path": str(tmp_path / "l.sqlite")}, **extra})


def _get(url: str, who: str, query: str = "", sub: str = "") -> httpx.Response:
    headers = {"authorization": f"Bearer {KEYS[who]}"}
    if sub:
        headers["x-prefixgate-tenant"] = sub
    return httpx.get(url + "/api/savings" + query, timeout=30, headers=headers)


def test_each_key_sees_its_tenant_and_the_admin_sees_all(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "l.sqlite")
    _fill(led, time.time())
    with serve_app(build_app(_policy(tmp_path), ledger=led)) as url:
        admin = _get(url, "ops").json()  # first: its document must not be reused for others
        globex = _get(url, "globex").json()
        acme = _get(url, "acme").json()
        acme2 = _get(url, "acme2").json()  # another key of the same tenant
        team = _get(url, "acme", sub="team-a").json()
        narrowed = _get(url, "acme", "?tenant=acme/team-a").json()
        admin_one = _get(url, "ops", "?tenant=globex&range=24h").json()
        other = _get(url, "acme", "?tenant=globex")
        sneaky = _get(url, "globex", "?tenant=acme")
        bad = _get(url, "ops", "?tenant=a%20b")
        none = httpx.get(url + "/api/savings", timeout=30)
        basic = base64.b64encode(f"browser:{KEYS['globex']}".encode()).decode()
        page_fetch = httpx.get(url + "/api/savings", timeout=30,  # what the dashboard sends
                               headers={"authorization": f"Basic {basic}"}).json()
    assert (admin["tenant"], admin["totals"]["requests"]) == (None, 6)
    assert (globex["tenant"], globex["totals"]["requests"]) == ("globex", 3)
    assert _models(globex) == {"globex-private-model", "gpt-4o"}
    assert "acme" not in str(globex) and "legacy-model" not in str(globex)
    assert (acme["tenant"], acme["totals"]["requests"]) == ("acme", 2)
    assert "globex" not in str(acme) and acme2["totals"] == acme["totals"]
    assert team["tenant"] == narrowed["tenant"] == "acme/team-a"
    assert team["totals"]["requests"] == narrowed["totals"]["requests"] == 1
    assert (admin_one["tenant"], admin_one["totals"]["requests"]) == ("globex", 3)
    assert other.status_code == sneaky.status_code == 403
    assert "globex" not in other.text and "acme" not in sneaky.text.replace("tenant", "")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tenant"
    assert none.status_code == 401
    assert page_fetch["totals"] == globex["totals"]


def test_without_keys_there_is_nobody_to_scope_to(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "l.sqlite")
    _fill(led, time.time())
    policy = _policy(tmp_path, auth={})
    with serve_app(build_app(policy, ledger=led)) as url:
        doc = httpx.get(url + "/api/savings", timeout=30).json()
        one = httpx.get(url + "/api/savings?tenant=globex", timeout=30).json()
    assert doc["tenant"] is None and doc["totals"]["requests"] == 6
    assert one["totals"]["requests"] == 3


SECRET_MODELS = ("acme-secret-ft-2025", "globex-private-model")


def test_metrics_carry_no_tenant_identifying_label(tmp_path: Path) -> None:
    up = ScriptedUpstream(script=Script(body=completion()))
    with serve_app(up.app()) as up_url:
        policy = _policy(tmp_path, up_url)
        app = build_app(policy, ledger=Ledger(tmp_path / "l.sqlite"))
        with serve_app(app) as url:
            for who, model in (("acme", SECRET_MODELS[0]), ("globex", SECRET_MODELS[1])):
                r = httpx.post(url + "/v1/chat/completions", timeout=30, headers={
                    "authorization": f"Bearer {KEYS[who]}", "x-prefixgate-tenant": "team-x",
                    "x-prefixgate-session": f"session-of-{who}"},
                    json={"model": model, "messages": [{"role": "user", "content": "hi"}]})
                assert r.status_code == 200, r.text
            text = httpx.get(url + "/metrics", timeout=30).text  # served without a key
    assert "prefixgate_requests_total" in text
    for leak in ("acme", "globex", "k_acme", "team-x", "session-of", *SECRET_MODELS):
        assert leak not in text, leak
    labels = {name for fam in app.state.proxy.metrics.registry.collect()
              for s in fam.samples for name in s.labels}
    assert labels.isdisjoint({"tenant", "key_id", "key", "session", "user"}), labels
