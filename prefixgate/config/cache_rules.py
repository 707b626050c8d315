"""Dated provider prompt-caching rules shared by the rewriter (breakpoint placement) and the cache
models (what a provider would cache).

NOTE for the rewriter helper (R): created by the cache helper (C) because this file did not exist
yet when the provider models needed it. It is yours to extend; please keep the names below
(``MIN_CACHEABLE_TOKENS``, ``min_cacheable_tokens``, ``ANTHROPIC_*``, ``OPENAI_*``) since
``prefixgate/cache/provider_models/*`` import them.

Sources (read 2026-11-29):

* Anthropic — https://platform.claude.com/docs/en/build-with-claude/prompt-caching
  "Cache limitations": minimum cacheable prompt length per model; at most 4 breakpoints;
  the system checks for hits at up to 20 block boundaries before each explicit breakpoint;
  TTL 5 minutes (default) or 1 hour (``"ttl": "1h"``), refreshed on every hit; entries with a
  longer TTL must come before entries with a shorter TTL.
* OpenAI — https://developers.openai.com/api/docs/guides/prompt-caching and the cookbook
  https://developers.openai.com/cookbook/examples/prompt_caching_201 : caching is automatic for
  prompts of 1,024 tokens or more, hits come in 128-token increments, requests are routed by a
  hash of the first ~256 tokens combined with ``prompt_cache_key``, more than ~15 requests per
  minute for one prefix+key overflow to other machines, in-memory retention is 5–10 minutes of
  inactivity (always gone within 1 hour), ``prompt_cache_retention: "24h"`` keeps prefixes up to
  24 hours.
"""

from __future__ import annotations

RULES_AS_OF = "2026-11-29"

#: Anthropic minimum cacheable prefix (tokens) by model-id prefix, longest prefix wins.
#: A breakpoint whose prefix is shorter is silently not cached (no error, both cache counters 0).
MIN_CACHEABLE_TOKENS: dict[str, int] = {
    "claude-opus-5": 512,
    "claude-fable-5": 512,
    "claude-mythos-5": 512,
    "claude-opus-4-8": 1024,
    "claude-opus-4-7": 2048,
    "claude-opus-4-6": 4096,
    "claude-opus-4-5": 4096,
    "claude-opus-4-1": 1024,
    "claude-opus-4": 1024,
    "claude-sonnet-5": 1024,
    "claude-sonnet-4-6": 2048,
    "claude-sonnet-4-5": 1024,
    "claude-sonnet-4": 1024,
    "claude-3-7-sonnet": 1024,
    "claude-3-5-sonnet": 1024,
    "claude-3-opus": 1024,
    "claude-haiku-4-5": 4096,
    "claude-3-5-haiku": 2048,
    "claude-3-haiku": 2048,
}
#: Used for an unknown Claude model id (the most common floor).
DEFAULT_MIN_CACHEABLE_TOKENS = 1024

ANTHROPIC_MAX_BREAKPOINTS = 4
ANTHROPIC_LOOKBACK_BLOCKS = 20
ANTHROPIC_TTL_S: dict[str, float] = {"5m": 300.0, "1h": 3600.0}
ANTHROPIC_WRITE_MULTIPLIER: dict[str, float] = {"5m": 1.25, "1h": 2.0}
ANTHROPIC_READ_MULTIPLIER = 0.1

OPENAI_MIN_PROMPT_TOKENS = 1024
OPENAI_CACHE_INCREMENT = 128
OPENAI_ROUTING_PREFIX_TOKENS = 256
OPENAI_OVERFLOW_RPM = 15
#: In-memory retention: cleared after 5–10 min idle; we model the conservative 5 min, and the
#: documented hard limit of 1 hour since the prefix was first cached.
OPENAI_IN_MEMORY_IDLE_S = 300.0
OPENAI_IN_MEMORY_MAX_AGE_S = 3600.0
OPENAI_EXTENDED_RETENTION_S = 24 * 3600.0


def normalize_model_id(model: str) -> str:
    """Lower-case model id without a vendor prefix, with dots as dashes.

    ``"anthropic/claude-sonnet-4.5"`` → ``"claude-sonnet-4-5"``.
    """
    m = model.strip().lower()
    if "/" in m:
        m = m.rsplit("/", 1)[1]
    return m.replace(".", "-")


def min_cacheable_tokens(model: str) -> int:
    """Anthropic minimum cacheable prefix for ``model`` (tokens); longest matching id prefix,
    else :data:`DEFAULT_MIN_CACHEABLE_TOKENS`."""
    m = normalize_model_id(model)
    best = ""
    for prefix in MIN_CACHEABLE_TOKENS:
        if m.startswith(prefix) and len(prefix) > len(best):
            best = prefix
    return MIN_CACHEABLE_TOKENS[best] if best else DEFAULT_MIN_CACHEABLE_TOKENS

#: Anthropic beta that enabled ``"ttl": "1h"`` before it was generally available. The docs read
#: on RULES_AS_OF list ``ttl: "1h"`` with no beta header, so it is not required; the breakpoint
#: planner still reads the request's betas (case B20) and would fall back to 5m if it were.
ANTHROPIC_TTL_1H_BETA = "extended-cache-ttl-2025-04-11"
ANTHROPIC_TTL_1H_REQUIRES_BETA = False

#: Smallest prefix a paged KV engine (our engine, vLLM, SGLang, llama.cpp) can reuse: one KV
#: block of vLLM's default ``block_size`` (16 tokens). Our engine and SGLang page by 1 token, so
#: 16 is the common conservative floor; a prefix shorter than one block is never reused by vLLM.
RADIX_MIN_CACHEABLE_TOKENS = 16


def min_cacheable_for(provider: str, model: str) -> int:
    """Minimum cacheable prefix (tokens) for ``provider`` (``"anthropic" | "openai" | "radix"``
    or any other: a self-hosted paged engine) and ``model``: Anthropic per model
    (:func:`min_cacheable_tokens`), OpenAI :data:`OPENAI_MIN_PROMPT_TOKENS`, else
    :data:`RADIX_MIN_CACHEABLE_TOKENS`. A pass that protects a shorter prefix cannot pay."""
    if provider == "anthropic":
        return min_cacheable_tokens(model)
    if provider == "openai":
        return OPENAI_MIN_PROMPT_TOKENS
    return RADIX_MIN_CACHEABLE_TOKENS
