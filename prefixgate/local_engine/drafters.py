"""Draft proposers for speculative decoding, behind one interface (``Drafter``).

A drafter guesses the next ``k`` tokens of a running request; the target model verifies them in
one forward pass (``spec_decode``). Two model-free drafters live here:

* ``NgramDrafter`` — prompt lookup (Saxena 2023, vLLM's ``ngram``): find the latest earlier
  occurrence of the request's last ``n`` tokens (``n`` from ``max_n`` down to ``min_n``) in its
  prompt + output so far, propose the tokens that followed it. Agent outputs copy ids, arguments
  and code from their inputs, so the continuation is often verbatim.
* ``SuffixDrafter`` — suffix drafting (SuffixDecoding, Oliaro et al. 2024) over the token
  sequences the radix tree has been given for the request's namespace (its ``extra_key``):
  earlier turns, earlier tool results, the same tenant's other sessions. ``SuffixIndex`` is fed by
  ``KVManager.on_insert`` with every sequence inserted into the tree.

Both are deterministic: ``Draft.q`` is None (the verifier treats the draft as a point mass).
``draft_model.DraftModelDrafter`` (a small model sharing the tokenizer) gives ``q``.
Indexes are incremental: each step hashes only the tokens appended since the last one.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import torch

from prefixgate.local_engine.sequence import Sequence


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


class SuffixIndex:
    """Token sequences given to the radix tree, per namespace, with an n-gram index over them.

    ``add(extra_key, doc_id, tokens)``: a request's sequence only grows (prompt, then prompt +
    output), so re-adding the same ``doc_id`` indexes only the new tail. Holds at most
    ``max_tokens`` tokens per namespace, dropping the least recently added documents.
    """

    def __init__(self, min_n: int = 3, max_n: int = 8, max_tokens: int = 1 << 20) -> None:
        self.min_n, self.max_n, self.max_tokens = min_n, max_n, max_tokens
        self._docs: dict[bytes | None, OrderedDict[str, list[int]]] = {}
        self._maps: dict[bytes | None, dict[tuple[int, ...], tuple[str, int]]] = {}
        self._sizes: dict[bytes | None, int] = {}

    def add(self, extra_key: bytes | None, doc_id: str, tokens: list[int]) -> None:
        """Record that ``tokens`` (under ``extra_key``) entered the tree."""
        docs = self._docs.setdefault(extra_key, OrderedDict())
        fmap = self._maps.setdefault(extra_key, {})
        old = docs.pop(doc_id, None)
        start = 0
        if old and tokens[: len(old)] == old:
            start = len(old) - 1  # n-grams ending at old[-1] had no continuation until now
        docs[doc_id] = list(tokens)
        self._sizes[extra_key] = self._sizes.get(extra_key, 0) + len(tokens) - (
            len(old) if old is not None else 0)
        for end in range(max(start, self.min_n - 1), len(tokens) - 1):
            for n in range(self.min_n, min(self.max_n, end + 1) + 1):
                fmap[tuple(tokens[end + 1 - n:end + 1])] = (doc_id, end + 1)
        while self._sizes[extra_key] > self.max_tokens and len(docs) > 1:
            _, dropped = docs.popitem(last=False)
            self._sizes[extra_key] -= len(dropped)  # its map entries go stale, checked on read

    def continuation(self, extra_key: bytes | None, suffix: list[int], k: int,
                     exclude: str | None = None) -> list[int]:
        """Up to ``k`` tokens that followed the longest indexed match of ``suffix``'s end."""
        fmap, docs = self._maps.get(extra_key), self._docs.get(extra_key)
        if not fmap or docs is None:
            return []
        for n in range(min(self.max_n, len(suffix)), self.min_n - 1, -1):
            hit = fmap.get(tuple(suffix[-n:]))
            if hit is None or hit[0] == exclude:
                continue
            doc = docs.get(hit[0])
            if doc is None or doc[hit[1] - n:hit[1]] != suffix[-n:]:
                continue
            out = doc[hit[1]:hit[1] + k]
            if out:
                return out
        return []


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
