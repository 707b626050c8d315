"""Lookback spacing at its boundary: a gap of exactly 21 blocks needs a marker, 20 does not.

Rule (https://platform.claude.com/docs/en/build-with-claude/prompt-caching, read 2026-11-29):
at each breakpoint the API checks at most 20 block boundaries before it
(``config.cache_rules.ANTHROPIC_LOOKBACK_BLOCKS``), so two consecutive breakpoints must be at
most 20 blocks apart for the later one to find the earlier write.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest

import prefixgate.config.cache_rules as rules
from prefixgate.rewriter.passes import breakpoints
from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.validate import cache_markers
from tests.rewriter.helpers import ctx

BIG = "Static instructions about the product and its policies. " * 300  # over the minimum


def _body(turn_blocks: int) -> dict[str, Any]:
    """tools[0] (unit 0), the system text (unit 1), then ``turn_blocks`` one-block turns."""
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"}
            for i in range(turn_blocks)]
    return {"model": "claude-sonnet-4-5", "max_tokens": 8, "system": BIG,
            "tools": [{"name": "calc", "input_schema": {"type": "object"}}], "messages": msgs}


@pytest.mark.parametrize("span", [19, 20, 21, 22])
def test_system_to_newest_turn_gap_is_bridged_exactly_past_the_lookback(span: int) -> None:
    # the tools are below the minimum cacheable length (no T marker): S at unit 1, M at 1 + span
    prompt = wire.parse(_body(span), "anthropic")
    out, edits = breakpoints.run(prompt, ctx("anthropic", model="claude-sonnet-4-5"))
    assert edits[0].applied, edits
    units = [u for u, _, _ in cache_markers(out)]
    assert units[0] == 1 and units[-1] == 1 + span
    assert all(b - a <= rules.ANTHROPIC_LOOKBACK_BLOCKS for a, b in pairwise(units))
    assert len(units) == (2 if span <= rules.ANTHROPIC_LOOKBACK_BLOCKS else 3)
