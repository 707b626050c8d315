"""Draft proposers for speculative decoding, behind one interface (``Drafter``).

A drafter guesses the next ``k`` tokens of a running request; the target model verifies them in
one forward pass (``spec.decode``). Two model-free drafters live here:

* ``NgramDrafter`` — prompt lookup (Saxena 2023, vLLM's ``ngram``): find the latest earlier
  occurrence of the request's last ``n`` tokens (``n`` from ``max_n`` down to ``min_n``) in its
  prompt + output so far, propose the tokens that followed it. Agent outputs copy ids, arguments
  and code from their inputs, so the continuation is often verbatim.
* ``SuffixDrafter`` — suffix drafting (SuffixDecoding, Oliaro et al. 2024) over the token
  sequences the radix tree has been given for the request's namespace (its ``extra_key``):
  earlier turns, earlier tool results, the same tenant's other sessions. ``SuffixIndex``
  (``suffix_index.py``: held within a byte budget and a namespace cap, LRU) is fed by
  ``KVManager.on_insert`` with every sequence inserted into the tree.

Both are deterministic: ``Draft.q`` is None (the verifier treats the draft as a point mass).
``draft_model.DraftModelDrafter`` (a small model sharing the tokenizer) gives ``q``.
Indexes are incremental: each step hashes only the tokens appended since the last one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from prefixgate.local_engine.sched.sequence import Sequence
from prefixgate.local_engine.spec.suffix_index import SuffixIndex

__all__ = ["ChainDrafter", "Draft", "Drafter", "NgramDrafter", "SuffixDrafter", "SuffixIndex"]


@dataclass
class Draft:
    """``tokens``: the proposed continuation (k ≥ 1 ids). ``q`` ``[k, vocab]`` fp32: the draft
    distribution each token was sampled from (draft models), None for deterministic drafters."""

    tokens: list[int]
    q: torch.Tensor | None = None

    def truncated(self, k: int) -> Draft:
        """The first ``k`` tokens (and rows of ``q``)."""
        if k >= len(self.tokens):
            return self
        return Draft(self.tokens[:k], None if self.q is None else self.q[:k])


class Drafter(Protocol):
    """What the speculative decoder asks of a drafter."""

    name: str

    def propose(self, seq: Sequence, k: int) -> Draft | None:
        """Up to ``k`` tokens to follow ``seq.token_ids``, or None when it has no guess."""
        ...

    def release(self, seq: Sequence) -> None:
        """``seq`` finished: drop any per-request state."""
        ...


class NgramIndex:
    """``n``-gram → position after its latest occurrence, for ``min_n ≤ n ≤ max_n``, over one
    growing token list. ``lookup`` excludes the list's own final n-gram (it would match itself)."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.maps: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_n, max_n + 1)}
        self.indexed = 0  # n-grams ending before this index are in the maps

    def extend(self, ids: list[int], upto: int) -> None:
        """Index every n-gram ending at an index < ``upto`` (exclusive)."""
        for end in range(self.indexed, upto):
            for n, m in self.maps.items():
                if end + 1 >= n:
                    m[tuple(ids[end + 1 - n:end + 1])] = end + 1
        self.indexed = max(self.indexed, upto)

    def lookup(self, suffix: list[int]) -> tuple[int, int] | None:
        """``(n, next_pos)`` of the longest indexed n-gram equal to the end of ``suffix``."""
        for n in range(min(self.max_n, len(suffix)), self.min_n - 1, -1):
            pos = self.maps[n].get(tuple(suffix[-n:]))
            if pos is not None:
                return n, pos
        return None


class NgramDrafter:
    """Prompt lookup over the request's own prompt + output (see module docstring)."""

    name = "ngram"

    def __init__(self, min_n: int = 2, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError("need 1 <= min_n <= max_n")
        self.min_n, self.max_n = min_n, max_n
        self._index: dict[str, NgramIndex] = {}

    def propose(self, seq: Sequence, k: int) -> Draft | None:
        """The ``k`` tokens after the latest earlier match of the request's last n-gram."""
        ids = seq.token_ids
        idx = self._index.get(seq.request_id)
        if idx is None:
            idx = self._index[seq.request_id] = NgramIndex(self.min_n, self.max_n)
        idx.extend(ids, len(ids) - 1)
        hit = idx.lookup(ids)
        if hit is None or k < 1:
            return None
        tokens = ids[hit[1]:hit[1] + k]
        return Draft(tokens) if tokens else None

    def release(self, seq: Sequence) -> None:
        """Forget the request's index."""
        self._index.pop(seq.request_id, None)


class SuffixDrafter:
    """Drafts from ``index`` (sequences the tree holds for the request's namespace)."""

    name = "suffix"

    def __init__(self, index: SuffixIndex) -> None:
        self.index = index

    def propose(self, seq: Sequence, k: int) -> Draft | None:
        """The continuation of the request's suffix in another sequence of its namespace."""
        tail = seq.token_ids[-self.index.max_n:]
        tokens = self.index.continuation(seq.extra_key, tail, k, exclude=seq.request_id)
        return Draft(tokens) if tokens else None

    def release(self, seq: Sequence) -> None:
        """Nothing per request (the index outlives requests)."""


class ChainDrafter:
    """Asks each drafter in turn and keeps the longest proposal (ties: the earlier drafter)."""

    def __init__(self, drafters: list[Drafter]) -> None:
        self.drafters = drafters
        self.name = "+".join(d.name for d in drafters)

    def propose(self, seq: Sequence, k: int) -> Draft | None:
        """The longest of the drafters' proposals, or None."""
        best: Draft | None = None
        for d in self.drafters:
            got = d.propose(seq, k)
            if got is not None and (best is None or len(got.tokens) > len(best.tokens)):
                best = got
                if len(best.tokens) >= k:
                    break
        return best

    def release(self, seq: Sequence) -> None:
        """Release in every drafter."""
        for d in self.drafters:
            d.release(seq)
