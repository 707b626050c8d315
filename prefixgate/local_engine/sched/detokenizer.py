"""Incremental detokenization with stop strings.

Text is decoded a window at a time (as vLLM's ``detokenize_incrementally``): the window starts a
few tokens back, so that tokenizers which drop a leading space or merge bytes across tokens still
give the right delta, and a delta ending in U+FFFD (an incomplete UTF-8 sequence) is held until
the next token completes it.

Stop strings (OpenAI ``stop``): the completion ends at the first occurrence and the stop text is
not emitted. Text that could be the beginning of a stop string is held back until it is known
not to be one.
"""

from __future__ import annotations

from typing import Any

CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas, cutting at stop strings.

    ``prompt_ids``: the last few are used as decoding context only (never emitted).
    """

    def __init__(self, tokenizer: Any, prompt_ids: list[int], stop: list[str]) -> None:
        self.tok = tokenizer
        self.ids: list[int] = list(prompt_ids[-CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""      # completion text decoded so far (cut at a stop string)
        self.emitted = 0    # chars of ``text`` already handed out
        self.stop = [s for s in stop if s]
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids, skip_special_tokens=True))

    def _advance(self, final: bool) -> None:
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        new = self._decode(self.ids[self.prefix_offset:])
        if len(new) > len(prefix) and (final or not new.endswith("\ufffd")):
            self.text += new[len(prefix):]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)

    def add(self, token_id: int) -> bool:
        """Append a sampled token (not a stop/EOS token). Returns True when a stop string hit."""
        if self.stopped:
            return True
        self.ids.append(token_id)
        searched_from = max(0, len(self.text) - max((len(s) for s in self.stop), default=0))
        self._advance(final=False)
        return self._find_stop(searched_from)

    def _find_stop(self, start: int) -> bool:
        best = -1
        for s in self.stop:
            i = self.text.find(s, max(0, start - len(s)))
            if i != -1 and (best == -1 or i < best):
                best = i
        if best != -1:
            self.text = self.text[:best]
            self.emitted = min(self.emitted, best)
            self.stopped = True
        return self.stopped

    def _held_back(self) -> int:
        """Chars at the end of ``text`` that might start a stop string."""
        hold = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), hold, -1):
                if self.text.endswith(s[:k]):
                    hold = k
                    break
        return hold

    def take(self, final: bool = False) -> str:
        """Text not yet handed out; with ``final`` the held-back tail is flushed too."""
        if final and not self.stopped:
            self._advance(final=True)
            self._find_stop(max(0, self.emitted))
        end = len(self.text) if (final or self.stopped) else len(self.text) - self._held_back()
        if end <= self.emitted:
            return ""
        out = self.text[self.emitted:end]
        self.emitted = end
        return out
