"""Stand back where rewriting does not pay, end to end: proxy -> two scripted engines with real
shared prefix caches (:mod:`bench.prefix_engine`), one route where the token-adding pass
loses and one where it wins (:mod:`prefixgate.cache.savings.stand_back`).

The pass is a stand-in for ``hoist_volatile`` (same name and switch, so the route's verdict
switches it off the way it switches the real one): on a system prompt opening with a clock it
moves the clock line into a trailing note (rewriting wins: the rest of the prompt becomes
reusable); otherwise it only appends a note (rewriting loses: tokens added, nothing made
reusable). The counterfactual is exact (the engine's own token ids, one shared tree).
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
from prefixgate.config.schema import switch_on
from prefixgate.proxy.app import build_app
from prefixgate.proxy.cli import app as cli
from prefixgate.rewriter.types import Api, Context, Edit, RewriteResult
from tests.proxy.upstream import wait_rows
from tests.servers import serve_app

RULES = "".join(f"Rule {i}: verify the user id first and never book without a yes. "
                for i in range(40))
NOTE = "[note] Remember the policy above before you answer. "


def note_pass(body: dict[str, Any], api: Api, ctx: Context) -> RewriteResult:
    """The stand-in pass (module docstring)."""
    if not switch_on(ctx.settings, "hoist_volatile"):
        return RewriteResult(body, [Edit("hoist_volatile", False, "system", "switched off")])
    msgs = body["messages"]
    first, _, rest = msgs[0]["content"].partition("\n")
    if first.startswith("Time:"):
        new, note = [{"role": "system", "content": rest}, *msgs[1:]], first
    else:
        new, note = list(msgs), NOTE
    added = ctx.count_tokens(note)
    return RewriteResult({**body, "messages": [*new, {"role": "user", "content": note}]},
                         [Edit("hoist_volatile", True, "messages", "note", tokens_added=added)])


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[str, Ledger, dict[str, PrefixEngine]]]:
    engines = {"lose": PrefixEngine(), "win": PrefixEngine()}
    with serve_app(engines["lose"].app()) as lose, serve_app(engines["win"].app()) as win:
        policy = parse_policy({
            "backends": {"lose": {"kind": "openai_compat", "base_url": lose + "/v1"},
                         "win": {"kind": "openai_compat", "base_url": win + "/v1"}},
            "routes": [{"match": "lose-*", "backend": "lose"}, {"match": "win-*", "backend": "win"}],
            # hoist_volatile is opt-in (MOVES_THE_MODEL_READS): the stand-in pass is its switch
            # time_budget_ms: the first after-answer analysis loads the tokenizer, over the
            # 1 s default on a loaded machine (its row then has no counterfactual)
            "rewrite": {"stand_back_min_requests": 4, "edit_detail_header": True,
                        "hoist_volatile": True, "time_budget_ms": 20000},
            "ledger": {"path": str(tmp_path / "ledger.sqlite"), "batch_writes": False},
            "default_max_tokens": 0})
        ledger = Ledger(policy.ledger.path)
        with serve_app(build_app(policy, ledger=ledger, rewrite_fn=note_pass)) as url:
            yield url, ledger, engines


def _conversations(url: str, route: str, model: str | None = None,
                   tenant: str | None = None) -> list[httpx.Response]:
    """Three conversations, four turns each, interleaved (``route``: ``win`` puts a clock first
    in the system text; ``model``: sent to that model instead of ``<route>-m``)."""
    out = []
    extra = {"x-prefixgate-tenant": tenant} if tenant else {}
    for turn in range(4):
        for s in range(3):
            system = (f"Time: 10:{turn:02d}:{s:02d}\n" if route == "win" else "") + RULES
            msgs = [{"role": "system", "content": system}]
            for k in range(turn + 1):
                msgs.append({"role": "user", "content": f"[{s}] question {k}"})
                if k < turn:
                    msgs.append({"role": "assistant", "content": f"answer {k}"})
            r = httpx.post(url + "/v1/chat/completions", timeout=60,
                           headers={"x-prefixgate-session": f"{route}-{s}", **extra},
                           json={"model": model or f"{route}-m", "messages": msgs, "max_tokens": 1})
            assert r.status_code == 200, r.text
            out.append(r)
    return out


def test_a_losing_route_stops_adding_tokens_and_a_winning_one_keeps_going(
        stack: tuple[str, Ledger, dict[str, PrefixEngine]]) -> None:
    url, ledger, engines = stack
    lose = _conversations(url, "lose")
    win = _conversations(url, "win")
    rows = wait_rows(ledger, 24)
    lrows = [r for r in rows if r["route"] == "lose-*"]
    wrows = [r for r in rows if r["route"] == "win-*"]
    # losing: the first requests add a note that makes nothing reusable ...
    assert all(json.loads(r["pass_tokens"])["hoist_volatile"]["added"] > 0 for r in lrows[:4])
    assert sum(r["cached_tokens"] - r["cf_cached_tokens"] for r in lrows[:4]) <= 0
    # ... then the pass stands back: the backend gets the client's bytes, and it says why
    back = [r for r in lrows if r["stood_back"]]
    assert len(back) >= 6 and back == lrows[len(lrows) - len(back):]
    assert all(r["stood_back"].startswith("hoist_volatile: rewritten arm no better than "
                                          "unrewritten (counterfactual: saved -") for r in back)
    assert all(r["edits"] == "none" and r["cf_source"] == "measured" for r in back)
    assert all(r.headers["x-prefixgate-stand-back"].startswith("hoist_volatile:")
               for r in lose[-len(back):])
    assert '"pass":"stand_back"' in lose[-1].headers["x-prefixgate-edit-detail"]
    assert "x-prefixgate-stand-back" not in lose[0].headers
    # winning: the note keeps moving the clock out of the prefix, nothing stands back
    assert not any(r["stood_back"] for r in wrows) and all(
        "x-prefixgate-stand-back" not in r.headers for r in win)
    assert all(json.loads(r["pass_tokens"])["hoist_volatile"]["added"] > 0 for r in wrows)
    assert sum(r["cached_tokens"] - r["cf_cached_tokens"] for r in wrows) > 1000
    assert sum(c for _, c in engines["win"].log) > sum(c for _, c in engines["lose"].log) / 2

    res = CliRunner().invoke(cli, ["report", "--ledger", ledger.path], env={"COLUMNS": "120"})
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert f"stood back on route lose-*: hoist_volatile off for {len(back)} requests" in text
    assert "stood back on route win-*" not in text
    doc = json.loads(CliRunner().invoke(cli, ["report", "--ledger", ledger.path,
                                              "--json"]).output)
    assert [(e["route"], e["passes"], e["requests"]) for e in doc["stood_back"]] == [
        ("lose-*", ["hoist_volatile"], len(back))]
    api = httpx.get(url + "/api/savings?range=1h", timeout=30).json()
    routes = {r["route"]: r for r in api["routes"]}
    assert routes["lose-*"]["stood_back"]["passes"] == ["hoist_volatile"]
    assert routes["lose-*"]["stood_back"]["requests"] == len(back)
    assert routes["win-*"]["stood_back"] is None


def test_one_tenants_losing_traffic_stands_back_for_that_tenant_only(tmp_path: Path) -> None:
    """Issue 34 item 6: one tenant's requests on a route where the pass loses switched it off
    for the whole route, every other tenant included. The verdict is per tenant: ``noisy``'s
    losing turns stand its own pass back, ``quiet``'s clock keeps being moved on the same route."""
    engine = PrefixEngine()
    with serve_app(engine.app()) as up:
        policy = parse_policy({
            "backends": {"up": {"kind": "openai_compat", "base_url": up + "/v1"}},
            "routes": [{"match": "*", "backend": "up"}], "tenants": {"header": "on"},
            "rewrite": {"stand_back_min_requests": 4, "hoist_volatile": True,
                        "time_budget_ms": 20000},
            "ledger": {"path": str(tmp_path / "ledger.sqlite"), "batch_writes": False},
            "default_max_tokens": 0})
        ledger = Ledger(policy.ledger.path)
        with serve_app(build_app(policy, ledger=ledger, rewrite_fn=note_pass)) as url:
            _conversations(url, "lose", "m", tenant="noisy")
            rows = wait_rows(ledger, 12)
            quiet = _conversations(url, "win", "m", tenant="quiet")
            rows = wait_rows(ledger, 24)
    noisy_rows = [r for r in rows if r["tenant"] == "noisy"]
    quiet_rows = [r for r in rows if r["tenant"] == "quiet"]
    assert len(noisy_rows) == len(quiet_rows) == 12
    assert any(r["stood_back"] for r in noisy_rows)  # the losing tenant's own pass stood back
    assert not any(r["stood_back"] for r in quiet_rows)
    assert all("x-prefixgate-stand-back" not in r.headers for r in quiet)
    assert all(json.loads(r["pass_tokens"])["hoist_volatile"]["added"] > 0 for r in quiet_rows)
