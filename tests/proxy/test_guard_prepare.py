"""The proxy resolves guarded moves before the passes run (issue 36, ``prepare.passes`` with
``pipeline.guard_moves``): through the app, with a stand-in meaning guard whose book says
``hoist_volatile`` is on, the upstream receives the hoisted body and the answer carries
``x-prefixgate-guard``; while the move is trialling (or the guard is disabled) the client's body
goes up unchanged; the opt-out header and the holdout look nothing up."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import httpx

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from prefixgate.proxy.pipeline.guard_moves import GUARD_HEADER
from tests.proxy.test_guard_moves import FakeVerdict

RULES = "".join(f"Rule {i}: verify the user id first and never book without a yes. "
                for i in range(40))
SYSTEM = f"You are Helper.\nRequest ID: req_8f3a9c2e7b1d4f60a9\n{RULES}"
BODY = {"model": "m", "temperature": 0, "messages": [
    {"role": "system", "content": SYSTEM}, {"role": "user", "content": "book the flight to Paris"}]}


@dataclass
class Book:
    state: str
    calls: list[tuple[str, str, tuple[str, ...]]] = field(default_factory=list)

    async def verdicts(self, route: str, tenant: str,
                       moves: Sequence[str]) -> Mapping[str, FakeVerdict]:
        self.calls.append((route, tenant, tuple(moves)))
        return {m: FakeVerdict(self.state, 40 if self.state == "on" else 12) if
                m == "hoist_volatile" else FakeVerdict("trialling", 3) for m in moves}


def _answer(seen: list[dict[str, Any]]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={
            "id": "c1", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}})
    return httpx.MockTransport(handle)


def _send(tmp: Path, book: Book | None, *, extra: dict[str, Any] | None = None,
          headers: dict[str, str] | None = None) -> tuple[httpx.Response, dict[str, Any]]:
    policy = parse_policy({"backends": {"up": {"kind": "openai_compat",
                                               "base_url": "http://up.test/v1"}},
                           "routes": [{"match": "*", "backend": "up"}],
                           "ledger": {"path": str(tmp / "l.sqlite"), "batch_writes": False},
                           "rewrite": {"edit_detail_header": True},
                           "tenants": {"header": "on"}, **(extra or {})})
    seen: list[dict[str, Any]] = []
    app = build_app(policy, ledger=Ledger(policy.ledger.path), transport=_answer(seen),
                    analyze=False)
    state = app.state.proxy
    state.meaning_guard = None if book is None else SimpleNamespace(book=book)

    async def go() -> httpx.Response:
        await state.upstream.start()
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url="http://pg") as c:
                return await c.post("/v1/chat/completions", json=BODY, headers={
                    "x-prefixgate-session": "s1", "x-prefixgate-tenant": "acme",
                    **(headers or {})})
        finally:
            await state.upstream.close()

    r = anyio.run(go)
    assert r.status_code == 200, r.text
    assert len(seen) == 1
    return r, seen[0]


def test_a_move_the_book_says_is_on_reaches_the_upstream(tmp_path: Path) -> None:
    book = Book("on")
    r, sent = _send(tmp_path, book)
    assert "Request ID" not in sent["messages"][0]["content"]  # hoisted out of the system prompt
    assert "Request ID: req_8f3a9c2e7b1d4f60a9" in json.dumps(sent["messages"][-1])
    assert r.headers[GUARD_HEADER].startswith(
        "hoist_volatile=on (40 pairs, 0.00 vs floor 0.00); stabilise_passages=trialling (3 pairs)")
    assert "hoist_volatile" in r.headers["x-prefixgate-edits"]
    detail = json.loads(r.headers["x-prefixgate-edit-detail"])
    assert any(e["pass"] == "meaning_guard" and e["applied"] is False for e in detail["edits"])
    assert book.calls == [("*", "acme", ("hoist_volatile", "stabilise_passages", "prune_tools",
                                     "prune_history", "prune_rag"))]


def test_while_trialling_the_clients_body_goes_up_unchanged(tmp_path: Path) -> None:
    r, sent = _send(tmp_path, Book("trialling"))
    assert sent["messages"] == BODY["messages"]
    assert r.headers[GUARD_HEADER].startswith("hoist_volatile=trialling (12 pairs);")
    assert "hoist_volatile" not in r.headers["x-prefixgate-edits"]


def test_guard_disabled_in_the_policy_or_absent_leaves_the_moves_off(tmp_path: Path) -> None:
    book = Book("on")
    r, sent = _send(tmp_path, book, extra={"meaning_guard": {"enabled": False}})
    assert sent["messages"] == BODY["messages"] and book.calls == []
    assert r.headers[GUARD_HEADER].startswith("hoist_volatile=off (guard disabled);")
    r, sent = _send(tmp_path, None)
    assert sent["messages"] == BODY["messages"]
    assert r.headers[GUARD_HEADER].startswith("hoist_volatile=off (guard disabled);")


def test_moves_set_on_or_off_need_no_verdict(tmp_path: Path) -> None:
    book = Book("trialling")
    moves = {"hoist_volatile": "on", "stabilise_passages": "off", "prune_tools": False,
             "prune_history": "off", "prune_rag": "off"}
    r, sent = _send(tmp_path, book, extra={"rewrite": moves})
    assert "Request ID" not in sent["messages"][0]["content"]  # on: hoisted, no book asked
    assert book.calls == [] and GUARD_HEADER not in r.headers


def test_the_opt_out_header_and_the_holdout_win(tmp_path: Path) -> None:
    book = Book("on")
    r, sent = _send(tmp_path, book, headers={"x-prefixgate-rewrite": "off"})
    assert sent["messages"] == BODY["messages"] and GUARD_HEADER not in r.headers
    r, sent = _send(tmp_path, book, extra={"holdout": {"fraction": 1.0}})
    assert sent["messages"] == BODY["messages"] and GUARD_HEADER not in r.headers
    assert book.calls == []
