"""The moves take ``off | on | guarded`` (issue 36): a bool is still a mode, the shipped default
is ``guarded``, anything else is refused naming the field, and :func:`switch_on` counts only
``on`` (an unresolved ``guarded`` is not on, wherever a pass decides)."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from prefixgate.config.guard_settings import MOVES, GuardSettings, TrialBudget
from prefixgate.config.loader import PolicyError, parse_policy
from prefixgate.config.schema import Policy, RewriteSettings, switch_on
from prefixgate.rewriter.pipeline import PASSES, run_passes
from prefixgate.rewriter.types import Context
from prefixgate.rewriter.wire import codec

_BASE = {"backends": {"b": {"kind": "openai_compat", "base_url": "http://127.0.0.1:9/v1"}},
         "routes": [{"match": "*", "backend": "b"}]}


def test_the_five_moves_are_the_pass_switches_that_move_text() -> None:
    switches = {p.switch for p in PASSES}
    assert set(MOVES) <= switches
    assert MOVES == ("hoist_volatile", "stabilise_passages", "prune_tools", "prune_history",
                     "prune_rag")


@pytest.mark.parametrize("move", MOVES)
def test_a_bool_is_still_a_mode(move: str) -> None:
    assert getattr(RewriteSettings.model_validate({move: True}), move) == "on"
    assert getattr(RewriteSettings.model_validate({move: False}), move) == "off"
    for mode in ("off", "on", "guarded"):
        assert getattr(RewriteSettings.model_validate({move: mode}), move) == mode


@pytest.mark.parametrize(("text", "want"), [("on", "on"), ("off", "off"), ("true", "on"),
                                            ("false", "off"), ("guarded", "guarded"),
                                            ("'on'", "on"), ("'Guarded'", "guarded")])
def test_yaml_spellings_read_as_the_mode(text: str, want: str) -> None:
    doc = yaml.safe_load(f"rewrite: {{hoist_volatile: {text}, prune_rag: {text}}}")
    rw = Policy.model_validate({**_BASE, **doc}).rewrite
    assert rw.hoist_volatile == want and rw.prune_rag == want


def test_the_shipped_default_of_every_move_is_guarded_and_guarded_is_not_on() -> None:
    s = RewriteSettings()
    for move in MOVES:
        assert getattr(s, move) == "guarded", move
        assert switch_on(s, move) is False, move


@pytest.mark.parametrize("bad", ["maybe", "enabled", 1, 0, None, ["on"]])
def test_anything_else_is_refused_naming_the_field(bad: object) -> None:
    with pytest.raises(ValidationError) as e:
        RewriteSettings.model_validate({"prune_history": bad})
    err = e.value.errors()[0]
    assert err["loc"] == ("prune_history",)
    assert "prune_history" in str(e.value)


def test_a_bad_mode_in_a_policy_file_names_its_path() -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy({**_BASE, "rewrite": {"stabilise_passages": "sometimes"}})
    assert "rewrite.stabilise_passages" in str(e.value)


def test_switch_on_counts_only_on() -> None:
    # a planted `!= "off"` (or a truthiness test) counts "guarded" as on: this fails
    for move in MOVES:
        assert switch_on(RewriteSettings.model_validate({move: "on"}), move) is True
        assert switch_on(RewriteSettings.model_validate({move: "off"}), move) is False
        assert switch_on(RewriteSettings.model_validate({move: "guarded"}), move) is False
    # bool switches (and a move set to a bool by model_copy, which skips validation)
    assert switch_on(RewriteSettings(canonicalize_tools=True), "canonicalize_tools") is True
    assert switch_on(RewriteSettings(canonicalize_tools=False), "canonicalize_tools") is False
    s = RewriteSettings().model_copy(update={"hoist_volatile": True, "prune_rag": False})
    assert switch_on(s, "hoist_volatile") is True and switch_on(s, "prune_rag") is False
    with pytest.raises(AttributeError):
        switch_on(s, "no_such_switch")


def _clocked(k: int) -> dict[str, object]:
    system = (f"Current time: 2026-12-01 10:{10 + k:02d}:00 UTC\nRequest ID: req_{k:04x}\n"
              + "Be brief and polite. " * 200)
    return {"model": "m", "messages": [{"role": "system", "content": system},
                                       {"role": "user", "content": f"question {k}"}]}


@pytest.mark.parametrize(("mode", "runs"), [("guarded", False), ("off", False), ("on", True)])
def test_the_pipeline_runs_a_move_only_when_it_is_on(mode: str, runs: bool) -> None:
    ctx = Context(RewriteSettings.model_validate({"hoist_volatile": mode}), model="m",
                  provider="radix")
    _, edits = run_passes(codec.parse(_clocked(1), "openai"), ctx)
    assert any(e.pass_name == "hoist_volatile" for e in edits) is runs


def test_guard_settings_defaults_and_budgets() -> None:
    g = Policy.model_validate(_BASE).meaning_guard
    assert g == GuardSettings()
    assert (g.enabled, g.margin, g.confidence, g.look_every, g.max_pairs) == (True, 0.15, 0.95, 20, 200)
    assert (g.verdict_ttl_s, g.sample_every, g.max_tokens, g.first_tokens, g.concurrency) == (
        86400.0, 1, 16, 16, 1)
    assert g.local_budget == TrialBudget(requests_per_day=1200, tokens_per_day=3_000_000,
                                         usd_per_day=0.0)
    assert g.hosted_budget == TrialBudget(requests_per_day=0, tokens_per_day=0, usd_per_day=0.0)
    assert Policy.model_validate(_BASE).routes[0].meaning_guard_budget is None


def test_a_routes_budget_and_the_guard_section_parse() -> None:
    doc = {**_BASE, "routes": [{"match": "*", "backend": "b", "meaning_guard_budget": {
        "requests_per_day": 50, "tokens_per_day": 200_000, "usd_per_day": 0.5}}],
        "meaning_guard": {"enabled": False, "margin": 0.1}}
    pol = Policy.model_validate(doc)
    assert pol.routes[0].meaning_guard_budget == TrialBudget(requests_per_day=50,
                                                             tokens_per_day=200_000, usd_per_day=0.5)
    assert pol.meaning_guard.enabled is False and pol.meaning_guard.margin == 0.1
    for bad in ({"meaning_guard": {"nope": 1}}, {"meaning_guard": {"margin": 2}},
                {"meaning_guard": {"local_budget": {"requests_per_day": -1}}}):
        with pytest.raises(ValidationError):
            Policy.model_validate({**_BASE, **bad})
