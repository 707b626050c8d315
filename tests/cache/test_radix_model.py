"""Radix prefix-cache model (vLLM automatic prefix caching / SGLang RadixAttention rules)."""

from __future__ import annotations

from prefixgate.cache.provider_models import RadixCacheModel
from tests.cache.helpers import wc, words


def _body(*contents: str) -> dict:
    return {"model": "local", "messages": [{"role": "user" if i % 2 == 0 else "assistant",
                                            "content": c} for i, c in enumerate(contents)]}


def test_longest_prefix_reuse_and_last_token_recomputed() -> None:
    m = RadixCacheModel(wc)
    a = words(100, "a")
    assert m.process(_body(a), 0.0).cached_read_tokens == 0
    again = m.process(_body(a), 1.0)
    assert again.cached_read_tokens == again.input_tokens - 1  # the last token is recomputed
    grown = m.process(_body(a, "reply", "more"), 2.0)
    assert grown.cached_read_tokens == 103  # first message (100 words + 3 markup tokens)


def test_page_size_rounds_matches_down() -> None:
    m = RadixCacheModel(wc, page_size=16)
    m.process(_body(words(100, "a")), 0.0)
    out = m.process(_body(words(100, "a"), "x", "y"), 1.0)
    assert out.cached_read_tokens == 96  # 103 matched -> 6 pages of 16


def test_lru_eviction_keeps_capacity_and_evicts_oldest() -> None:
    m = RadixCacheModel(wc, capacity_tokens=250)
    a, b, c = (_body(words(100, t)) for t in "abc")
    m.process(a, 0.0)
    m.process(b, 1.0)
    m.process(a, 2.0)               # a is now more recent than b
    m.process(c, 3.0)               # over capacity: b (least recently used) goes
    assert m.trie.total_tokens <= 250
    assert m.trie.total_tokens == m.trie.stored_tokens()
    assert m.process(a, 4.0).cached_read_tokens == 102
    # b's block is gone: only the shared role markup at its start still matches
    assert m.process(b, 5.0).cached_read_tokens < 10


def _tool(i: int) -> dict:
    return {"type": "function", "function": {"name": f"tool_{i}", "description": words(60, f"t{i}"),
                                             "parameters": {"type": "object"}}}


def test_engine_renders_system_text_before_tools_so_a_system_clock_breaks_before_them() -> None:
    # issue 9: the engine's chat template puts tools after the system text; a volatile clock at
    # the top of the system prompt must not leave the tool list cached (tools-first order did)
    def body(clock: str) -> dict:
        return {"model": "local", "tools": [_tool(i) for i in range(10)], "messages": [
            {"role": "system", "content": f"Now {clock}. " + words(50, "rules")},
            {"role": "user", "content": "hi"}]}

    m = RadixCacheModel(wc)
    m.process(body("10:15"), 0.0)
    out = m.process(body("10:16"), 1.0)
    tools_tokens = 10 * 60
    assert out.input_tokens > tools_tokens
    assert out.cached_read_tokens < 10  # only the system block's few shared leading tokens
    same = m.process(body("10:16"), 2.0)
    assert same.cached_read_tokens == same.input_tokens - 1


def test_anthropic_body_to_an_engine_is_ordered_system_tools_messages_too() -> None:
    def body(clock: str) -> dict:
        return {"model": "local", "system": f"Now {clock}. " + words(50, "rules"),
                "tools": [{"name": f"t{i}", "description": words(60, f"t{i}"),
                           "input_schema": {"type": "object"}} for i in range(5)],
                "messages": [{"role": "user", "content": "hi"}]}

    m = RadixCacheModel(wc)
    m.process(body("10:15"), 0.0)
    assert m.process(body("10:16"), 1.0).cached_read_tokens < 10
