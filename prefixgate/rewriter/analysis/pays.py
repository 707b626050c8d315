"""Does a pass pay? The rule of issue 8 (class 8) for passes that add tokens to a prompt.

A pass that adds tokens to make a longer prefix stable (``hoist_volatile``'s note) pays only when

1. the prefix it protects — everything before the text it adds — is at least the backend's
   minimum cacheable length (:func:`prefixgate.config.cache_rules.min_cacheable_for`): below it the backend
   caches nothing either way, and the added tokens are pure cost (the issue's example: a
   two-message chat grew from 45 to 84 prompt tokens and the answer changed);
2. the tokens it adds do not exceed the tokens it makes reusable (those between the first
   volatile span and the added text, which were re-prefilled on every request before).

Counting stops as soon as the answer is known (:func:`count_upto`), so deciding costs at most
a few thousand tokens of counting however large the prompt: linear, and usually constant.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prefixgate.config.cache_rules import min_cacheable_for
from prefixgate.rewriter.analysis.tokens import TokenCounter
from prefixgate.rewriter.wire.ir import Block, Prompt

CHUNK_CHARS = 1 << 15
"""Texts are counted in slices of this many characters (each counter call is short)."""
OPAQUE_BLOCK_TOKENS = 1_000
"""Tokens assumed for an image / audio / file block (never decoded here)."""

Piece = str | int  # text to count, or a token count already known


@dataclass(frozen=True)
class Verdict:
    """``pays``: run the pass; ``why``: the reason when it does not (for the Edit); ``gain``:
    tokens made reusable as counted (a lower bound: counting stops once the answer is known);
    ``added``: the tokens the pass adds."""

    pays: bool
    why: str = ""
    gain: int = 0
    added: int = 0


def count_upto(pieces: Iterable[Piece], cap: int, count: TokenCounter) -> int:
    """Tokens of ``pieces`` in order, stopping once the total reaches ``cap`` (returns >= cap
    then). Work is bounded by ``cap`` tokens of counting plus one slice."""
    total = 0
    for p in pieces:
        if isinstance(p, int):
            total += p
        else:
            for i in range(0, len(p), CHUNK_CHARS):
                total += count(p[i:i + CHUNK_CHARS])
                if total >= cap:
                    return total
        if total >= cap:
            return total
    return total


def document_text(raw: dict[str, object]) -> str | None:
    """The text an Anthropic ``document`` block with a ``text`` or ``content`` source puts in the
    prompt (title, context and the text itself), or None for any other block (media: counted as
    :data:`OPAQUE_BLOCK_TOKENS`). Source: Anthropic Messages API, document blocks (plain-text
    and custom-content sources are prompt text, not media)."""
    src = raw.get("source") if raw.get("type") == "document" else None
    if not isinstance(src, dict):
        return None
    if src.get("type") == "text" and isinstance(src.get("data"), str):
        inner = [src["data"]]
    elif src.get("type") == "content" and isinstance(src.get("content"), (str, list)):
        content = src["content"]
        inner = [content] if isinstance(content, str) else [
            b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)]
    else:
        return None
    extra = [v for v in (raw.get("title"), raw.get("context")) if isinstance(v, str)]
    return "\n".join(extra + inner)


def block_pieces(blocks: Iterable[Block]) -> Iterator[Piece]:
    """What each block contributes to a prompt's tokens (text, tool input JSON, tool result;
    a media block :data:`OPAQUE_BLOCK_TOKENS`, a text document its text)."""
    for b in blocks:
        if b.is_opaque:
            text = document_text(b.raw)
            yield OPAQUE_BLOCK_TOKENS if text is None else text
        elif b.type == "tool_use":
            fn = b.raw.get("function")
            yield json.dumps(fn if isinstance(fn, dict) else b.raw.get("input"), ensure_ascii=False)
        elif b.type == "tool_result":
            yield b.result_text()
        else:
            yield b.text


def judge(ctx_provider: str, model: str, before: Iterable[Piece], gained: Iterable[Piece],
          added: int, count: TokenCounter) -> Verdict:
    """Whether adding ``added`` tokens pays when ``before`` (already stable) is followed by
    ``gained`` (made reusable by the pass). See the module docstring for the rule."""
    floor = min_cacheable_for(ctx_provider, model)
    gain = count_upto(gained, max(floor, added) + 1, count)
    prefix = gain if gain >= floor else gain + count_upto(before, floor - gain, count)
    if prefix < floor:
        return Verdict(False, f"stable prefix of {prefix} tokens is below the minimum cacheable "
                              f"length of {floor} ({ctx_provider} {model or '?'})")
    if added > gain:
        return Verdict(False, f"adds {added} tokens but makes only {gain} reusable")
    return Verdict(True, gain=gain, added=added)


def tools_piece(prompt: Prompt) -> Iterator[Piece]:
    """The tool definitions as text (they precede the system prompt in the cache prefix)."""
    for t in prompt.tools or ():
        yield json.dumps(t.raw, ensure_ascii=False)
