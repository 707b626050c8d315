"""The meaning guard end to end (issue 36, item 3): the real proxy app, shipped defaults (every
move ``guarded``) but for the route's trial budget, in front of the scripted upstreams of
:mod:`bench.guard_upstreams`, tau-bench sessions replayed through it as clients
(:mod:`bench.guard_replay`).

- ``unaffected`` (answers ignore where the clock is): ``hoist_volatile`` turns on, later
  requests reach the upstream hoisted; another tenant's requests are still trialled, not
  hoisted (a verdict is per route and tenant);
- ``affected`` (answers depend on the system prompt's exact text): the move turns off and no
  later request is hoisted;
- ``noisy`` (a quarter of calls answer otherwise, even at temperature 0): the floor absorbs it,
  no false ``off``;
- each counts client answers against trial calls: every client answer is a client call's
  (0 trial answers to a client), and trial calls stay within the budget; a hosted route with no
  budget (the shipped default) never trials.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.guard_replay import Rig, applied_passes, guard_states, rig, tau_sessions

BUDGET = {"requests_per_day": 2000, "tokens_per_day": 50_000_000, "usd_per_day": 50.0}


@pytest.fixture(scope="module")
def sessions() -> list[list[dict[str, Any]]]:
    """30 tau-bench sessions of at most 8 requests (7 where the clock has been seen moving)."""
    return tau_sessions(30, max_requests=8)


def hoist_state(r: Rig) -> str:
    """``hoist_volatile``'s state on the last client answer."""
    return guard_states(r.sent[-1].guard).get("hoist_volatile", ("?", 0))[0]


def replay_until_decided(r: Rig, sessions: list[list[dict[str, Any]]], tag: str) -> int:
    """Replay sessions one at a time (letting trials finish after each) until a client answer
    shows ``hoist_volatile`` decided; returns the number of sessions used."""
    for i, bodies in enumerate(sessions):
        r.replay([bodies], tag, first_index=i, think=True)
        r.settle(quiet_s=0.6)
        if hoist_state(r) in ("on", "off"):
            return i + 1
        # the verdict lands after the session's last answer: the next request shows it
    raise AssertionError(f"no verdict after {len(sessions)} sessions: {r.sent[-1].guard!r}")


def assert_counts(r: Rig, budget: dict[str, Any] = BUDGET) -> None:
    """Client answers vs trial calls (module docstring)."""
    counts = r.upstream.counts()
    assert all(s.status == 200 for s in r.sent)
    assert r.trial_answers_to_clients() == 0
    assert counts["client_calls"] == len(r.sent)
    assert 0 < counts["trial_calls"] <= budget["requests_per_day"]


@pytest.fixture
def unaffected(tmp_path: Path) -> Iterator[Rig]:
    with rig("unaffected", tmp_path, budget=BUDGET, extra={"tenants": {"header": "on"}}) as r:
        yield r


@pytest.mark.slow
def test_unaffected_upstream_turns_hoisting_on_and_later_requests_are_sent_hoisted(
        unaffected: Rig, sessions: list[list[dict[str, Any]]]) -> None:
    r = unaffected
    used = replay_until_decided(r, sessions, "u")
    assert hoist_state(r) == "on"
    state, pairs = guard_states(r.sent[-1].guard)["hoist_volatile"]
    assert 20 <= pairs <= 200
    # while trialling nothing reached the upstream hoisted; the trials sent it both ways
    trialling = [s for s in r.sent if "hoist_volatile=trialling" in s.guard]
    assert len(trialling) >= 20
    assert not any(r.upstream.call_of(s.answer_id).hoisted for s in trialling)  # type: ignore[union-attr]
    assert any(c.hoisted for c in r.upstream.calls if c.trial)
    before = len(r.sent)
    r.replay(sessions[used:used + 2], "u", first_index=used)
    later = r.sent[before:]
    assert all("hoist_volatile=on" in s.guard for s in later)
    for s in later:
        call = r.upstream.call_of(s.answer_id)
        assert call is not None and not call.trial
        # the clock is first seen moving on a session's second request
        assert call.hoisted == (s.turn >= 1) == ("hoist_volatile" in applied_passes(s.edits))
    # another tenant has no verdict of its own yet: trialled, sent as the client wrote it
    other = r.replay(sessions[used + 2:used + 3], "t", tenant="acme", first_index=used + 2)
    assert all(guard_states(s.guard)["hoist_volatile"][0] == "trialling" for s in other)
    assert not any(r.upstream.call_of(s.answer_id).hoisted for s in other)  # type: ignore[union-attr]
    r.settle(quiet_s=0.6)
    assert_counts(r)


@pytest.mark.slow
def test_affected_upstream_keeps_hoisting_off_and_no_later_request_is_hoisted(
        tmp_path: Path, sessions: list[list[dict[str, Any]]]) -> None:
    with rig("affected", tmp_path, budget=BUDGET) as r:
        used = replay_until_decided(r, sessions, "a")
        assert hoist_state(r) == "off"
        assert guard_states(r.sent[-1].guard)["hoist_volatile"][1] <= 200
        before = len(r.sent)
        r.replay(sessions[used:used + 2], "a", first_index=used)
        later = r.sent[before:]
        assert all("hoist_volatile=off" in s.guard for s in later)
        assert not any("hoist_volatile" in applied_passes(s.edits) for s in later)
        assert not any(c.hoisted for c in r.upstream.calls if not c.trial)
        assert any(c.hoisted for c in r.upstream.calls if c.trial)
        r.settle(quiet_s=0.6)
        assert_counts(r)


@pytest.mark.slow
def test_noisy_upstream_is_not_turned_off_by_its_own_noise(
        tmp_path: Path, sessions: list[list[dict[str, Any]]]) -> None:
    with rig("noisy", tmp_path, budget=BUDGET) as r:
        replay_until_decided(r, sessions, "n")
        assert hoist_state(r) == "on", r.sent[-1].guard
        # the noise was real: client answers to the same content differ, trials saw it too
        assert any(c.noisy for c in r.upstream.calls if c.trial)
        assert sum(c.noisy for c in r.upstream.calls) > 0.15 * len(r.upstream.calls)
        assert_counts(r)


def test_a_hosted_route_without_a_budget_never_trials(
        tmp_path: Path, sessions: list[list[dict[str, Any]]]) -> None:
    with rig("unaffected", tmp_path) as r:
        r.replay(sessions[:2], "z")
        r.settle(quiet_s=0.6)
        assert r.upstream.counts()["trial_calls"] == 0
        assert all(guard_states(s.guard).get("hoist_volatile", ("trialling", 0)) == ("trialling", 0)
                   for s in r.sent)
        assert not any(c.hoisted for c in r.upstream.calls)


def test_trial_calls_stop_at_the_route_budget(
        tmp_path: Path, sessions: list[list[dict[str, Any]]]) -> None:
    tight = {"requests_per_day": 6, "tokens_per_day": 50_000_000, "usd_per_day": 50.0}
    with rig("unaffected", tmp_path, budget=tight) as r:
        for i in range(3):
            r.replay(sessions[i:i + 1], "b", first_index=i)
            r.settle(quiet_s=0.6)
        counts = r.upstream.counts()
        assert 3 <= counts["trial_calls"] <= 6
        assert hoist_state(r) == "trialling"
        assert r.trial_answers_to_clients() == 0
