"""Anthropic prompt-caching rules, each from
https://platform.claude.com/docs/en/build-with-claude/prompt-caching (section named per test)."""

from __future__ import annotations

import pytest

from prefixgate.cache.provider_models import AnthropicCacheModel, CacheRuleError
from prefixgate.cache.savings.cost import price_outcome
from tests.cache.helpers import anthropic_body, text, wc, words


def _model() -> AnthropicCacheModel:
    return AnthropicCacheModel(wc)


def _chat(system_words: int, user: str = "hello there", *, sys_ttl: str | None = "5m",
          last_mark: bool = False, model: str = "claude-sonnet-4-5", **extra: object) -> dict:
    system = [text(words(system_words, "s"), ttl=sys_ttl)] if sys_ttl else words(system_words, "s")
    msgs = [{"role": "user", "content": [text(user, mark=last_mark)]}]
    return anthropic_body(system, msgs, model=model, **extra)


def test_no_cache_control_caches_nothing() -> None:
    # "How prompt caching works": caching is opt-in through cache_control.
    m = _model()
    body = _chat(2000, sys_ttl=None)
    for t in (0.0, 10.0):
        out = m.process(body, t)
        assert out.cached_read_tokens == 0 and out.cache_write_tokens == 0
        assert out.uncached_tokens == out.input_tokens == 2002


def test_write_then_read_reports_anthropic_usage_shape() -> None:
    m = _model()
    first = m.process(_chat(2000, "q one"), 0.0)
    assert first.anthropic_usage() == {"input_tokens": 2, "cache_creation_input_tokens": 2000,
                                       "cache_read_input_tokens": 0}
    second = m.process(_chat(2000, "q two words"), 20.0)
    assert second.anthropic_usage() == {"input_tokens": 3, "cache_creation_input_tokens": 0,
                                        "cache_read_input_tokens": 2000}


@pytest.mark.parametrize("model,floor", [("claude-sonnet-4-5", 1024), ("claude-3-5-haiku", 2048),
                                         ("claude-haiku-4-5", 4096)])
def test_minimum_cacheable_length_by_model(model: str, floor: int) -> None:
    # "Cache limitations": minimum cacheable prompt length per model; shorter is not cached.
    m = _model()
    short = _chat(floor - 10, model=model)
    assert m.process(short, 0.0).cache_write_tokens == 0
    assert m.process(short, 1.0).cached_read_tokens == 0
    long = _chat(floor, model=model)
    assert m.process(long, 2.0).cache_write_tokens == floor
    assert m.process(long, 3.0).cached_read_tokens == floor


def _blocks_body(mark_at: int, n_blocks: int = 40) -> dict:
    blocks = [text(words(10, f"b{i}-")) for i in range(n_blocks)]
    blocks[mark_at] = text(words(10, f"b{mark_at}-"), mark=True)
    return anthropic_body(words(1100, "s"), [{"role": "user", "content": blocks}])


@pytest.mark.parametrize("distance,hit", [(0, True), (5, True), (20, True), (21, False)])
def test_twenty_block_lookback(distance: int, hit: bool) -> None:
    # "Cache limitations": hits are checked at up to 20 block boundaries before a breakpoint.
    m = _model()
    m.process(_blocks_body(5), 0.0)                      # writes the prefix ending at block 5
    out = m.process(_blocks_body(5 + distance), 10.0)    # breakpoint `distance` blocks later
    prefix_at_5 = 1100 + 6 * 10
    assert (out.cached_read_tokens == prefix_at_5) is hit
    if not hit:
        assert out.cached_read_tokens == 0
        assert out.cache_write_tokens == prefix_at_5 + distance * 10


def test_prefix_without_breakpoint_is_never_written() -> None:
    # Writes happen only at breakpoints: a later request cannot hit an unmarked boundary.
    m = _model()
    body = _blocks_body(30)
    m.process(body, 0.0)
    # same blocks, breakpoint earlier (block 3) -> its prefix was never stored
    out = m.process(_blocks_body(3), 5.0)
    assert out.cached_read_tokens == 0


def test_five_minute_ttl_expires_and_hits_refresh_it() -> None:
    # "Cache storage and sharing": 5-minute lifetime, refreshed each time the entry is used.
    m = _model()
    m.process(_chat(1500, "a"), 0.0)
    assert m.process(_chat(1500, "b"), 299.0).cached_read_tokens == 1500
    assert m.process(_chat(1500, "c"), 598.0).cached_read_tokens == 1500  # refreshed at 299
    late = m.process(_chat(1500, "d"), 598.0 + 301.0)
    assert late.cached_read_tokens == 0 and late.cache_write_tokens == 1500


def test_one_hour_ttl_outlives_five_minutes() -> None:
    # "1-hour cache duration": ttl "1h" keeps the entry for an hour.
    m = _model()
    m.process(_chat(1500, "a", sys_ttl="1h"), 0.0)
    assert m.process(_chat(1500, "b", sys_ttl="1h"), 3000.0).cached_read_tokens == 1500
    assert m.process(_chat(1500, "c", sys_ttl="1h"), 3000.0 + 3601.0).cached_read_tokens == 0


def test_one_hour_breakpoint_after_five_minute_one_is_rejected() -> None:
    # "Mixing different TTLs": longer-TTL entries must appear before shorter ones.
    m = _model()
    bad = anthropic_body([text(words(1500, "s"), ttl="5m")],
                         [{"role": "user", "content": [text("hi", ttl="1h")]}])
    with pytest.raises(CacheRuleError):
        m.process(bad, 0.0)
    good = anthropic_body([text(words(1500, "s"), ttl="1h")],
                          [{"role": "user", "content": [text(words(600, "u"), ttl="5m")]}])
    out = m.process(good, 0.0)
    assert out.cache_write_tokens == 2100 and out.cache_write_1h_tokens == 1500


def test_more_than_four_breakpoints_is_rejected() -> None:
    # "Cache limitations": at most 4 cache breakpoints per request.
    blocks = [text(words(300, f"x{i}"), mark=True) for i in range(5)]
    with pytest.raises(CacheRuleError):
        _model().process(anthropic_body(words(10), [{"role": "user", "content": blocks}]), 0.0)


def test_write_premium_pricing_5m_1h_and_reads() -> None:
    # "Pricing": 5m writes 1.25x, 1h writes 2x, reads 0.1x base input (Sonnet 4.5: $3/MTok).
    m = _model()
    body = anthropic_body([text(words(1500, "s"), ttl="1h")],
                          [{"role": "user", "content": [text(words(500, "u"), ttl="5m")]},
                           {"role": "assistant", "content": "ok"},
                           {"role": "user", "content": "tail words"}])
    first = m.process(body, 0.0)
    cost = price_outcome(first, "claude-sonnet-4-5-20250929", output_tokens=100)
    assert first.cache_write_1h_tokens == 1500 and first.cache_write_tokens == 2000
    assert cost.cache_write_usd == pytest.approx((1500 * 6.0 + 500 * 3.75) / 1e6)
    assert cost.uncached_usd == pytest.approx(3 * 3.0 / 1e6)
    assert cost.output_usd == pytest.approx(100 * 15.0 / 1e6)
    second = m.process(body, 10.0)
    assert price_outcome(second, "claude-sonnet-4-5").cached_read_usd == \
        pytest.approx(2000 * 0.30 / 1e6)


def test_tool_choice_change_invalidates_messages_not_system() -> None:
    # "What invalidates the cache": tool_choice changes invalidate message-level entries only.
    m = _model()
    msgs = [{"role": "user", "content": [text(words(400, "u"), mark=True)]}]
    base = anthropic_body([text(words(1500, "s"), mark=True)], msgs)
    m.process(base, 0.0)
    assert m.process(base, 1.0).cached_read_tokens == 1900
    changed = dict(base, tool_choice={"type": "any"})
    assert m.process(changed, 2.0).cached_read_tokens == 1500


def test_automatic_top_level_cache_control_marks_the_last_block() -> None:
    # "Automatic caching": a top-level cache_control puts the breakpoint on the last block.
    m = _model()
    body = anthropic_body(words(1500, "s"), [{"role": "user", "content": "hi"}],
                          cache_control={"type": "ephemeral"})
    assert m.process(body, 0.0).cache_write_tokens == 1501
    grown = anthropic_body(words(1500, "s"), [{"role": "user", "content": "hi"},
                                              {"role": "assistant", "content": "yo"},
                                              {"role": "user", "content": "more"}],
                           cache_control={"type": "ephemeral"})
    out = m.process(grown, 5.0)
    assert out.cached_read_tokens == 1501 and out.cache_write_tokens == 2


def test_caches_are_per_model() -> None:
    m = _model()
    m.process(_chat(1500, model="claude-sonnet-4-5"), 0.0)
    assert m.process(_chat(1500, model="claude-opus-4-1"), 1.0).cached_read_tokens == 0


def test_sweep_drops_only_expired_entries() -> None:
    m = _model()
    m.process(_chat(1500, "a"), 0.0)
    m.process(_chat(1600, "b", sys_ttl="1h"), 0.0)
    assert len(m) == 2
    assert m.sweep(400.0) == 1 and len(m) == 1     # the 5m entry is gone, the 1h one stays
