"""OpenAI automatic prompt caching, modelled from the published rules.

Sources (read 2026-11-29): the guide https://developers.openai.com/api/docs/guides/prompt-caching
("How it works", "Prompt cache retention") and the cookbook
https://developers.openai.com/cookbook/examples/prompt_caching_201 ("1.1 Basics").

* **Automatic, ≥ 1,024 tokens**: prompts shorter than 1,024 tokens are neither read from nor
  written to the cache. Nothing is billed for writes.
* **Longest matching prefix, 128-token increments**: a hit covers the longest stored prefix,
  reported in steps of 128 tokens (1024, 1152, 1280, ...), so ``cached = floor(match/128)*128``
  when ``match >= 1024``, else 0. Matching is token-exact: the first differing block still
  contributes its common prefix (:class:`~prefixgate.cache.provider_models.block_trie.BlockTrie`).
* **Routing**: a request goes to a machine chosen by a hash of the first ~256 tokens combined with
  ``prompt_cache_key``; a cache only helps requests that land on the same machine. More than ~15
  requests per minute for one prefix+key overflow to further machines (modelled: a request goes
  to the first machine of its prefix+key that took fewer than 15 requests in the last 60 s), which
  start cold; a conversation whose turns land on different machines loses its suffix hits.
* **Retention**: in-memory caches are cleared after 5–10 minutes of inactivity and always within
  one hour (modelled: 5 min idle, 1 h max age); ``prompt_cache_retention: "24h"`` keeps prefixes
  up to 24 hours (modelled as a separate, longer-lived store on the same machine).
* **Usage** in OpenAI's shape via :meth:`CacheOutcome.openai_usage`
  (``prompt_tokens_details.cached_tokens``); cached tokens are billed at the model's cached-input
  price (:mod:`prefixgate.config.prices`).

* **Rendered order**: the caching guide says tools and schemas are part of the cached prefix
  but not where they are rendered. OpenAI's published prompt format, harmony
  (https://cookbook.openai.com/articles/openai-harmony, read 2026-12-01: "the developer message
  ... instructions ... and available function tools", rendered as ``# Instructions`` then
  ``# Tools``), puts the system/developer text first, then the tool definitions (and a
  ``response_format`` schema), then the conversation. Blocks are modelled in that order
  (:func:`~prefixgate.cache.provider_models.radix.rendered_order`), so a volatile span in the system text
  breaks the prefix before the tools.
"""

from __future__ import annotations

import hashlib
from collections import deque
from typing import Any

from prefixgate.cache.provider_models.base import CacheOutcome
from prefixgate.cache.provider_models.block_trie import BlockTrie
from prefixgate.cache.provider_models.prefix_blocks import (
    PrefixBlock,
    TokenCounter,
    memo_counter,
    openai_blocks,
)
from prefixgate.cache.provider_models.radix import rendered_order
from prefixgate.config.cache_rules import (
    OPENAI_CACHE_INCREMENT,
    OPENAI_EXTENDED_RETENTION_S,
    OPENAI_IN_MEMORY_IDLE_S,
    OPENAI_IN_MEMORY_MAX_AGE_S,
    OPENAI_MIN_PROMPT_TOKENS,
    OPENAI_OVERFLOW_RPM,
    OPENAI_ROUTING_PREFIX_TOKENS,
)


def cached_tokens_for_match(matched: int, prompt_tokens: int) -> int:
    """Tokens OpenAI reports as cached for a ``matched``-token prefix hit on a
    ``prompt_tokens`` prompt: 0 below 1,024, else the match rounded down to 128."""
    if prompt_tokens < OPENAI_MIN_PROMPT_TOKENS or matched < OPENAI_MIN_PROMPT_TOKENS:
        return 0
    return min(prompt_tokens, (matched // OPENAI_CACHE_INCREMENT) * OPENAI_CACHE_INCREMENT)


def routing_prefix_hash(blocks: list[PrefixBlock], model: str, key: str | None,
                        prefix_tokens: int = OPENAI_ROUTING_PREFIX_TOKENS) -> str:
    """Hash of (model, ``prompt_cache_key``, first ``prefix_tokens`` tokens of the prompt).

    The crossing block contributes the proportional share of its canonical text.
    """
    h = hashlib.sha256()
    h.update(f"{model}\x00{key or ''}\x00".encode())
    seen = 0
    for b in blocks:
        if seen + b.tokens <= prefix_tokens:
            h.update(b.sha256.encode())
            seen += b.tokens
            continue
        need = prefix_tokens - seen
        if b.tokens and b.text:
            cut = (len(b.text) * need) // b.tokens
            h.update(b.text[:cut].encode("utf-8"))
        break
    return h.hexdigest()[:16]


#: Expired prefixes are purged every this many requests.
SWEEP_EVERY = 256


class OpenAICacheModel:
    """One organization's view of OpenAI's prompt caches across machines.

    ``count_tokens``: text -> tokens; ``idle_s`` / ``max_age_s``: in-memory retention;
    ``overflow_rpm``: per prefix+key rate above which requests spill to another machine.
    """

    provider = "openai"

    def __init__(self, count_tokens: TokenCounter, idle_s: float = OPENAI_IN_MEMORY_IDLE_S,
                 max_age_s: float = OPENAI_IN_MEMORY_MAX_AGE_S,
                 overflow_rpm: int = OPENAI_OVERFLOW_RPM) -> None:
        self._count = memo_counter(count_tokens)
        self._idle_s = idle_s
        self._max_age_s = max_age_s
        self._overflow_rpm = overflow_rpm
        self._machines: dict[str, BlockTrie] = {}
        self._recent: dict[str, list[deque[float]]] = {}
        self._requests = 0

    @property
    def machine_count(self) -> int:
        """Number of (routing key, overflow slot, retention) caches created so far."""
        return len(self._machines)

    def sweep(self, now_s: float) -> None:
        """Drop expired prefixes, empty machines and stale rate windows (memory bound for a
        long-running proxy). Called every ``SWEEP_EVERY`` requests."""
        for name in list(self._machines):
            trie = self._machines[name]
            trie.expire_all(now_s)
            if trie.total_tokens == 0:
                del self._machines[name]
        for route in list(self._recent):
            if all(not w or now_s - w[-1] >= 60.0 for w in self._recent[route]):
                del self._recent[route]

    def _slot(self, route: str, now_s: float) -> int:
        """First machine (slot 0, 1, ...) of ``route`` that took fewer than ``overflow_rpm``
        requests in the last 60 s; the request is counted there."""
        slots = self._recent.setdefault(route, [])
        for slot, window in enumerate(slots):
            while window and now_s - window[0] >= 60.0:
                window.popleft()
            if self._overflow_rpm <= 0 or len(window) < self._overflow_rpm:
                window.append(now_s)
                return slot
        slots.append(deque([now_s]))
        return len(slots) - 1

    def _trie(self, machine: str, extended: bool) -> BlockTrie:
        trie = self._machines.get(machine)
        if trie is None:
            if extended:
                trie = BlockTrie(OPENAI_EXTENDED_RETENTION_S, OPENAI_EXTENDED_RETENTION_S)
            else:
                trie = BlockTrie(self._idle_s, self._max_age_s)
            self._machines[machine] = trie
        return trie

    def clone(self) -> OpenAICacheModel:
        """An independent copy of this organization's cache state (machines, rate windows)."""
        twin = OpenAICacheModel(self._count, self._idle_s, self._max_age_s, self._overflow_rpm)
        twin._machines = {k: t.clone() for k, t in self._machines.items()}
        twin._recent = {k: [deque(w) for w in ws] for k, ws in self._recent.items()}
        twin._requests = self._requests
        return twin

    def process(self, body: dict[str, Any], now_s: float,
                blocks: list[PrefixBlock] | None = None) -> CacheOutcome:
        """Account one Chat Completions request at ``now_s`` seconds (see module rules);
        ``blocks``: ``openai_blocks(body, ...)`` when the caller already has them."""
        if blocks is None:
            blocks = openai_blocks(body, self._count)
        blocks = rendered_order(blocks)
        self._requests += 1
        if self._requests % SWEEP_EVERY == 0:
            self.sweep(now_s)
        total = sum(b.tokens for b in blocks)
        key = body.get("prompt_cache_key")
        route = routing_prefix_hash(blocks, str(body.get("model", "")),
                                    key if isinstance(key, str) else None)
        if total < OPENAI_MIN_PROMPT_TOKENS:
            return CacheOutcome(total, 0, 0, total, routing_key=route)
        extended = body.get("prompt_cache_retention") == "24h"
        machine = f"{route}/{self._slot(route, now_s)}/{'24h' if extended else 'mem'}"
        trie = self._trie(machine, extended)
        matched = trie.match(blocks, now_s)
        cached = cached_tokens_for_match(matched.tokens, total)
        trie.insert(blocks, now_s)
        return CacheOutcome(total, cached, 0, total - cached, routing_key=machine)
