"""The suffix drafter's index stays within its byte budget and namespace cap (issue 20, Medium 9:
its n-gram map grew ~1.2 KB per token ever seen, 60 → 241 MiB, with a namespace per
``cache_salt`` and no cap).

``nbytes`` is checked against what tracemalloc sees the index allocate (an upper bound, within
25 %), so "under the budget" means bytes held. Cases: many tokens in one namespace, many salts
(the issue's two), and ones it does not name — a document rewritten (not extended) under the same
id, one document larger than the whole budget, and eviction never leaving map entries behind.
Drafting for the most recent namespace stays what an unbounded index gives.
"""

from __future__ import annotations

import asyncio
import gc
import random
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from prefixgate.local_engine.sched.api_types import SamplingParams
from prefixgate.local_engine.spec.suffix_index import SuffixIndex

BUDGET = 2 << 20  # bytes
UNBOUNDED = {"max_bytes": 1 << 40, "max_namespaces": 1 << 30}


def _docs(n: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(49152) for _ in range(length)] for _ in range(n)]


def _measured(build: Callable[[], SuffixIndex]) -> tuple[SuffixIndex, int]:
    """The index ``build`` returns and the bytes tracemalloc saw it keep."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        index = build()
        gc.collect()
        return index, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def _feed(index: SuffixIndex, docs: list[list[int]], salts: int = 1, tag: str = "") -> SuffixIndex:
    for i, doc in enumerate(docs):  # each request: its prompt, then prompt + output
        key = f"tenant-{i % salts}".encode()
        index.add(key, f"{tag}{i:032x}", doc[: len(doc) // 2])
        index.add(key, f"{tag}{i:032x}", doc)
        assert index.nbytes <= index.max_bytes
    return index


@pytest.mark.parametrize("n,length,salts", [(120, 400, 1), (120, 400, 7), (1500, 24, 1500)],
                         ids=["many-tokens", "many-tokens-7-salts", "many-salts"])
def test_many_tokens_or_salts_stay_under_the_budget(n: int, length: int, salts: int) -> None:
    docs = _docs(n, length)  # 48k tokens: ~25 MB unbounded, 12x the budget; or 1500 salts
    index, held = _measured(lambda: _feed(SuffixIndex(max_bytes=BUDGET, max_namespaces=64),
                                          docs, salts))
    assert index.nbytes <= BUDGET and held <= BUDGET
    assert held <= index.nbytes <= 1.25 * held  # accounting is an upper bound, and tight
    assert index.num_namespaces <= 64 and index.evicted_docs > 0
    if salts > 64:
        assert index.evicted_namespaces > 0 and index.num_namespaces == 64


def test_the_accounting_tracks_an_unbounded_index_too() -> None:
    docs = _docs(60, 300)
    index, held = _measured(lambda: _feed(SuffixIndex(**UNBOUNDED), docs, salts=7))
    assert held <= index.nbytes <= 1.25 * held
    assert index.nbytes / (60 * 300) < 700  # bytes a token (the old map: ~1200)


def test_the_most_recent_namespace_drafts_as_if_unbounded() -> None:
    """A tenant in use (adding and drafting each round) keeps drafting exactly as an unbounded
    index would, while other tenants' traffic fills and overflows the budget."""
    old, recent = _docs(100, 400, seed=1), _docs(4, 400, seed=2)
    probes = [doc[s - 8:s] for doc in recent for s in range(8, 400, 37)]
    bounded = SuffixIndex(max_bytes=BUDGET, max_namespaces=16)
    free = SuffixIndex(**UNBOUNDED)
    _feed(bounded, old, salts=50)
    for i, doc in enumerate(recent):
        bounded.add(b"recent", f"r{i}", doc)
        free.add(b"recent", f"r{i}", doc)
        _feed(bounded, _docs(5, 400, seed=10 + i), salts=5, tag=f"round{i}-")  # others arrive
        assert [bounded.continuation(b"recent", p, 4) for p in probes] == \
            [free.continuation(b"recent", p, 4) for p in probes]
    assert all(free.continuation(b"recent", p, 4) for p in probes)
    assert bounded.evicted_docs > 100  # the budget did bite meanwhile


def test_eviction_leaves_no_map_entries_behind() -> None:
    docs = _docs(40, 200, seed=3)
    index = _feed(SuffixIndex(max_bytes=BUDGET // 4), docs)
    kept = [d.tokens.tolist() for sp in index._spaces.values() for d in sp.docs.values()]
    assert 2 <= len(kept) < 40
    fresh = SuffixIndex(**UNBOUNDED)
    for i, toks in enumerate(kept):
        fresh.add(b"tenant-0", str(i), toks)
    assert sum(len(sp.map) for sp in index._spaces.values()) == len(fresh._spaces[b"tenant-0"].map)


def test_a_rewritten_document_does_not_leak_its_old_text() -> None:
    index = SuffixIndex(**UNBOUNDED)
    a, b = _docs(2, 300, seed=4)
    index.add(None, "r", a)
    size = index.nbytes
    index.add(None, "r", b)  # same id, not an extension of a
    assert index.continuation(None, a[:20], 3) == [] and index.continuation(None, b[:20], 3)
    assert index.nbytes <= size * 1.05


def test_a_document_larger_than_the_budget_is_not_held() -> None:
    index = SuffixIndex(max_bytes=64 << 10)
    index.add(None, "small", _docs(1, 20)[0])
    index.add(None, "huge", _docs(1, 5000, seed=5)[0])  # ~2.5 MB indexed
    assert index.nbytes <= 64 << 10


def test_the_engine_bounds_its_suffix_index(make_engine: Any) -> None:
    """Through the engine: long prompts, then 20 ``cache_salt`` namespaces (the tree's inserts
    feed the index); the stats and /metrics read the bound back."""
    eng = make_engine(speculative="suffix", spec_suffix_max_bytes=256 << 10,
                      spec_suffix_max_namespaces=8)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)

    async def run(prompt: list[int], salt: bytes | None) -> None:
        async for _ in eng.generate(prompt, params, extra_key=salt):
            pass

    for i, prompt in enumerate(_docs(12, 300, seed=6)):
        asyncio.run(run(prompt, None))
        assert eng.stats()["spec_suffix_index_bytes"] <= 256 << 10, i
    for j, prompt in enumerate(_docs(20, 40, seed=7)):
        asyncio.run(run(prompt, f"salt-{j}".encode()))
    st = eng.stats()
    assert st["spec_suffix_namespaces"] <= 8 and st["spec_suffix_index_bytes"] <= 256 << 10
    assert st["spec_suffix_evicted_docs"] > 0
