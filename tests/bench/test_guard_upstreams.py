"""The scripted upstreams the meaning guard is shown against (``bench/guard_upstreams.py``) do
what they claim: ``unaffected`` ignores where the clock is, ``affected`` does not, ``noisy``
answers otherwise a quarter of the time; the prefix cache follows OpenAI's rule; trials are
told from client calls. Hoisting is the real pass (``rewrite_request``, ``hoist_volatile`` on)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.guard_replay import tau_sessions
from bench.guard_upstreams import BlockCache, GuardUpstream, answer_index, is_hoisted


def hoisted_pairs(n_sessions: int = 3) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(as the client sent it, hoisted) for every request the real pass hoists."""
    from prefixgate.config.schema import RewriteSettings
    from prefixgate.rewriter.pipeline import rewrite_request, session_updates
    from prefixgate.rewriter.types import Context

    out = []
    for bodies in tau_sessions(n_sessions, max_requests=6):
        mem: dict[str, Any] = {}
        for body in bodies:
            res = rewrite_request(body, "openai", Context(
                RewriteSettings(hoist_volatile="on"), model="gpt-4o-mini", provider="openai",
                session=dict(mem)))
            mem.update(session_updates(res))
            if any(e.pass_name == "hoist_volatile" and e.applied for e in res.edits):
                out.append((body, res.body))
    return out


@pytest.fixture(scope="module")
def pairs() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    got = hoisted_pairs()
    assert len(got) >= 12
    return got


def test_unaffected_ignores_where_the_clock_is_and_affected_does_not(
        pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    assert all(answer_index(a, "unaffected") == answer_index(b, "unaffected") for a, b in pairs)
    assert sum(answer_index(a, "affected") != answer_index(b, "affected") for a, b in pairs) \
        >= 0.75 * len(pairs)
    assert all(is_hoisted(b) and not is_hoisted(a) for a, b in pairs)


def test_unaffected_still_depends_on_the_conversation() -> None:
    bodies = tau_sessions(1, max_requests=6)[0]
    assert len({answer_index(b, "unaffected") for b in bodies}) >= 3


def test_noisy_answers_otherwise_about_a_quarter_of_the_time(
        pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    up = GuardUpstream("noisy", seed=5)
    body = pairs[0][0]
    base = answer_index(body, "noisy")
    answers = [up.serve({**body, "temperature": 0, "max_tokens": 16})[0].answer
               for _ in range(400)]
    other = sum(a != base for a in answers)
    assert 60 <= other <= 140
    assert all(c.trial for c in up.calls)


def test_openai_cache_rule_counts_whole_128_token_blocks_from_1024() -> None:
    cache = BlockCache.of("openai")
    first = list(range(3000))
    assert cache.lookup_and_store(first) == 0
    assert cache.lookup_and_store(first[:1500] + [-1] * 10) == 1408  # 11 blocks of 128
    assert cache.lookup_and_store(list(range(1000)) + [-2] * 600) == 0  # under 1,024
    radix = BlockCache.of("radix")
    radix.lookup_and_store(list(range(64)))
    assert radix.lookup_and_store(list(range(64))) == 63  # the last token is computed
    assert radix.lookup_and_store(list(range(40)) + [-1]) == 32  # two whole 16-token blocks


def test_trials_are_told_from_client_calls_and_usage_reports_the_cache() -> None:
    up = GuardUpstream("unaffected")
    body = tau_sessions(1, max_requests=2)[0][1]
    client, doc = up.serve({**body, "stream": True, "temperature": 0, "max_tokens": 16})
    trial, doc2 = up.serve({**body, "temperature": 0, "max_tokens": 16})
    assert not client.trial and trial.trial
    assert doc2["usage"]["prompt_tokens_details"]["cached_tokens"] == trial.cached_tokens > 1024
    assert up.call_of(doc2["id"]) is trial and up.call_of(doc["id"]) is client
    assert up.counts()["trial_calls"] == 1 == up.counts()["client_calls"]


def test_a_trial_answer_reaching_a_client_is_counted() -> None:
    from bench.guard_replay import Rig, Sent

    up = GuardUpstream("unaffected")
    body = tau_sessions(1, max_requests=1)[0][0]
    _, client = up.serve({**body, "stream": True, "max_tokens": 64})
    _, trial = up.serve({**body, "temperature": 0, "max_tokens": 16})
    r = Rig(up, "http://unused", app=None, sent=[Sent(0, 0, 200, answer_id=client["id"])])
    assert r.trial_answers_to_clients() == 0
    r.sent.append(Sent(0, 1, 200, answer_id=trial["id"]))
    r.sent.append(Sent(0, 2, 200, answer_id="chatcmpl-elsewhere"))
    assert r.trial_answers_to_clients() == 2
