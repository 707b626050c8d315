"""The simulator's ``prompt_cache_key`` strategies (issue 35, item 1): with many conversations of
one system prompt in flight, OpenAI's routing (prefix + key, a pair above ~15 requests a minute
spilling to cold machines; :mod:`prefixgate.cache.provider_models.openai`) scatters the turns of
keyless conversations, and a key per conversation keeps them on their machine."""

from __future__ import annotations

from dataclasses import replace

from prefixgate.proxy.sim.simulate import (
    KEY_STRATEGIES,
    ONE_KEY,
    SimConfig,
    Simulator,
    _RunState,
    _Totals,
    client_body,
)
from prefixgate.proxy.sim.traces import load_trace
from tests.paths import DATA

TRACE = DATA / "traces" / "tau_bench_airline_gpt4o.json"


def test_a_key_per_conversation_keeps_cached_share_when_conversations_crowd_one_prefix() -> None:
    runs = load_trace(TRACE, runs=32)
    fig = Simulator(SimConfig(provider="openai", strategies=KEY_STRATEGIES,
                              concurrency=32)).run(runs)
    share = {k: v["cached_share"] for k, v in fig["strategies"].items()}
    assert share["key-per-conversation"] > share["key-none"] + 0.03, share
    # one key for every conversation routes exactly as no key does: by the shared prefix
    assert share["key-one-for-all"] == share["key-none"], share


def test_one_conversation_at_a_time_pays_a_cold_first_turn_for_its_own_key() -> None:
    """The price of the key, pinned: a new key is a machine that has not seen the shared
    system prompt, so with one conversation in flight (far below ~15 requests a minute) each
    conversation's first turn is a miss that no key would have read from the prefix's
    machine (``bench/results/prompt_cache_key.json`` shows where the key starts to pay)."""
    runs = [replace(r, requests=r.requests[:4]) for r in load_trace(TRACE, runs=3)]
    fig = Simulator(SimConfig(provider="openai", strategies=KEY_STRATEGIES)).run(runs)
    s = fig["strategies"]
    lost = s["key-none"]["cached_read_tokens"] - s["key-per-conversation"]["cached_read_tokens"]
    assert lost > 0 and s["key-per-conversation"]["cached_share"] > 0.5, s


def test_the_one_for_all_client_key_is_sent_as_the_client_sent_it() -> None:
    (run,) = load_trace(TRACE, runs=1)
    sim = Simulator(SimConfig(provider="openai"))
    body = client_body(run, 2, 0.0, sim.cfg)
    sent = sim._apply("key-one-for-all", body, _RunState(run.run_id), _Totals())
    assert sent["prompt_cache_key"] == ONE_KEY
    mine = sim._apply("key-per-conversation", body, _RunState(run.run_id), _Totals())
    assert mine["prompt_cache_key"] != ONE_KEY and mine["messages"] == body["messages"]
