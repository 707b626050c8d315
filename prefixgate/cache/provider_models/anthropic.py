"""Anthropic prompt caching, modelled from the published rules.

Source: https://platform.claude.com/docs/en/build-with-claude/prompt-caching (read 2026-11-29);
each rule below names the section it comes from.

* **Explicit breakpoints** ("How prompt caching works"): a block with ``cache_control`` marks the
  end of a cacheable prefix. The cache key is the whole prefix in the order tools → system →
  messages up to and including that block. A top-level ``cache_control`` ("Automatic caching")
  places one breakpoint on the last block. At most 4 breakpoints (:class:`CacheRuleError`).
* **Writes happen only at breakpoints**: a prefix that ends at a block boundary with no marker is
  never stored, so a later request cannot hit it.
* **20-block lookback** ("Cache limitations" / "automatic prefix checking"): for each breakpoint
  the system checks the breakpoint's own boundary and up to 20 earlier block boundaries for a
  stored prefix; the longest hit over all breakpoints is read.
* **Minimum cacheable length** (table "Cache limitations", in :mod:`prefixgate.config.cache_rules`): a
  breakpoint whose prefix has fewer tokens is silently not cached.
* **TTL** ("Cache storage and sharing" / "1-hour cache duration"): 5 minutes by default,
  1 hour with ``"ttl": "1h"``; a hit refreshes the entry's lifetime at no cost.
  Breakpoints with a longer TTL must appear before shorter ones ("Mixing different TTLs"),
  otherwise the API rejects the request (:class:`CacheRuleError`).
* **Billing** ("Pricing"): writes cost 1.25× base input (5m) or 2× (1h), reads 0.1×. With mixed
  TTLs, tokens up to the last 1h breakpoint past the read point are 1h writes, the rest of the
  written span 5m writes.
* **Invalidation** ("What invalidates the cache"): changing ``tool_choice`` or the ``thinking``
  parameters invalidates message-level entries but not tools/system; modelled by mixing those
  parameters into the prefix hash where the messages region starts. Caches are per model.

Usage is reported in Anthropic's shape by :meth:`CacheOutcome.anthropic_usage`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from prefixgate.cache.provider_models.base import CacheOutcome, CacheRuleError
from prefixgate.cache.provider_models.prefix_blocks import (
    PrefixBlock,
    TokenCounter,
    anthropic_blocks,
    memo_counter,
)
from prefixgate.config.cache_rules import (
    ANTHROPIC_LOOKBACK_BLOCKS,
    ANTHROPIC_MAX_BREAKPOINTS,
    ANTHROPIC_TTL_S,
    min_cacheable_tokens,
)

#: Expired entries are purged every this many requests (memory bound for long-running proxies).
SWEEP_EVERY = 256


@dataclass
class _Entry:
    ttl: str
    expires_at: float


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _prefix_hashes(body: dict[str, Any], blocks: list[PrefixBlock]) -> list[str]:
    """Cumulative hash after each block; model id seeds it, message-level params join where the
    messages region starts."""
    params = {k: body[k] for k in ("tool_choice", "thinking") if k in body}
    h = _sha("anthropic\x00" + str(body.get("model", "")))
    out: list[str] = []
    params_mixed = False
    for b in blocks:
        if b.region == "messages" and not params_mixed:
            h = _sha(h + json.dumps(params, sort_keys=True))
            params_mixed = True
        h = _sha(h + b.sha256)
        out.append(h)
    return out


def breakpoints(body: dict[str, Any], blocks: list[PrefixBlock]) -> list[tuple[int, str]]:
    """``[(block position, ttl)]`` of the request's breakpoints in prefix order.

    Raises :class:`CacheRuleError` for more than 4 breakpoints or a 1h breakpoint after a 5m one.
    """
    marks = [(i, b.cache_ttl) for i, b in enumerate(blocks) if b.cache_ttl]
    top = body.get("cache_control")
    if isinstance(top, dict) and blocks:
        last = len(blocks) - 1
        ttl = "1h" if top.get("ttl") == "1h" else "5m"
        if not any(i == last for i, _ in marks):
            marks.append((last, ttl))
    if len(marks) > ANTHROPIC_MAX_BREAKPOINTS:
        raise CacheRuleError(
            f"{len(marks)} cache_control breakpoints; Anthropic allows at most "
            f"{ANTHROPIC_MAX_BREAKPOINTS}")
    seen_5m = False
    for _, ttl in marks:
        if ttl == "5m":
            seen_5m = True
        elif seen_5m:
            raise CacheRuleError("a ttl '1h' breakpoint must not come after a '5m' breakpoint")
    return [(i, str(t)) for i, t in marks]


class AnthropicCacheModel:
    """One organization's Anthropic prompt cache (shared by all its sessions).

    ``count_tokens``: text -> tokens (memoized internally); ``min_tokens``: override of the
    per-model minimum cacheable length (tokens), else
    :func:`prefixgate.config.cache_rules.min_cacheable_tokens`.
    """

    provider = "anthropic"

    def __init__(self, count_tokens: TokenCounter, min_tokens: int | None = None,
                 lookback_blocks: int = ANTHROPIC_LOOKBACK_BLOCKS) -> None:
        self._count = memo_counter(count_tokens)
        self._min_tokens = min_tokens
        self._lookback = lookback_blocks
        self._entries: dict[str, _Entry] = {}
        self._requests = 0

    def __len__(self) -> int:
        return len(self._entries)

    def sweep(self, now_s: float) -> int:
        """Forget expired entries (a long-running proxy would otherwise keep them); returns how
        many were dropped. Called every ``SWEEP_EVERY`` requests."""
        dead = [k for k, e in self._entries.items() if now_s >= e.expires_at]
        for k in dead:
            del self._entries[k]
        return len(dead)

    def clone(self) -> AnthropicCacheModel:
        """An independent copy of this organization's cache entries."""
        twin = AnthropicCacheModel(self._count, self._min_tokens, self._lookback)
        twin._entries = {k: _Entry(e.ttl, e.expires_at) for k, e in self._entries.items()}
        twin._requests = self._requests
        return twin

    def _live(self, key: str, now_s: float) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if now_s >= entry.expires_at:
            del self._entries[key]
            return None
        return entry

    def process(self, body: dict[str, Any], now_s: float,
                blocks: list[PrefixBlock] | None = None) -> CacheOutcome:
        """Account one Messages request at ``now_s`` seconds; see the module rules.

        ``blocks``: ``anthropic_blocks(body, ...)`` when the caller already has them. Returns a
        :class:`CacheOutcome` (tokens). Raises :class:`CacheRuleError` like the API.
        """
        if blocks is None:
            blocks = anthropic_blocks(body, self._count)
        self._requests += 1
        if self._requests % SWEEP_EVERY == 0:
            self.sweep(now_s)
        total = sum(b.tokens for b in blocks)
        marks = breakpoints(body, blocks)
        if not marks:
            return CacheOutcome(total, 0, 0, total)
        hashes = _prefix_hashes(body, blocks)
        cum: list[int] = []
        running = 0
        for b in blocks:
            running += b.tokens
            cum.append(running)
        floor = self._min_tokens if self._min_tokens is not None else \
            min_cacheable_tokens(str(body.get("model", "")))

        hit = -1  # block position of the longest live stored prefix
        for pos, _ in marks:
            for j in range(pos, max(-1, pos - self._lookback - 1), -1):
                if j <= hit:
                    break
                if self._live(hashes[j], now_s) is not None:
                    hit = j
                    break
        read = cum[hit] if hit >= 0 else 0
        if hit >= 0:
            entry = self._entries[hashes[hit]]
            entry.expires_at = now_s + ANTHROPIC_TTL_S[entry.ttl]

        write_end = read
        write_1h_end = read
        for pos, ttl in marks:
            if cum[pos] < floor:
                continue
            live = self._live(hashes[pos], now_s)
            if live is None:
                self._entries[hashes[pos]] = _Entry(ttl, now_s + ANTHROPIC_TTL_S[ttl])
            else:
                if ANTHROPIC_TTL_S[ttl] > ANTHROPIC_TTL_S[live.ttl]:
                    live.ttl = ttl
                live.expires_at = max(live.expires_at, now_s + ANTHROPIC_TTL_S[live.ttl])
            if pos > hit:
                write_end = max(write_end, cum[pos])
                if ttl == "1h":
                    write_1h_end = max(write_1h_end, cum[pos])
        write = write_end - read
        write_1h = write_1h_end - read
        return CacheOutcome(input_tokens=total, cached_read_tokens=read, cache_write_tokens=write,
                            uncached_tokens=total - read - write, cache_write_1h_tokens=write_1h)
