"""The ``llamacpp`` backend kind pins each conversation to one llama.cpp slot (``id_slot``),
balances the slots, and reads llama.cpp's ``timings`` for cached tokens and prefill time —
through the real proxy app, against a scripted llama.cpp-shaped upstream."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from prefixgate.proxy.routing.slots import SlotTable, with_id_slot
from tests.proxy.upstream import wait_rows
from tests.routing.llamacpp_upstream import LlamaCppScript, serve_llamacpp
from tests.servers import serve_app

CONVS, TURNS, SLOTS = 4, 3, 4
ORDER = [[0, 1, 2, 3], [3, 1, 0, 2], [2, 0, 3, 1]]  # one turn of each conversation per round


def _run(kind: str, tmp_path: Path) -> tuple[LlamaCppScript, list[dict[str, Any]]]:
    script = LlamaCppScript(SLOTS)
    with serve_llamacpp(script) as upstream:
        policy = parse_policy({"backends": {"lc": {"kind": kind, "base_url": upstream,
                                                   "slots": SLOTS}},
                               "routes": [{"match": "*", "backend": "lc"}],
                               "ledger": {"path": str(tmp_path / f"{kind}.sqlite")}})
        ledger = Ledger(policy.ledger.path)
        app = build_app(policy, rewrite_fn=None, analyze=False, ledger=ledger)
        convs = {c: [{"role": "system", "content": "You are a travel agent. " * 20},
                     {"role": "user", "content": f"Conversation {c} asks about trip {c} " * 5}]
                 for c in range(CONVS)}
        with serve_app(app) as url, httpx.Client(timeout=30) as client:
            for round_ in ORDER:  # interleaved, in an order that changes every round
                for c in round_:
                    msgs = convs[c]
                    r = client.post(url + "/v1/chat/completions",
                                    headers={"x-prefixgate-session": f"conv-{c}"},
                                    json={"model": "m", "messages": msgs, "max_tokens": 4})
                    assert r.status_code == 200, r.text[:300]
                    msgs += [{"role": "assistant", "content": "ok"},
                             {"role": "user", "content": f"more about trip {c} please"}]
        return script, wait_rows(ledger, CONVS * TURNS)


def test_each_conversation_keeps_its_own_slot_and_the_slots_are_balanced(
        tmp_path: Path) -> None:
    script, rows = _run("llamacpp", tmp_path)
    by_conv = collections.defaultdict(set)
    for c, slot in zip([c for round_ in ORDER for c in round_], script.seen, strict=True):
        by_conv[c].add(slot)
    assert all(len(s) == 1 for s in by_conv.values()), by_conv  # pinned
    assert sorted(s for v in by_conv.values() for s in v) == list(range(SLOTS))  # one each
    later = rows[CONVS:]
    prompts = {r["session"]: r for r in rows[:CONVS]}
    assert len(prompts) == CONVS
    # turn 2+: the whole previous prompt was in the conversation's slot (timings.cache_n)
    assert all(r["cached_tokens"] and r["cached_tokens"] >= 0.9 * (r["prompt_tokens"] - 8)
               for r in later), [(r["cached_tokens"], r["prompt_tokens"]) for r in later]
    # the prefill time is llama.cpp's own (timings.prompt_ms: 1 ms a token not cached)
    assert all(r["prefill_ms"] == r["prompt_tokens"] - r["cached_tokens"] for r in rows)


def test_unpinned_openai_compat_reuses_less(tmp_path: Path) -> None:
    _, pinned = _run("llamacpp", tmp_path)
    script, unpinned = _run("openai_compat", tmp_path)
    assert set(script.seen) == {None}  # the generic kind names no slot
    share = [sum(r["cached_tokens"] or 0 for r in rows) / sum(r["prompt_tokens"] for r in rows)
             for rows in (pinned, unpinned)]
    assert share[0] > share[1], share


def test_slot_table_pins_balances_and_forgets() -> None:
    now = [0.0]
    t = SlotTable(ttl_s=10.0, now=lambda: now[0])
    assert [t.slot_for("d", k, 2) for k in ("a", "b", "a", "b")] == [0, 1, 0, 1]
    now[0] = 1.0
    assert t.slot_for("d", "c", 2) == 0  # a tie of one key each: the slot used longer ago
    assert t.live("d", 0) == 2 and t.live("d", 1) == 1
    assert t.slot_for("e", "a", 2) == 0  # another deployment: its own slots
    now[0] = 20.0  # every key is past its ttl
    assert t.slot_for("d", "z", 2) == 1  # none live: the slot used longest ago (b's, at 0)
    assert t.live("d", 0) == 0 and t.live("d", 1) == 1
    assert t.slot_for("d", "z", 1) == 0  # fewer slots now: a held slot beyond them moves
    assert t.live("d", 0) == 1 and t.live("d", 1) == 0
    with pytest.raises(ValueError):
        t.slot_for("d", "a", 0)


def test_id_slot_goes_in_first_and_nothing_else_changes() -> None:
    raw = b'{"model":"m","temperature":1.10,"messages":[]}'
    out = with_id_slot(raw, 3)
    assert out == b'{"id_slot":3,"model":"m","temperature":1.10,"messages":[]}'
    assert orjson.loads(out)["id_slot"] == 3
    assert with_id_slot(b"{}", 1) == b'{"id_slot":1}'
    # a client's own slot is never kept: the proxy drives the slots (issue 34, item 11)
    assert with_id_slot(b'{"id_slot":0}', 2) == b'{"id_slot":2}'
    assert with_id_slot(b'{"a":1.10,"id_slot":"../x","b":1E400}', 1) == (
        b'{"id_slot":1,"a":1.10,"b":1E400}')
    assert with_id_slot(b"[1]", 2) == b"[1]" and with_id_slot(b"not json", 2) == b"not json"
