"""A skipped analysis leaves a hole in the real cache's model: no modelled saving is claimed from
it until the hole could have expired (``Insight.note_gap``, ``GAP_WINDOW_S``; issue 25's shedding
under load and bodies over ``ANALYZE_MAX_BYTES``)."""

from __future__ import annotations

from typing import Any

from prefixgate.proxy.observe import insight as insight_mod
from prefixgate.proxy.observe.insight import Insight
from tests.proxy.test_attribution_chain import RULES, Session, _body


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _two_conversations(insight: Insight, gap: bool, clock: Clock, wait_s: float) -> Any:
    """Conversation A's first request (skipped or analysed), then ``wait_s`` later conversation
    B's first request with the same system prompt and tools, in the same real cache."""
    a, b = Session(insight, "a"), Session(insight, "b")
    body = _body(RULES, 1)
    if gap:
        insight.note_gap(a.partition)  # what the proxy does instead of a.send(body)
    else:
        a.send(body)
    clock.t += wait_s
    got, _ = b.send(_body(RULES, 1, user="[b] "))
    return got


def test_no_modelled_counterfactual_right_after_a_skipped_analysis() -> None:
    clock = Clock()
    insight = Insight()
    insight.clock = clock
    analysed = _two_conversations(insight, False, clock, 1.0)
    assert analysed.cf_cached_tokens and analysed.cf_cached_tokens > 500  # A warmed the prefix
    fresh, fclock = Insight(), Clock()
    fresh.clock = fclock
    skipped = _two_conversations(fresh, True, fclock, 1.0)
    # the model never saw A: it would say 0 cached and claim B's whole hit as a saving
    assert skipped.cf_cached_tokens is None and skipped.cf_source == ""
    assert skipped.credits is None


def test_the_window_ends_and_other_caches_are_not_affected() -> None:
    clock = Clock()
    insight = Insight()
    insight.clock = clock
    insight.note_gap("b\x00b")
    clock.t += insight_mod.GAP_WINDOW_S - 0.5
    inside, _ = Session(insight, "x").send(_body(RULES, 1))
    assert inside.cf_cached_tokens is None
    other, _ = Session(insight, "y", partition="c\x00c").send(_body(RULES, 1))
    assert other.cf_cached_tokens == 0  # another real cache: its own model, cold, estimated
    clock.t += 0.5
    after, _ = Session(insight, "z").send(_body(RULES, 1))
    assert after.cf_cached_tokens is not None and after.cf_cached_tokens > 500  # x's prefix
