"""Flattening wire bodies into the blocks providers hash, in their serialization order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.cache.provider_models.block_trie import BlockTrie
from prefixgate.cache.provider_models.prefix_blocks import (
    anthropic_blocks,
    chain_hashes,
    common_prefix_len,
    detect_api,
    openai_blocks,
)
from tests.cache.helpers import wc

TOOL_A = {"name": "get_weather", "description": "d",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def _anth(system: object, **extra: object) -> dict:
    return {"model": "claude-x", "max_tokens": 8, "tools": [TOOL_A], "system": system,
            "messages": [{"role": "user", "content": "hi there"},
                         {"role": "assistant", "content": [
                             {"type": "text", "text": "calling"},
                             {"type": "tool_use", "id": "t1", "name": "get_weather",
                              "input": {"city": "Oslo"}}]}], **extra}


def test_anthropic_order_is_tools_system_messages_one_block_per_content_block() -> None:
    blocks = anthropic_blocks(_anth("be brief"), wc)
    assert [(b.region, b.index, b.sub, b.kind) for b in blocks] == [
        ("tools", 0, 0, "tool"), ("system", 0, 0, "text"), ("messages", 0, 0, "text"),
        ("messages", 1, 0, "text"), ("messages", 1, 1, "tool_use")]
    assert blocks[2].tokens == 2 and blocks[2].role == "user"


def test_string_and_block_system_hash_alike_and_markers_are_not_hashed() -> None:
    plain = anthropic_blocks(_anth("be brief"), wc)
    listed = anthropic_blocks(_anth([{"type": "text", "text": "be brief",
                                      "cache_control": {"type": "ephemeral", "ttl": "1h"}}]), wc)
    assert [b.sha256 for b in plain] == [b.sha256 for b in listed]
    assert listed[1].cache_ttl == "1h" and plain[1].cache_ttl is None
    assert chain_hashes(plain) == chain_hashes(listed)


def test_schema_key_order_changes_the_hash() -> None:
    # case B04: byte-sensitive caches see a re-keyed schema as a different prompt
    swapped = dict(TOOL_A, input_schema={"properties": TOOL_A["input_schema"]["properties"],
                                         "type": "object"})
    a = anthropic_blocks(_anth("s"), wc)[0]
    b = anthropic_blocks(dict(_anth("s"), tools=[swapped]), wc)[0]
    assert a.sha256 != b.sha256


def test_openai_leading_system_region_and_detect_api() -> None:
    body = {"model": "gpt-4o", "tools": [{"type": "function", "function": {"name": "f"}}],
            "messages": [{"role": "system", "content": "rules"}, {"role": "user", "content": "q"},
                         {"role": "system", "content": "late note"}]}
    blocks = openai_blocks(body, wc)
    assert [(b.region, b.index) for b in blocks] == [("tools", 0), ("system", 0),
                                                     ("messages", 0), ("messages", 1)]
    assert blocks[1].tokens == 1 + 3  # content + per-message markup
    assert detect_api(body) == "openai" and detect_api(_anth("s")) == "anthropic"


@given(st.text(max_size=300), st.text(max_size=300))
def test_common_prefix_len_matches_a_naive_scan(a: str, b: str) -> None:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert common_prefix_len(a, b) == n


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.sampled_from("abcdef"), min_size=1, max_size=6),
                          st.integers(20, 400)), min_size=1, max_size=25))
def test_block_trie_token_count_stays_exact_under_insert_and_evict(
        ops: list[tuple[list[str], int]]) -> None:
    trie = BlockTrie()
    for t, (path, cap) in enumerate(ops):
        body = {"model": "m", "messages": [{"role": "user", "content": " ".join([w] * 10)}
                                           for w in path]}
        blocks = openai_blocks(body, wc)
        trie.insert(blocks, float(t))
        trie.evict_lru(cap, protect=blocks)
        assert trie.total_tokens == trie.stored_tokens()
        assert trie.total_tokens <= max(cap, sum(b.tokens for b in blocks))
