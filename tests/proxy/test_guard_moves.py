"""Guarded moves resolved per request (issue 36, ``prefixgate/proxy/pipeline/guard_moves.py``): a
guarded move is on only when the book's verdict for the route and tenant is ``on``; every other
state, a missing verdict, a failing book and no book (guard disabled) leave it off; moves set
``on`` / ``off`` are never looked up and never changed; the Edit and the header say what was
decided."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import anyio
import pytest

from prefixgate.config.guard_settings import MOVES
from prefixgate.config.schema import RewriteSettings, switch_on
from prefixgate.proxy.pipeline.guard_moves import (
    DISABLED,
    GUARD_EDIT,
    NO_VERDICT,
    UNAVAILABLE,
    resolve_moves,
)


@dataclass(frozen=True)
class FakeVerdict:
    state: str
    pairs: int = 0
    move_rate: float = 0.0
    floor_rate: float = 0.0

    def header(self) -> str:
        if self.state == "trialling":
            return f"trialling ({self.pairs} pairs)"
        return f"{self.state} ({self.pairs} pairs, {self.move_rate:.2f} vs floor {self.floor_rate:.2f})"


@dataclass
class FakeBook:
    by_move: dict[str, FakeVerdict] = field(default_factory=dict)
    calls: list[tuple[str, str, tuple[str, ...]]] = field(default_factory=list)
    fail: bool = False

    async def verdicts(self, route: str, tenant: str,
                       moves: Sequence[str]) -> Mapping[str, FakeVerdict]:
        self.calls.append((route, tenant, tuple(moves)))
        if self.fail:
            raise ConnectionError("redis down")
        return {m: self.by_move[m] for m in moves if m in self.by_move}


def _resolve(settings: RewriteSettings, book: FakeBook | None, route: str = "gpt-*",
             tenant: str = "acme") -> tuple[RewriteSettings, object, str | None]:
    return anyio.run(resolve_moves, settings, book, route, tenant)


def test_each_verdict_state_decides_its_move() -> None:
    book = FakeBook({"hoist_volatile": FakeVerdict("trialling", 12),
                     "stabilise_passages": FakeVerdict("off", 20, 0.85, 0.0),
                     "prune_tools": FakeVerdict("on", 40, 0.0, 0.0),
                     "prune_history": FakeVerdict("on", 60, 0.05, 0.02)})  # prune_rag: none
    s, edit, header = _resolve(RewriteSettings(), book)
    assert [getattr(s, m) for m in MOVES] == ["off", "off", "on", "on", "off"]
    assert [switch_on(s, m) for m in MOVES] == [False, False, True, True, False]
    assert header == ("hoist_volatile=trialling (12 pairs); "
                      "stabilise_passages=off (20 pairs, 0.85 vs floor 0.00); "
                      "prune_tools=on (40 pairs, 0.00 vs floor 0.00); "
                      "prune_history=on (60 pairs, 0.05 vs floor 0.02); "
                      f"prune_rag={NO_VERDICT}")
    assert edit.pass_name == GUARD_EDIT and edit.applied is False and edit.region == "all"
    assert edit.detail == header.replace("=", ": ")
    assert RewriteSettings().hoist_volatile == "guarded"  # the policy's own object is untouched


def test_the_route_and_tenant_are_passed_through_and_only_guarded_moves_asked() -> None:
    book = FakeBook({m: FakeVerdict("off", 20, 0.9) for m in MOVES})
    settings = RewriteSettings(hoist_volatile="on", stabilise_passages="off", prune_rag=True)
    s, _, header = _resolve(settings, book, route="claude-*", tenant="team-b/ci")
    assert book.calls == [("claude-*", "team-b/ci", ("prune_tools", "prune_history"))]
    # "on" stays on whatever the book says; "off" stays off
    assert (s.hoist_volatile, s.stabilise_passages, s.prune_rag) == ("on", "off", "on")
    assert (s.prune_tools, s.prune_history) == ("off", "off")
    assert header is not None and header.startswith("prune_tools=off (20 pairs")
    assert "hoist_volatile" not in header and "prune_rag" not in header


def test_no_guarded_move_no_lookup_no_edit_no_header() -> None:
    book = FakeBook({m: FakeVerdict("on", 40) for m in MOVES})
    settings = RewriteSettings(**{m: "off" for m in MOVES})
    s, edit, header = _resolve(settings, book)
    assert (s, edit, header) == (settings, None, None) and s is settings
    assert book.calls == []
    on = RewriteSettings(**{m: True for m in MOVES})
    assert _resolve(on, FakeBook())[0] is on


def test_the_book_says_on_for_one_tenant_only() -> None:
    class PerTenant(FakeBook):
        async def verdicts(self, route: str, tenant: str,
                           moves: Sequence[str]) -> Mapping[str, FakeVerdict]:
            state = "on" if tenant == "acme" else "trialling"
            return {m: FakeVerdict(state, 40) for m in moves}

    assert _resolve(RewriteSettings(), PerTenant(), tenant="acme")[0].hoist_volatile == "on"
    assert _resolve(RewriteSettings(), PerTenant(), tenant="other")[0].hoist_volatile == "off"


def test_guard_disabled_every_guarded_move_off_and_said() -> None:
    s, edit, header = _resolve(RewriteSettings(prune_rag="on"), None)
    assert [getattr(s, m) for m in MOVES] == ["off", "off", "off", "off", "on"]
    assert header == "; ".join(f"{m}={DISABLED}" for m in MOVES[:4])
    assert header is not None and "off (guard disabled)" in header
    assert edit is not None and edit.detail.startswith("hoist_volatile: off (guard disabled)")


def test_a_failing_book_leaves_the_moves_off_and_never_raises() -> None:
    book = FakeBook(fail=True)
    s, edit, header = _resolve(RewriteSettings(), book)
    assert all(getattr(s, m) == "off" for m in MOVES)
    assert header == "; ".join(f"{m}={UNAVAILABLE}" for m in MOVES)
    assert len(book.calls) == 1


@pytest.mark.parametrize("text", ["on\r\nx-evil: 1", "on (\u00e9t\u00e9)", "x" * 500])
def test_a_verdicts_text_is_header_safe_and_bounded(text: str) -> None:
    class Odd(FakeVerdict):
        def header(self) -> str:
            return text

    s, _, header = _resolve(RewriteSettings(hoist_volatile="guarded", stabilise_passages="off",
                                            prune_tools="off", prune_history="off",
                                            prune_rag="off"),
                            FakeBook({"hoist_volatile": Odd("on")}))
    assert s.hoist_volatile == "on"
    assert header is not None and header.isascii() and "\r" not in header and "\n" not in header
    assert len(header) <= len("hoist_volatile=") + 120


def test_a_stand_back_turns_a_move_off_before_the_guard_is_asked() -> None:
    from prefixgate.cache.savings.stand_back import Verdict
    from prefixgate.proxy.pipeline.prepare import stood_back

    settings = stood_back(RewriteSettings(), Verdict(True, ("hoist_volatile", "place_breakpoints")))
    assert settings.hoist_volatile == "off" and settings.place_breakpoints is False
    book = FakeBook({m: FakeVerdict("on", 40) for m in MOVES})
    s, _, header = _resolve(settings, book)
    assert s.hoist_volatile == "off" and book.calls[0][2] == MOVES[1:]
    assert header is not None and "hoist_volatile" not in header
