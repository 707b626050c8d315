"""OpenAI automatic prompt-caching rules. Sources: the guide
https://developers.openai.com/api/docs/guides/prompt-caching ("How it works", "Prompt cache
retention") and the cookbook https://developers.openai.com/cookbook/examples/prompt_caching_201."""

from __future__ import annotations

from prefixgate.cache.provider_models import OpenAICacheModel
from prefixgate.cache.provider_models.openai import cached_tokens_for_match
from prefixgate.cache.savings.cost import price_outcome
from tests.cache.helpers import wc, words


def _body(system_words: int, user: str = "hi", **extra: object) -> dict:
    return {"model": "gpt-4o", "messages": [{"role": "system", "content": words(system_words, "s")},
                                            {"role": "user", "content": user}], **extra}


def test_prompts_under_1024_tokens_are_never_cached() -> None:
    # Guide, "How it works": caching is enabled for prompts of 1024 tokens or longer.
    m = OpenAICacheModel(wc)
    body = _body(900)
    assert m.process(body, 0.0).cached_read_tokens == 0
    assert m.process(body, 1.0).cached_read_tokens == 0


def test_hits_come_in_128_token_increments() -> None:
    # Cookbook 1.1: cache hits occur in increments of 128 tokens after the first 1024.
    assert cached_tokens_for_match(1023, 5000) == 0
    assert cached_tokens_for_match(1024, 5000) == 1024
    assert cached_tokens_for_match(1151, 5000) == 1024
    assert cached_tokens_for_match(1152, 5000) == 1152
    m = OpenAICacheModel(wc)
    m.process(_body(1290, words(200, "u")), 0.0)
    out = m.process(_body(1290, words(200, "v")), 10.0)
    # shared: system message (1290 + 3 markup tokens) + a few tokens of the user message
    assert out.cached_read_tokens == 1280
    assert out.openai_usage() == {"prompt_tokens": out.input_tokens,
                                  "prompt_tokens_details": {"cached_tokens": 1280}}


def test_longest_prefix_of_a_grown_conversation() -> None:
    m = OpenAICacheModel(wc)
    first = _body(2000, "question one")
    m.process(first, 0.0)
    grown = dict(first, messages=first["messages"] + [
        {"role": "assistant", "content": "answer"}, {"role": "user", "content": "next"}])
    out = m.process(grown, 15.0)
    assert out.cached_read_tokens == (2000 + 3 + 2 + 3) // 128 * 128
    assert out.cache_write_tokens == 0  # OpenAI bills no writes


def test_prompt_cache_key_takes_part_in_routing() -> None:
    # Guide, "Cache routing": prompt_cache_key is combined with the prefix hash.
    m = OpenAICacheModel(wc)
    m.process(_body(2000, prompt_cache_key="tenant-a"), 0.0)
    assert m.process(_body(2000, prompt_cache_key="tenant-b"), 1.0).cached_read_tokens == 0
    assert m.process(_body(2000, prompt_cache_key="tenant-a"), 2.0).cached_read_tokens > 1900


def test_in_memory_retention_idle_expiry_and_24h_retention() -> None:
    # Guide, "Prompt cache retention": in-memory prefixes are cleared after 5-10 min idle;
    # prompt_cache_retention "24h" keeps them up to 24 hours.
    m = OpenAICacheModel(wc)
    m.process(_body(2000), 0.0)
    assert m.process(_body(2000), 290.0).cached_read_tokens > 0
    assert m.process(_body(2000), 290.0 + 301.0).cached_read_tokens == 0
    ext = OpenAICacheModel(wc)
    ext.process(_body(2000, prompt_cache_retention="24h"), 0.0)
    assert ext.process(_body(2000, prompt_cache_retention="24h"), 7200.0).cached_read_tokens > 0


def test_overflow_above_15_requests_per_minute_lands_on_a_cold_machine() -> None:
    # Guide, "Cache routing": above ~15 requests/minute per prefix+key, requests overflow.
    m = OpenAICacheModel(wc)
    hits = [m.process(_body(2000), float(t)).cached_read_tokens for t in range(16)]
    assert hits[0] == 0 and all(h > 0 for h in hits[1:15])
    assert hits[15] == 0  # 16th request within the minute: new machine, cold cache
    assert m.machine_count == 2


def test_cached_tokens_priced_at_cached_input_rate() -> None:
    m = OpenAICacheModel(wc)
    m.process(_body(2000), 0.0)
    out = m.process(_body(2000), 1.0)
    cost = price_outcome(out, "gpt-4o-2024-08-06")
    assert cost.cached_read_usd == out.cached_read_tokens * 1.25 / 1e6
    assert cost.uncached_usd == out.uncached_tokens * 2.50 / 1e6
    assert cost.cache_write_usd == 0


def test_sweep_forgets_expired_machines_so_memory_stays_bounded() -> None:
    m = OpenAICacheModel(wc)
    for i in range(5):
        m.process(_body(1100 + i * 200, f"tenant {i}"), float(i))
    assert m.machine_count >= 1
    m.sweep(10_000.0)
    assert m.machine_count == 0


def test_system_text_is_rendered_before_tools_so_a_system_clock_breaks_before_them() -> None:
    # harmony order: instructions, then tools; tools-first credited 1,152 cached tokens here
    tools = [{"type": "function", "function": {"name": f"t{i}", "description": words(60, f"t{i}")}}
             for i in range(20)]

    def body(clock: str) -> dict:
        return {"model": "gpt-4o", "tools": tools, "messages": [
            {"role": "system", "content": f"Now {clock}. " + words(50, "rules")},
            {"role": "user", "content": "hi"}]}

    m = OpenAICacheModel(wc)
    m.process(body("10:15"), 0.0)
    assert m.process(body("10:16"), 1.0).cached_read_tokens == 0
    assert m.process(body("10:16"), 2.0).cached_read_tokens >= 1152
