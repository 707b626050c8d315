"""The split decision's boundaries and the contract body builders (pure)."""

from __future__ import annotations

from prefixgate.config.pd_settings import PDSettings
from prefixgate.proxy.routing.pd.split import (
    decide,
    host_port,
    llmd_headers,
    sglang_body,
    vllm_decode_body,
    vllm_prefill_body,
)

PD = PDSettings(prefill="http://p:9/v1", decode="http://d:8/v1", split_min_uncached_tokens=100,
                colocate_min_cached_fraction=0.5)


def test_uncached_at_the_threshold_splits_one_below_colocates() -> None:
    pd = PD.model_copy(update={"colocate_min_cached_fraction": 1.0})
    assert decide(1000, 900, pd).split and decide(1000, 900, pd).reason == "split"
    low = decide(1000, 901, pd)
    assert not low.split and low.reason == "short_uncached" and low.uncached_tokens == 99


def test_a_hit_at_the_fraction_colocates_one_below_splits() -> None:
    at = decide(1000, 500, PD)
    assert not at.split and at.reason == "prefix_hit"
    below = decide(1000, 499, PD)
    assert below.split and below.reason == "split"


def test_counts_are_clipped() -> None:
    d = decide(100, 500, PD)
    assert d.cached_tokens == 100 and d.uncached_tokens == 0 and not d.split
    assert decide(-5, -1, PD).prompt_tokens == 0


def test_vllm_bodies_leave_the_clients_body_alone() -> None:
    body = {"messages": [], "max_completion_tokens": 9, "stream": True, "min_tokens": 1}
    pre = vllm_prefill_body(body)
    assert pre["max_tokens"] == 1 and pre["max_completion_tokens"] == 1 and not pre["stream"]
    assert "min_tokens" not in pre and body["max_completion_tokens"] == 9
    assert vllm_decode_body(body, {"a": 1}) == {**body, "kv_transfer_params": {"a": 1}}


def test_sglang_and_llmd_shapes() -> None:
    b = sglang_body({"x": 1}, "http://prefill.svc:30000/v1", 8998, room=5)
    assert b == {"x": 1, "bootstrap_host": "prefill.svc", "bootstrap_port": 8998,
                 "bootstrap_room": 5}
    assert llmd_headers("http://p:9/v1") == {"x-prefiller-host-port": b"p:9"}
    assert host_port("https://h/v1") == ("h", 443) and host_port("http://h/v1") == ("h", 80)


def test_cache_match_asks_with_ids_for_token_prompts_and_skips_text() -> None:
    from prefixgate.proxy.routing.pd.split import cache_match_body

    chat = {"messages": [{"role": "user", "content": "x"}]}
    assert cache_match_body(chat) is chat
    assert cache_match_body({"prompt": [1, 2, 3], "cache_salt": "t"}) == {
        "input_ids": [1, 2, 3], "cache_salt": "t"}
    assert cache_match_body({"prompt": [[4, 5]]}) == {"input_ids": [4, 5]}
    assert cache_match_body({"prompt": "text"}) is None
    assert cache_match_body({"prompt": [1, True]}) is None
