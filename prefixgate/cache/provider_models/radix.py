"""Radix prefix cache of a self-hosted engine (vLLM automatic prefix caching, SGLang
RadixAttention, our ``local_engine``): longest token-prefix match, LRU eviction by capacity.

Rules (sources: SGLang paper "Efficiently Programming LLMs using SGLang", RadixAttention §3;
vLLM docs "Automatic Prefix Caching", https://docs.vllm.ai/en/latest/design/prefix_caching.html):

* A request reuses the KV of the longest prefix already in the tree; the match is token-exact
  (modelled per block with a partial first differing block) and rounded down to ``page_size``
  (vLLM hashes full 16-token blocks; SGLang's page size is 1 by default).
* At least one prompt token is always recomputed (the engine needs logits for the last position),
  so ``cached <= prompt_tokens - 1``.
* After the request the whole prompt stays in the tree; when the tree holds more than
  ``capacity_tokens``, least-recently-used leaves are evicted (unlocked leaves only; the request
  in flight is protected).
* No TTL, no minimum length, no write premium: ``cache_write_tokens`` is always 0.

Block order is the engine's rendered order, **system text → tools → messages**, whatever the API
of the body (detected): chat templates put the tool definitions after the system text, in the
system turn (Hermes / Qwen2.5 function-calling format, ``prefixgate/local_engine/server/chat.py``;
Llama 3.1 and Qwen templates likewise), not before it as Anthropic's cache key does. A volatile clock in the
system text therefore breaks the prefix before the tools (issue 9: modelling tools first credited
the whole tool list as cached). When the engine can tokenize the request itself, the proxy uses
:mod:`prefixgate.cache.provider_models.token_radix` over its real token ids instead of this approximation.
"""

from __future__ import annotations

from typing import Any

from prefixgate.cache.provider_models.base import CacheOutcome
from prefixgate.cache.provider_models.block_trie import BlockTrie
from prefixgate.cache.provider_models.prefix_blocks import (
    PrefixBlock,
    TokenCounter,
    detect_api,
    flatten,
    memo_counter,
)

#: Rank of each region in a chat template's rendered prompt (see module docstring; OpenAI's
#: harmony format renders the same order, :mod:`prefixgate.cache.provider_models.openai`).
RENDERED_REGION_ORDER = {"system": 0, "tools": 1, "messages": 2}


def rendered_order(blocks: list[PrefixBlock]) -> list[PrefixBlock]:
    """``blocks`` in a chat template's rendered order: system → tools → messages (stable inside
    each region)."""
    return sorted(blocks, key=lambda b: RENDERED_REGION_ORDER[b.region])


class RadixCacheModel:
    """Engine prefix cache. ``capacity_tokens``: KV pool size in tokens; ``page_size``: tokens
    per KV page (matches are rounded down to it)."""

    provider = "radix"

    def __init__(self, count_tokens: TokenCounter, capacity_tokens: int = 1_000_000,
                 page_size: int = 1) -> None:
        if capacity_tokens <= 0 or page_size <= 0:
            raise ValueError("capacity_tokens and page_size must be positive")
        self._count = memo_counter(count_tokens)
        self.capacity_tokens = capacity_tokens
        self.page_size = page_size
        self.trie = BlockTrie()

    def clone(self) -> RadixCacheModel:
        """An independent copy of this cache's state (:meth:`BlockTrie.clone`)."""
        twin = RadixCacheModel(self._count, self.capacity_tokens, self.page_size)
        twin.trie = self.trie.clone()
        return twin

    def process(self, body: dict[str, Any], now_s: float,
                blocks: list[PrefixBlock] | None = None) -> CacheOutcome:
        """Account one request at ``now_s`` seconds; returns reads / uncached tokens.
        ``blocks``: the body's flattened blocks (in any region order) when the caller already
        has them."""
        if blocks is None:
            blocks = flatten(body, detect_api(body), self._count)
        blocks = rendered_order(blocks)
        total = sum(b.tokens for b in blocks)
        matched = self.trie.match(blocks, now_s).tokens
        cached = (min(matched, max(0, total - 1)) // self.page_size) * self.page_size
        self.trie.insert(blocks, now_s)
        self.trie.evict_lru(self.capacity_tokens, protect=blocks)
        return CacheOutcome(total, cached, 0, total - cached)
