"""One cache model per real cache, not per session (issue 19, item 3), against measurement.

Two arms of the same traffic go through one proxy to two scripted engines with real, shared
prefix caches (:mod:`bench.prefix_engine`): ``gpt-4o-off`` unrewritten (the engine MEASURES
what the client's bodies cache) and ``gpt-4o-on`` rewritten (the ledger MODELS it). Four
conversations share a system prompt and tools and are interleaved turn by turn, as an agent
fleet's are: what another conversation left in the cache is a hit the client's own body would
have had, so it must be in the counterfactual, not in the saving.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from bench.prefix_engine import PrefixEngine
from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from prefixgate.proxy.cli import app as cli
from prefixgate.rewriter.pipeline import rewrite_request
from tests.proxy.upstream import wait_rows
from tests.servers import serve_app

RULES = "".join(f"Rule {i}: follow the airline policy on changes and refunds, verify the user "
                f"id first, never book without an explicit yes. " for i in range(60))
# the client registers each tool wrapper as {"function", "type"}: canonicalize_tools with
# tool_order "name" re-keys every one (bytes change) but moves none, and a template renders
# them with sorted keys
TOOLS = [{"function": {"name": f"tool_{c}", "description": f"Does {c} for the airline agent.",
                       "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}},
          "type": "function"} for c in "abcdef"]


MOVES = {"hoist_volatile": True, "tool_order": "name"}
"""The rewritten arm's passes: the clock hoisted (opt-in, ``MOVES_THE_MODEL_READS``: the saving
here) and the tools re-keyed on every request (``tool_order: "name"``; the default
``first_seen`` sends them as the client did): bytes that change and save nothing."""


@pytest.fixture
def arms(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[str, Ledger, Any]]:
    """(proxy URL, ledger, engines): ``request.param`` = (backend kind, cache rules)."""
    kind, rules = getattr(request, "param", ("openai_compat", "radix"))
    on, off = PrefixEngine(rules, tokenize=True), PrefixEngine(rules, tokenize=True)
    with serve_app(on.app()) as on_url, serve_app(off.app()) as off_url:
        policy = parse_policy({
            "backends": {"on": {"kind": kind, "base_url": on_url + "/v1"},
                         "off": {"kind": kind, "base_url": off_url + "/v1"}},
            "routes": [{"match": "gpt-4o-on", "backend": "on"},
                       {"match": "gpt-4o-off", "backend": "off"}],
            "rewrite": MOVES,
            "ledger": {"path": str(tmp_path / "ledger.sqlite"), "batch_writes": False},
            "default_max_tokens": 0})
        ledger = Ledger(policy.ledger.path)
        with serve_app(build_app(policy, ledger=ledger, rewrite_fn=rewrite_request)) as url:
            yield url, ledger, (on, off)


def _send(url: str, arm: str, session: str, messages: list[dict[str, Any]]) -> None:
    headers = {"x-prefixgate-session": f"{arm}-{session}"}
    if arm == "off":
        headers["x-prefixgate-rewrite"] = "off"
    r = httpx.post(url + "/v1/chat/completions", headers=headers, timeout=60, json={
        "model": f"gpt-4o-{arm}", "messages": messages, "tools": TOOLS, "max_tokens": 1})
    assert r.status_code == 200, r.text


def _report(ledger: Ledger) -> dict[str, Any]:
    res = CliRunner().invoke(cli, ["report", "--ledger", ledger.path, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)  # type: ignore[no-any-return]


def test_new_conversations_sharing_a_system_prompt_save_nothing_when_the_backend_sees_the_same(
        arms: tuple[str, Ledger, Any]) -> None:
    """The issue's case: four new conversations, same system prompt and tools; each cached as
    much rewritten as it would have unrewritten (another conversation's prefix), so rewriting
    saved nothing — the per-session model credited ~3 x 1,600 tokens."""
    url, ledger, (on, _) = arms
    for s in range(4):
        _send(url, "on", f"c{s}", [{"role": "system", "content": RULES},
                                   {"role": "user", "content": f"Conversation {s}: hello."}])
    rows = wait_rows(ledger, 4)
    assert [c for _, c in on.log][1:] == [on.log[1][1]] * 3 and on.log[1][1] > 1000
    assert all(r["edits"].startswith("canonicalize_tools") for r in rows)   # bytes did change
    assert [r["cf_cached_tokens"] for r in rows] == [r["cached_tokens"] for r in rows]
    assert {r["cf_source"] for r in rows} == {"measured"} and not any(r["pass_tokens"]
                                                                       for r in rows)
    rep = _report(ledger)
    assert rep["saved"]["saved_tokens"] == 0 and rep["saved"]["saved_usd"] == pytest.approx(0)
    assert all(t["saved_tokens"] == 0 for t in rep["by_technique"])
    doc = httpx.get(url + "/api/savings?range=1h", timeout=30).json()
    assert doc["totals"]["saved_tokens"] == 0 and doc["totals"]["saved_usd"] == pytest.approx(0)
    assert sum(t["saved_tokens"] for t in doc["by_technique"]) == 0


def _interleaved(url: str, arm: str, turns: int = 3) -> None:
    """Four conversations, turn by turn; the system prompt's clock moves every request."""
    minute = 0
    for t in range(turns):
        for s in range(4):
            minute += 1
            system = f"{RULES}\nThe current time is 2024-05-15 10:{minute:02d}:00 EST."
            msgs: list[dict[str, Any]] = [{"role": "system", "content": system}]
            for k in range(t + 1):
                msgs.append({"role": "user", "content": f"Conversation {s}, question {k}."})
                if k < t:
                    msgs.append({"role": "assistant", "content": f"Answer {k} to {s}."})
            _send(url, arm, f"c{s}", msgs)


@pytest.mark.parametrize("arms", [("openai_compat", "radix"), ("openai", "openai")],
                         ids=["engine-token-ids", "openai-block-model"], indirect=True)
def test_the_modelled_unrewritten_share_matches_the_measured_one_across_conversations(
        arms: tuple[str, Ledger, Any]) -> None:
    url, ledger, (on, off) = arms
    _interleaved(url, "off")
    _interleaved(url, "on")
    rows = wait_rows(ledger, 24)
    off_rows = [r for r in rows if r["model"] == "gpt-4o-off"]
    on_rows = [r for r in rows if r["model"] == "gpt-4o-on"]
    measured = sum(r["cached_tokens"] for r in off_rows) / sum(r["prompt_tokens"]
                                                               for r in off_rows)
    doc = httpx.get(url + "/api/savings?range=1h", timeout=30).json()
    route = {r["model"]: r for r in doc["routes"]}
    assert route["gpt-4o-off"]["cached_share"] == pytest.approx(measured, abs=1e-6)
    on_cf = [r["cf_cached_tokens"] for r in on_rows]
    modelled = sum(on_cf) / sum(r["prompt_tokens"] for r in on_rows)
    # cross-session hits are real and large: the first turns of conversations 2-4 hit the
    # system prompt the others left, unrewritten too
    assert all(c > 500 for _, c in off.log[1:4]) and measured > 0.2
    assert abs(modelled - measured) <= 0.02, (modelled, measured)
    # measured where the backend saw the client's own prompt (a request the hoist left alone)
    assert {r["cf_source"] for r in on_rows} <= {"modelled", "measured"}
    assert sum(r["cf_source"] == "modelled" for r in on_rows) >= 8
    if off.rules == "radix":  # the engine's own token ids through one shared tree: exact
        assert on_cf == [c for _, c in off.log]
    # rewriting pays here (the clock moved out of the system prompt): the saving is positive,
    # and the parts add up to it, the remainder named
    saved = doc["totals"]["saved_tokens"]
    assert saved > 0 and sum(t["saved_tokens"] for t in doc["by_technique"]) == saved
    tech = {t["technique"]: t for t in doc["by_technique"]}
    assert tech["hoist_volatile"]["tokens_reusable"] > 0
    assert tech.get("canonicalize_tools", {}).get("tokens_reusable", 0) == 0


def test_a_request_answered_without_its_analysis_withholds_the_next_modelled_savings(
        arms: tuple[str, Ledger, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Conversation 0's body is too large to analyse (as under load, when analyses are shed):
    its prefix never reaches the cache model, so a later request that hit it on the engine
    would be modelled uncached and the hit claimed as a saving (``Insight.note_gap``). Within
    the window a row the backend saw as sent keeps its measured counterfactual; a rewritten
    one carries no modelled counterfactual; the report claims nothing."""
    from prefixgate.proxy.pipeline import answer
    url, ledger, (on, _) = arms
    monkeypatch.setattr(answer, "ANALYZE_MAX_BYTES", len(RULES) + 2000)
    big = [{"role": "system", "content": f"{RULES}\nThe current time is 2024-05-15 10:00:00 EST."},
           {"role": "user", "content": "Conversation 0: " + "x" * 4000}]
    _send(url, "on", "c0", big)
    msgs: list[dict[str, Any]] = []
    for t in range(2):  # the clock moves: hoisted on the second turn, so that body is modelled
        system = f"{RULES}\nThe current time is 2024-05-15 10:0{t + 1}:00 EST."
        msgs = [{"role": "system", "content": system}, *msgs[1:],
                {"role": "user", "content": f"Conversation 1, question {t}."}]
        _send(url, "on", "c1", msgs)
        msgs.append({"role": "assistant", "content": f"Answer {t}."})
    rows = wait_rows(ledger, 3)
    assert on.log[1][1] > 1000  # the engine did reuse conversation 0's prefix
    assert "hoist_volatile" in rows[2]["edits"]  # rewritten: would have been modelled
    assert [r["cf_source"] for r in rows] == ["", "measured", ""]
    assert rows[2]["cf_cached_tokens"] is None
    assert _report(ledger)["saved"]["saved_tokens"] <= 0  # only the note's added tokens count
