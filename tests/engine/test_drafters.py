"""Drafters: n-gram prompt lookup, suffix drafting over the tree's sequences, chaining."""

from __future__ import annotations

import torch

from prefixgate.local_engine.sched.api_types import SamplingParams
from prefixgate.local_engine.sched.sequence import Sequence
from prefixgate.local_engine.spec.drafters import (
    ChainDrafter,
    Draft,
    NgramDrafter,
    SuffixDrafter,
    SuffixIndex,
)


def req(rid: str, ids: list[int], extra_key: bytes | None = None) -> Sequence:
    params = SamplingParams(max_tokens=16, temperature=0.0)
    return Sequence(rid, ids, params, 16, extra_key, torch.Generator(), None,  # type: ignore[arg-type]
                    set(), lambda out: None)


def test_ngram_proposes_what_followed_the_latest_earlier_match() -> None:
    d = NgramDrafter(min_n=2, max_n=3)
    s = req("a", [5, 6, 7, 8, 9, 1, 5, 6, 7, 2, 3, 4, 5, 6])
    got = d.propose(s, 3)
    assert got is not None and got.tokens == [7, 2, 3]  # latest "5 6" is followed by 7 2 3


def test_ngram_prefers_the_longest_match_and_updates_incrementally() -> None:
    d = NgramDrafter(min_n=1, max_n=3)
    s = req("a", [1, 2, 3, 40, 9, 2, 3, 50, 1, 2])
    got = d.propose(s, 2)
    assert got is not None and got.tokens == [3, 40]  # "1 2" (n=2) beats the later "2" alone
    s.token_ids += [3]  # now "1 2 3" matches position 0 → 40 9
    got = d.propose(s, 2)
    assert got is not None and got.tokens == [40, 9]


def test_ngram_without_a_repeat_has_no_draft() -> None:
    d = NgramDrafter(min_n=2, max_n=4)
    assert d.propose(req("a", list(range(100, 130))), 4) is None


def test_suffix_drafts_from_other_sequences_of_the_same_namespace_only() -> None:
    index = SuffixIndex(min_n=3, max_n=6)
    earlier = [10, 11, 12, 13, 14, 15, 16, 17]
    index.add(b"tenant-a", "old", earlier)
    d = SuffixDrafter(index)
    mine = [99, 98, 12, 13, 14]
    got = d.propose(req("new", mine, b"tenant-a"), 3)
    assert got is not None and got.tokens == [15, 16, 17]
    assert d.propose(req("new", mine, b"tenant-b"), 3) is None  # another namespace sees nothing
    assert d.propose(req("new", mine, None), 3) is None


def test_suffix_index_extends_a_growing_document_and_skips_its_own() -> None:
    index = SuffixIndex(min_n=3, max_n=4)
    index.add(None, "r", [1, 2, 3])
    index.add(None, "r", [1, 2, 3, 4, 5])  # the same request, longer: "1 2 3" now continues
    assert index.continuation(None, [7, 1, 2, 3], 2) == [4, 5]
    assert index.continuation(None, [7, 1, 2, 3], 2, exclude="r") == []


def test_suffix_index_drops_oldest_documents_past_its_budget() -> None:
    probe = SuffixIndex(min_n=3, max_n=3)
    probe.add(None, "b", [7, 8, 9, 10, 11, 12])
    index = SuffixIndex(min_n=3, max_n=3, max_bytes=probe.nbytes + 100)  # room for one
    index.add(None, "a", [1, 2, 3, 4, 5, 6])
    index.add(None, "b", [7, 8, 9, 10, 11, 12])
    assert index.continuation(None, [1, 2, 3], 2) == []  # "a" dropped, with its map entries
    assert index.continuation(None, [7, 8, 9], 2) == [10, 11]


class _Fixed:
    def __init__(self, name: str, tokens: list[int]) -> None:
        self.name, self.tokens = name, tokens

    def propose(self, seq: Sequence, k: int) -> Draft | None:
        return Draft(self.tokens[:k]) if self.tokens else None

    def release(self, seq: Sequence) -> None:
        pass


def test_chain_keeps_the_longest_proposal() -> None:
    chain = ChainDrafter([_Fixed("a", [1]), _Fixed("b", [2, 3]), _Fixed("c", [])])
    got = chain.propose(req("x", [0]), 4)
    assert chain.name == "a+b+c" and got is not None and got.tokens == [2, 3]
