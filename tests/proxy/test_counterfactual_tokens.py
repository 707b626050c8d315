"""The counterfactual from the backend's own token ids: proxy -> tiny engine with ``/tokenize``.

The same agent session is sent twice, each with its own ``cache_salt``: once unrewritten (the
engine MEASURES what the client's bodies cache) and once rewritten (the ledger MODELS what the
client's bodies would have cached, from the engine's token ids of them). The two must agree.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from prefixgate.proxy.bridges.tokenize import tokenize_url
from prefixgate.proxy.observe.engine_tokens import parse_ids
from prefixgate.rewriter.pipeline import rewrite_request
from tests.proxy.upstream import Script, completion, wait_rows
from tests.servers import serve_app
from tests.tiny_model import make_tiny_model_dir

TOOLS = [{"type": "function", "function": {
    "name": f"tool_{i}", "description": f"Does thing number {i} for the airline agent.",
    "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}}
    for i in range(4)]
RULES = "Follow the airline policy. Verify the user id first. Be brief. " * 6


MOVES = {"hoist_volatile": True, "tool_order": "name"}
"""The rewritten side must differ from the client's bytes for its counterfactual to be modelled:
the clock hoisted once it changes (opt-in, ``MOVES_THE_MODEL_READS``) and the tools re-keyed on
every request (``tool_order: "name"``; the default ``first_seen`` sends them as the client did)."""


def _system(clock: str) -> str:
    return f"# Airline agent\nThe current time is 2024-05-15 {clock} EST.\n{RULES}"


def session_bodies() -> list[dict[str, Any]]:
    """An agent loop: the conversation grows; the clock in the system text changes once."""
    turns = [("user", "I want to change my flight."), ("assistant", "Your user id, please?"),
             ("user", "It is mia_li_3668."), ("assistant", "Which reservation?"),
             ("user", "Reservation NO6JO3.")]
    bodies = []
    for n, clock in ((1, "15:00:00"), (3, "15:00:00"), (5, "15:01:00"), (5, "15:01:00")):
        msgs = [{"role": "system", "content": _system(clock)}]
        msgs += [{"role": r, "content": c} for r, c in turns[:n]]
        bodies.append({"model": "tiny", "messages": msgs, "tools": TOOLS, "max_tokens": 1,
                       "temperature": 0})
    return bodies


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Ledger]]:
    """(proxy URL, ledger): proxy (real rewrite pipeline) -> tiny engine."""
    from prefixgate.local_engine.engine import Engine, EngineConfig
    from prefixgate.local_engine.server import build_app as engine_app

    tiny = make_tiny_model_dir(tmp_path_factory.mktemp("tiny"))
    eng = Engine(EngineConfig(model_path=str(tiny), num_kv_slots=16384, max_context_len=2048,
                              model_name="tiny"))
    try:
        with serve_app(engine_app(eng)) as engine_url:
            policy = parse_policy({
                "backends": {"local": {"kind": "local", "base_url": engine_url + "/v1"}},
                "routes": [{"match": "*", "backend": "local"}],
                "rewrite": MOVES,
                "ledger": {"path": str(tmp_path_factory.mktemp("l") / "ledger.sqlite")}})
            ledger = Ledger(policy.ledger.path)
            with serve_app(build_app(policy, ledger=ledger)) as url:
                yield url, ledger
    finally:
        eng.shutdown()


def _send_session(url: str, name: str, rewrite: bool) -> None:
    headers = {"x-prefixgate-session": name}
    if not rewrite:
        headers["x-prefixgate-rewrite"] = "off"
    for body in session_bodies():
        resp = httpx.post(url + "/v1/chat/completions", json={**body, "cache_salt": name},
                          headers=headers, timeout=120)
        assert resp.status_code == 200, resp.text


def test_modelled_counterfactual_of_the_rewritten_side_equals_the_measured_unrewritten_side(
        stack: tuple[str, Ledger]) -> None:
    url, ledger = stack
    _send_session(url, "cf-off", rewrite=False)
    _send_session(url, "cf-on", rewrite=True)
    rows = wait_rows(ledger, 8)
    off, on = rows[:4], rows[4:]
    # the counterfactual is the client's body on a prefix cache: the engine's span reuse (issue
    # 33) is its own technique, never the client's body's (cache.savings.counterfactual)
    measured = [r["cached_tokens"] - (r["span_reused_tokens"] or 0) for r in off]
    assert [r["cf_source"] for r in off] == ["measured"] * 4
    assert [r["cf_cached_tokens"] for r in off] == measured
    # the session has real reuse and a real break (the clock): the figures are not trivial
    assert measured[0] == 0 and measured[1] > 100 and measured[2] < measured[1] < measured[3]
    assert "modelled" in {r["cf_source"] for r in on}
    assert all(r["edits"] not in ("none", "off", "unavailable") for r in on
               if r["cf_source"] == "modelled")
    assert [r["cf_cached_tokens"] for r in on] == measured


def test_a_backend_without_tokenize_falls_back_to_the_block_model(rig_factory: Any) -> None:
    rig = rig_factory(rewrite_fn=rewrite_request, rewrite=MOVES)
    rig.upstream.script = Script(body=completion())
    for body in session_bodies()[:2]:
        resp = httpx.post(rig.url + "/v1/chat/completions", timeout=30, json={**body,
                          "model": "m"}, headers={"x-prefixgate-session": "s"})
        assert resp.status_code == 200
    rows = rig.ledger.rows()
    assert [r["cf_source"] for r in rows] == ["modelled", "modelled"]
    assert rows[0]["cf_cached_tokens"] == 0 and rows[1]["cf_cached_tokens"] > 0
    # the scripted upstream has no /tokenize: asked once (404), then not again
    assert all(s.path == "/v1/chat/completions" for s in rig.upstream.seen)


def test_tokenize_url_and_answer_parsing() -> None:
    assert tokenize_url("http://h:8000/v1") == "http://h:8000/tokenize"
    assert tokenize_url("http://h:8000/v1/") == "http://h:8000/tokenize"
    assert tokenize_url("http://h:8000") == "http://h:8000/tokenize"
    assert parse_ids(b'{"tokens": [1, 2, 3], "count": 3}') == [1, 2, 3]
    for bad in (b"[1, 2]", b'{"tokens": [1, "2"]}', b'{"tokens": [true]}', b"not json",
                b'{"count": 3}'):
        assert parse_ids(bad) is None


def test_ledger_migration_adds_cf_source(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE requests (id INTEGER PRIMARY KEY, ts REAL, model TEXT)")
    db.execute("INSERT INTO requests (ts, model) VALUES (1.0, 'm')")
    db.commit()
    db.close()
    rows = Ledger(path).rows()
    assert rows[0]["cf_source"] == "" and rows[0]["model"] == "m"


def test_an_anthropic_client_body_is_bridged_before_it_is_tokenized() -> None:
    from prefixgate.proxy.observe.engine_tokens import request_body as tokenize_body

    body = {"model": "tiny", "max_tokens": 8, "system": "Be brief.",
            "tools": [{"name": "t", "description": "d", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": "hi"}]}
    out = tokenize_body("anthropic", body, True, 64)
    assert out["messages"][0] == {"role": "system", "content": "Be brief."}
    assert out["tools"][0]["type"] == "function" and out["tools"][0]["function"]["name"] == "t"
    assert out["add_generation_prompt"] is True and "max_tokens" not in out
    same = tokenize_body("openai", {"model": "m", "messages": [{"role": "user", "content": "x"}]},
                         False, 64)
    assert same == {"model": "m", "messages": [{"role": "user", "content": "x"}],
                    "add_generation_prompt": True}
