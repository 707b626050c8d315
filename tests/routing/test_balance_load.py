"""The balancer pinned point by point (issue 21): :mod:`prefixgate.proxy.routing.balance`.

- Load accounting (``Balancer.acquire`` / its release): a hypothesis state machine against a
  plain counter — in-flight never negative, exact per deployment, a release counted once
  however often it is called, ``on_change`` told of every change and only of changes, and
  ``loads`` adding the other replicas' counts (routing/shared.py).
- Placement (``Balancer.place``): consistent hashing with bounded loads as the module docstring
  states it (a new key takes the first deployment in its rendezvous order holding fewer than
  ``ceil(session_balance * (live keys + 1) / n)`` live keys; a placed key stays; a key is live
  for ``session_ttl_s`` after it was last seen, that instant included; at most ``MAX_KEYS``,
  the least recently seen forgotten first) against a reference model.
- ``choose``: SGLang's two-part rule with hand-computed loads at each edge of the guard.
"""

from __future__ import annotations

import collections
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from prefixgate.config.routing import AffinitySettings
from prefixgate.proxy.routing import balance
from prefixgate.proxy.routing.balance import (
    Balancer,
    Choice,
    choose,
    imbalanced,
    rendezvous,
    rendezvous_order,
)

NAMES = ["d0", "d1", "d2"]


# ---- choose / imbalanced / rendezvous: hand-computed -----------------------------------------------

def test_imbalanced_needs_both_the_absolute_and_the_relative_gap() -> None:
    """``max - min > abs_gap`` AND ``max > rel * min``; each edge exactly."""
    assert imbalanced([5, 2], 2, 1.5)  # gap 3 > 2, 5 > 3
    assert not imbalanced([4, 2], 2, 1.5)  # gap 2 == 2: not over
    assert not imbalanced([9, 6], 2, 1.5)  # 9 == 1.5 * 6: not over
    assert imbalanced([10, 6], 2, 1.5)  # gap 4, 10 > 9
    assert not imbalanced([13, 10], 2, 1.5)  # gap 3 but 13 < 15
    assert imbalanced([3, 0], 2, 1.5)  # 3 > 0


def test_rendezvous_takes_the_highest_score_and_the_order_is_decreasing() -> None:
    import hashlib

    def score(key: str, n: str) -> bytes:
        return hashlib.sha256(f"{key}|{n}".encode()).digest()[:8]

    for key in ("s1", "s2", "s3", "s4", "s5", "s6"):
        by_score = sorted(range(3), key=lambda i: score(key, NAMES[i]), reverse=True)
        assert rendezvous(key, NAMES) == by_score[0]
        assert rendezvous_order(key, NAMES) == by_score
    assert rendezvous("k", ["same", "same"]) == 0  # a tie: the first


def test_choose_single_round_robin_and_least_load() -> None:
    s = AffinitySettings(mode="round_robin")
    assert choose(["only"], [9], "k", s) == Choice(0, "single")
    assert [choose(NAMES, [0, 0, 0], "k", s, turn=t).index for t in range(5)] == [0, 1, 2, 0, 1]
    ll = AffinitySettings(mode="least_load")
    assert choose(NAMES, [3, 1, 2], "k", ll) == Choice(1, "least_load")
    # ties broken in turn among the least loaded (d0 and d2 hold 1)
    assert [choose(NAMES, [1, 4, 1], "k", ll, turn=t).index for t in range(4)] == [0, 2, 0, 2]


def test_the_load_guard_takes_the_least_loaded_whatever_the_prefix_says() -> None:
    s = AffinitySettings(mode="prefix", imbalance_abs=2, imbalance_rel=1.5)
    key = next(k for k in (f"s{i}" for i in range(100)) if rendezvous(k, NAMES) == 0)
    assert choose(NAMES, [4, 2, 3], key, s) == Choice(0, "affinity")  # 4-2 == 2: balanced
    assert choose(NAMES, [5, 2, 3], key, s) == Choice(1, "load_guard")
    assert choose(NAMES, [5, 2, 3], key, s, placed=2) == Choice(1, "load_guard")
    assert choose(NAMES, [4, 2, 3], key, s, placed=2) == Choice(2, "affinity")
    # the least loaded tied: rendezvous among the tied ones only
    tied = [1, 2]
    want = tied[rendezvous(key, [NAMES[i] for i in tied])]
    assert choose(NAMES, [9, 0, 0], key, s) == Choice(want, "load_guard")


def test_exact_mode_takes_the_longest_match_and_rendezvous_among_ties() -> None:
    s = AffinitySettings(mode="exact")
    assert choose(NAMES, [0, 0, 0], "k", s, matches=[10, 300, 20]) == Choice(1, "cache_match")
    want = [0, 2][rendezvous("k", ["d0", "d2"])]
    assert choose(NAMES, [0, 0, 0], "k", s, matches=[50, 3, 50]) == Choice(want, "cache_match")
    # nothing matches: the placement (or plain rendezvous)
    assert choose(NAMES, [0, 0, 0], "k", s, matches=[0, 0, 0]) == Choice(rendezvous("k", NAMES), "affinity")
    assert choose(NAMES, [0, 0, 0], "k", s, matches=[0, 0, 0], placed=1) == Choice(1, "affinity")
    # not in exact mode, matches are ignored
    p = AffinitySettings(mode="prefix")
    assert choose(NAMES, [0, 0, 0], "k", p, matches=[0, 9, 0], placed=2) == Choice(2, "affinity")


def test_a_new_key_follows_its_placement_whatever_matches_and_a_known_one_its_cache() -> None:
    """A new key's match is a prefix other keys left (a system prompt held on one replica):
    the placement decides, unless the load guard says no; a known key goes for its match."""
    s = AffinitySettings(mode="exact")
    assert choose(NAMES, [0, 0, 0], "k", s, matches=[272, 0, 0], placed=1,
                  new_key=True) == Choice(1, "affinity")
    assert choose(NAMES, [0, 0, 0], "k", s, matches=[272, 0, 0], placed=1) == Choice(0, "cache_match")
    assert choose(NAMES, [0, 3, 0], "k", s, matches=[272, 0, 0], placed=1,
                  new_key=True).why == "load_guard"
    # without a placement (plain rendezvous) the match still decides
    assert choose(NAMES, [0, 0, 0], "k", s, matches=[272, 0, 0], new_key=True) == Choice(0, "cache_match")


def test_known_and_follow_move_a_placement_with_its_live_count() -> None:
    now = [0.0]
    bal = Balancer(now=lambda: now[0])
    s = AffinitySettings(mode="exact", session_ttl_s=10)
    assert not bal.known("k", s)
    i = bal.place("k", NAMES, s)
    assert bal.known("k", s)
    other = NAMES[(i + 1) % 3]
    bal.follow("k", other)
    assert (bal._live[NAMES[i]], bal._live[other]) == (0, 1)
    assert bal.place("k", NAMES, s) == NAMES.index(other)
    bal.follow("nobody", "d0")  # no placement: nothing moves
    assert sum(bal._live.values()) == 1
    now[0] = 10.5  # seen at 0, ttl 10: no longer live
    assert not bal.known("k", s)


def test_a_prefix_every_deployment_holds_keeps_the_conversation_on_its_placement() -> None:
    """Tied longest matches that include the placement: the placement, named ``cache_match``
    (a shared system prompt must not undo the bounded-load placement) — for every placement,
    so at least two of them differ from what rendezvous among the tied would pick."""
    s = AffinitySettings(mode="exact")
    for placed in range(3):
        assert choose(NAMES, [0, 0, 0], "k", s, matches=[16, 16, 16], placed=placed) == Choice(
            placed, "cache_match")
    # tied between the placement and one other: still the placement
    for placed, matches in ((0, [40, 40, 3]), (1, [40, 40, 3]), (2, [3, 40, 40]), (1, [3, 40, 40])):
        assert choose(NAMES, [0, 0, 0], "k", s, matches=matches, placed=placed) == Choice(
            placed, "cache_match")


def test_a_follow_to_where_the_key_already_is_changes_no_load_and_no_age() -> None:
    now = [0.0]
    bal = Balancer(now=lambda: now[0])
    s = AffinitySettings(mode="exact", session_ttl_s=10)
    i = bal.place("k", NAMES, s)
    bal.place("j", NAMES, s)
    live = collections.Counter(bal._live)
    now[0] = 5.0
    bal.follow("k", NAMES[i])
    assert bal._live == live and bal._keys["k"] == (NAMES[i], 0.0)
    assert list(bal._keys) == ["k", "j"]  # nor its place in the forgetting order


def test_a_placement_exactly_at_its_ttl_edge_is_still_known_as_place_keeps_it() -> None:
    """``known`` agrees with ``place``: seen ``session_ttl_s`` ago, that instant included
    (``_forget`` keeps ``seen >= now - ttl``), the key is known and its next place keeps it."""
    now = [100.0]
    bal = Balancer(now=lambda: now[0])
    s = AffinitySettings(mode="exact", session_ttl_s=10.0)
    i = bal.place("k", NAMES, s)
    now[0] = 110.0
    assert bal.known("k", s)
    assert bal.place("k", NAMES, s) == i and bal._live[NAMES[i]] == 1
    now[0] = 120.25
    assert not bal.known("k", s)


def test_the_llamacpp_slot_pins_time_out_by_the_balancers_clock() -> None:
    """``Balancer.slots`` runs on the balancer's injected clock: a pin seen more than the slot
    table's ttl (600 s) ago is forgotten, its slot free again."""
    now = [0.0]
    bal = Balancer(now=lambda: now[0])
    assert bal.slots.slot_for("d0", "a", 2) == 0
    assert bal.slots.live("d0", 0) == 1
    now[0] = 600.0  # that instant included: still pinned
    assert bal.slots.slot_for("d0", "b", 2) == 1
    assert bal.slots.live("d0", 0) == 1
    now[0] = 1200.5  # "a" (seen at 0) and "b" (at 600) are both past 600 s now
    assert bal.slots.slot_for("d0", "c", 2) == 0  # both free; slot 0 used least recently
    assert (bal.slots.live("d0", 0), bal.slots.live("d0", 1)) == (1, 0)


# ---- placement: hand-computed --------------------------------------------------------------------

def test_a_new_key_skips_deployments_at_the_cap() -> None:
    """Bounded loads, balance 1.0, 3 deployments: the 1st key takes its first choice (cap
    ceil(1/3) = 1, none held); a 2nd key with the same first choice meets cap ceil(2/3) = 1
    there, already held: it takes its second choice."""
    bal = Balancer(now=lambda: 0.0)
    s = AffinitySettings(session_balance=1.0)
    keys = [f"k{i}" for i in range(200)]
    first = rendezvous_order(keys[0], NAMES)[0]
    same = [k for k in keys if rendezvous_order(k, NAMES)[0] == first]
    assert bal.place(same[0], NAMES, s) == first
    assert bal.place(same[1], NAMES, s) == rendezvous_order(same[1], NAMES)[1]
    assert bal._live[NAMES[first]] == 1


def test_placement_counts_exactly_against_the_cap() -> None:
    """Hand-computed with the rule: keys whose first choice is the same deployment; cap(n) =
    ceil(balance * (n + 1) / 3) for the (n+1)-th key."""
    now = [0.0]
    bal = Balancer(now=lambda: now[0])
    s = AffinitySettings(session_balance=1.5)
    keys = [f"k{i}" for i in range(400)]
    first = rendezvous_order(keys[0], NAMES)[0]
    same = [k for k in keys if rendezvous_order(k, NAMES)[0] == first][:6]
    live = collections.Counter()
    for n, k in enumerate(same):
        cap = math.ceil(1.5 * (n + 1) / 3)
        order = rendezvous_order(k, NAMES)
        want = next((i for i in order if live[NAMES[i]] < cap), order[0])
        assert bal.place(k, NAMES, s) == want
        live[NAMES[want]] += 1
    # caps 1, 1, 2, 2, 3, 3: the first choice takes keys 0, 2 and 4
    assert live[NAMES[first]] == 3
    # a placed key stays where it is, even over the cap
    assert bal.place(same[0], NAMES, s) == first


def test_a_key_is_live_for_session_ttl_s_that_instant_included() -> None:
    now = [0.0]
    bal = Balancer(now=lambda: now[0])
    s = AffinitySettings(session_ttl_s=10.0)
    bal.place("a", NAMES, s)
    now[0] = 10.0
    bal.place("b", NAMES, s)  # "a" seen at 0, before = 0: still live
    assert len(bal._keys) == 2
    now[0] = 10.5
    bal.place("c", NAMES, s)  # "a" is gone now, "b" is not
    assert list(bal._keys) == ["b", "c"]
    assert sum(bal._live.values()) == 2


def test_at_most_max_keys_the_least_recently_seen_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(balance, "MAX_KEYS", 2)
    bal = Balancer(now=lambda: 0.0)
    s = AffinitySettings()
    bal.place("a", NAMES, s)
    bal.place("b", NAMES, s)
    assert len(bal._keys) == 2  # at the limit: kept
    bal.place("a", NAMES, s)  # seen again: now the most recent
    bal.place("c", NAMES, s)
    assert list(bal._keys) == ["a", "c"]
    assert sum(bal._live.values()) == 2 and all(v >= 0 for v in bal._live.values())


def test_a_placed_key_whose_deployment_left_the_group_is_placed_again() -> None:
    bal = Balancer(now=lambda: 0.0)
    s = AffinitySettings()
    i = bal.place("k", NAMES, s)
    rest = [n for n in NAMES if n != NAMES[i]]
    j = bal.place("k", rest, s)
    assert j == rendezvous_order("k", rest)[0]
    assert bal._live[NAMES[i]] == 0 and bal._live[rest[j]] == 1


# ---- the state machines ----------------------------------------------------------------------------

class Load(RuleBasedStateMachine):
    """acquire / release against a plain counter (module docstring of this file)."""

    def __init__(self) -> None:
        super().__init__()
        self.changes: list[str] = []
        self.bal = Balancer()
        self.bal.on_change = self.changes.append
        self.want: collections.Counter[str] = collections.Counter()
        self.served: collections.Counter[tuple[str, str]] = collections.Counter()
        self.open: list[tuple[str, object, list[bool]]] = []
        self.expect_changes: list[str] = []

    @rule(name=st.sampled_from(NAMES), why=st.sampled_from(["affinity", "load_guard", ""]))
    def acquire(self, name: str, why: str) -> None:
        self.open.append((name, self.bal.acquire(name, why), [False]))
        self.want[name] += 1
        self.served[(name, why)] += 1
        self.expect_changes.append(name)

    @precondition(lambda self: self.open)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.open) - 1))
        name, rel, done = self.open[i]
        rel()  # type: ignore[operator]
        if not done[0]:
            done[0] = True
            self.want[name] -= 1
            self.expect_changes.append(name)

    @rule(others=st.dictionaries(st.sampled_from(NAMES), st.integers(0, 5)))
    def peers(self, others: dict[str, int]) -> None:
        self.bal.others = others

    @invariant()
    def counts_exact(self) -> None:
        for n in NAMES:
            assert self.bal.inflight[n] == self.want[n] >= 0
        assert self.bal.served == self.served
        assert self.changes == self.expect_changes
        assert self.bal.loads(NAMES) == [self.want[n] + self.bal.others.get(n, 0) for n in NAMES]


Load.TestCase.settings = settings(max_examples=60, stateful_step_count=30)
test_load_accounting_is_exact = Load.TestCase


class Placement(RuleBasedStateMachine):
    """``Balancer.place`` against the docstring's rule, written again plainly."""

    TTL, MAX = 5.0, 4

    def __init__(self) -> None:
        super().__init__()
        self.saved = balance.MAX_KEYS
        balance.MAX_KEYS = self.MAX
        self.t = [0.0]
        self.bal = Balancer(now=lambda: self.t[0])
        self.s = AffinitySettings(session_balance=1.25, session_ttl_s=self.TTL)
        self.keys: dict[str, tuple[str, float]] = {}  # insertion order = least recently seen first

    def teardown(self) -> None:
        balance.MAX_KEYS = self.saved

    def live(self, n: str) -> int:
        return sum(1 for name, _ in self.keys.values() if name == n)

    @rule(dt=st.integers(0, 3))
    def tick(self, dt: int) -> None:
        self.t[0] += dt

    @rule(key=st.sampled_from([f"k{i}" for i in range(8)]),
          names=st.sampled_from([NAMES, NAMES[:2], NAMES[1:]]))
    def place(self, key: str, names: list[str]) -> None:
        now = self.t[0]
        self.keys = {k: v for k, v in self.keys.items() if v[1] >= now - self.TTL}
        held = self.keys.pop(key, None)
        if held is not None and held[0] in names:
            want = names.index(held[0])
        else:
            cap = math.ceil(1.25 * (sum(self.live(n) for n in names) + 1) / len(names))
            order = rendezvous_order(key, names)
            want = next((i for i in order if self.live(names[i]) < cap), order[0])
        self.keys[key] = (names[want], now)
        if len(self.keys) > self.MAX:
            del self.keys[next(iter(self.keys))]
        assert self.bal.place(key, names, self.s) == want

    @rule(key=st.sampled_from([f"k{i}" for i in range(8)]), name=st.sampled_from(NAMES))
    def follow(self, key: str, name: str) -> None:
        """The placement moves where the key's cache went, its last-seen time and order kept;
        ``known`` is a placement seen within the TTL."""
        held = self.keys.get(key)
        assert self.bal.known(key, self.s) == (held is not None
                                               and held[1] >= self.t[0] - self.TTL)
        if held is not None:
            self.keys[key] = (name, held[1])
        self.bal.follow(key, name)

    @invariant()
    def live_counts_exact(self) -> None:
        assert list(self.bal._keys) == list(self.keys)
        for n in NAMES:
            assert self.bal._live[n] == self.live(n) >= 0


Placement.TestCase.settings = settings(max_examples=100, stateful_step_count=30)
test_placement_follows_the_bounded_load_rule = Placement.TestCase


@given(st.lists(st.integers(0, 20), min_size=2, max_size=5), st.integers(0, 4),
       st.floats(1.0, 3.0))
def test_imbalanced_is_the_stated_formula(loads: list[int], gap: int, rel: float) -> None:
    assert imbalanced(loads, gap, rel) == (max(loads) - min(loads) > gap and max(loads) > rel * min(loads))


def test_defaults_and_names_of_each_choice() -> None:
    """``turn`` defaults to 0; each rule names itself in ``why``; a match of 1 token is a match;
    ties among the longest matches are broken by the request's own key."""
    rr = AffinitySettings(mode="round_robin")
    assert choose(NAMES, [0, 0, 0], "k", rr) == Choice(0, "round_robin")
    ex = AffinitySettings(mode="exact")
    assert choose(NAMES, [0, 0, 0], "k", ex, matches=[0, 1, 0]) == Choice(1, "cache_match")
    key = "k1"  # a key whose tie-break between d0 and d2 differs from another key's ("None")
    assert rendezvous(key, ["d0", "d2"]) != rendezvous("None", ["d0", "d2"])
    want = [0, 2][rendezvous(key, ["d0", "d2"])]
    assert choose(NAMES, [0, 0, 0], key, ex, matches=[7, 0, 7]) == Choice(want, "cache_match")


def test_round_robin_turns_are_per_group_and_acquire_defaults_to_no_reason() -> None:
    bal = Balancer()
    assert [bal.turn("a"), bal.turn("b"), bal.turn("a"), bal.turn("a"), bal.turn("b")] == [0, 0, 1, 2, 1]
    bal.acquire("d0")
    assert bal.served == collections.Counter({("d0", ""): 1})
