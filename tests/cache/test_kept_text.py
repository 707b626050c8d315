"""Long block texts kept compressed (issue 34 item 17): the comparisons give what they gave on
the whole texts, and a break inside a long block is named as before."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.cache.provider_models import kept_text as kt
from prefixgate.cache.provider_models.prefix_blocks import common_prefix_len, flatten
from prefixgate.cache.savings.breaks import BreakDetector
from prefixgate.rewriter.analysis.tokens import count_tokens

BASE = "".join(f"rule {k}: verify the user id first. " for k in range(3_000))  # ~100 K chars


@settings(max_examples=60, deadline=None)
@given(st.integers(0, len(BASE)), st.sampled_from(["", "X", "é", "\ud800"]), st.booleans())
def test_a_kept_text_compares_as_the_whole_text(cut: int, odd: str, short: bool) -> None:
    other = BASE[:cut] + odd + ("" if short else BASE[cut + 1:])
    kept = kt.keep(BASE, "d")
    assert isinstance(kept, kt.PackedText) and kt.text_of(kept) == BASE
    assert kt.common_prefix_with(other, kept) == common_prefix_len(other, BASE)
    assert kt.keep("short text") == "short text"


def test_a_clock_changed_deep_in_a_long_system_prompt_is_still_named() -> None:
    det = BreakDetector()

    def body(clock: str) -> dict[str, object]:
        return {"model": "m", "messages": [
            {"role": "system", "content": BASE + f"\nThe time is 2026-12-06 {clock} UTC.\n" + BASE},
            {"role": "user", "content": "hi"}]}

    assert det.observe("s", body("10:00:00"), count_tokens) is None
    state = det._sessions["s"]
    assert state.blocks[0].text == "" and isinstance(state.texts[0], kt.PackedText)  # kept packed
    rec = det.observe("s", body("10:05:00"), count_tokens)
    assert rec is not None and rec.kind == "volatile_span" and rec.volatile_kinds == ("datetime",)
    blocks = flatten(body("10:05:00"), "openai", count_tokens)
    assert 0 < rec.token_offset < blocks[0].tokens  # the shared part of the block is credited
