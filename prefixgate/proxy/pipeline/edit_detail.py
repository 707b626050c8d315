"""Where each Edit sits in the prompt, in tokens: for ``x-prefixgate-edit-detail`` and
``prefixgate rewrite``.

Offsets are counted over the blocks a prefix cache hashes, in the API's order
(:func:`prefixgate.cache.provider_models.prefix_blocks.flatten`: Anthropic tools → system →
messages, OpenAI tools → messages), with the rewriter's token counter. ``first_diff`` is the number
of tokens at the start of the body as sent that are the client's own blocks unchanged (None when
nothing changed): the prefix rewriting left as it was. An Edit's ``at`` is where its region starts
in the body as sent.

The header (opt-in: ``rewrite.edit_detail_header: true`` in the policy) is compact JSON with no
prompt text — pass names, regions, token counts and offsets only::

    {"first_diff": 412, "edits": [{"pass": "hoist_volatile", "applied": true,
      "region": "system", "at": 380, "before": 35, "after": 41}], "more": 0}

bounded to :data:`MAX_HEADER_BYTES`: edits that did not apply go first, then the newest ones,
and ``more`` counts those left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from prefixgate.cache.provider_models.prefix_blocks import PrefixBlock, flatten
from prefixgate.rewriter.analysis.tokens import TokenCounter, count_tokens
from prefixgate.rewriter.types import Api, Edit

HEADER = "x-prefixgate-edit-detail"
MAX_HEADER_BYTES = 2048


def blocks_of(body: dict[str, Any], api: Api, count: TokenCounter = count_tokens
              ) -> list[PrefixBlock]:
    """The cacheable blocks of ``body`` (see module docstring); [] for a body the cache
    analysis cannot read."""
    try:
        return flatten(body, api, count)
    except (ValueError, TypeError, AttributeError, KeyError):
        return []


def first_diff(before: Sequence[PrefixBlock], after: Sequence[PrefixBlock]) -> int | None:
    """Tokens of ``after``'s leading blocks equal (same hash) to ``before``'s; None when the two
    block lists are the same."""
    shared = 0
    for a, b in zip(before, after):
        if a.sha256 != b.sha256:
            return shared
        shared += b.tokens
    return None if len(before) == len(after) else shared


def region_starts(blocks: Sequence[PrefixBlock]) -> dict[str, int]:
    """``{region: token offset of its first block}``; a region with no block starts where the
    next one does (or at the end)."""
    starts: dict[str, int] = {}
    offset = 0
    for b in blocks:
        starts.setdefault(b.region, offset)
        offset += b.tokens
    nxt = offset
    for region in ("messages", "system", "tools"):  # backwards: an empty one starts at the next
        nxt = starts.setdefault(region, nxt)
    return starts


def edit_items(edits: Sequence[Edit], starts: dict[str, int]) -> list[dict[str, Any]]:
    """One compact dict per Edit (no prompt text, no ``detail``)."""
    return [{"pass": e.pass_name, "applied": e.applied, "region": e.region,
             "at": starts.get(e.region), "before": e.tokens_before, "after": e.tokens_after}
            for e in edits]


def bounded_json(diff: int | None, items: list[dict[str, Any]],
                 limit: int = MAX_HEADER_BYTES) -> str:
    """The header value: ``{"first_diff", "edits", "more"}`` within ``limit`` bytes (module
    docstring). ASCII only (pass and region names are ASCII; anything else is escaped)."""
    kept = sorted(items, key=lambda d: not d["applied"])  # applied first, order kept
    while True:
        value = orjson.dumps({"first_diff": diff, "edits": kept,
                              "more": len(items) - len(kept)}).decode()
        value = value.encode("ascii", "backslashreplace").decode()
        if len(value) <= limit or not kept:
            return value
        kept = kept[:-1]


def edit_detail_headers(original: dict[str, Any], outcome: Any, api: Api) -> dict[str, str]:
    """``{HEADER: value}`` for one request: ``original`` is the client's body, ``outcome`` the
    :class:`prefixgate.proxy.pipeline.rewrite.RewriteOutcome` (its ``body`` and ``edits``). Never raises for a
    body the cache analysis cannot read (offsets are then null)."""
    before = blocks_of(original, api)
    after = before if outcome.body is original else blocks_of(outcome.body, api)
    diff = first_diff(before, after) if before and after else None
    return {HEADER: bounded_json(diff, edit_items(outcome.edits, region_starts(after)))}
