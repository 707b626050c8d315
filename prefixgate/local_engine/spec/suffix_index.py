"""The suffix drafter's index: token sequences given to the radix tree, per namespace, with an
n-gram map over them — held within a byte budget (issue 20, Medium 9: the map grew ~1.2 KB per
token ever seen, 60 → 241 MiB, and kept a namespace per ``cache_salt`` without a cap).

Layout, per namespace (a request's ``extra_key``: its ``cache_salt``, so tenants never draft
from each other):

* documents: ``doc_id`` → the tokens (``array('i')``, 4 bytes a token) in least-recently-used
  order; a request's sequence only grows (prompt, then prompt + output), so re-adding the same
  ``doc_id`` indexes only the new tail.
* the map: ``hash(n-gram)`` → ``(document uid << 32) | end position`` of the latest occurrence,
  for ``min_n ≤ n ≤ max_n``. Keys are hashes, not tuples; a hit is verified against the
  document's tokens before it is used, so a collision only costs a draft.

**Bytes held** (``nbytes``, a tight upper bound): per map, ``sys.getsizeof(dict)`` (its table) +
``ENTRY_BYTES`` per entry (the key int); per document, ``sys.getsizeof`` of its array, its
``doc_id`` string and its record, ``DOC_LINK_BYTES`` for its places in the LRU orders and
``VALUE_BYTES`` per indexed position (the location int its entries share); per namespace, its
record and containers (``sys.getsizeof`` of an OrderedDict counts its nodes too). Object sizes
are rounded up to the allocator's 16-byte blocks. About 0.5 KB a token with n = 3..8 (the
unbounded map held 1.2 KB); ``tests/engine/test_suffix_index_memory.py`` checks the bound against
tracemalloc.

**Eviction**: after each ``add``, while ``nbytes > max_bytes``, the least recently used document
of any namespace goes, and with it every map entry that still points to it (the map never holds
an entry for a document it dropped: no stale growth). Adding to a new namespace when
``max_namespaces`` are held first drops the least recently used namespace whole. "Used" is an
``add`` or a lookup that drafted from it, so the namespaces and documents in use keep drafting
as they would with no bound.
"""

from __future__ import annotations

import sys
from array import array
from collections import OrderedDict

__all__ = ["SuffixIndex"]

# Object sizes as CPython's allocator holds them (sys.getsizeof rounded up to its 16-byte blocks):
ENTRY_BYTES = 48       # a map entry's key: a 64-bit hash is a 3-digit int (36 bytes; 28-32 if small)
VALUE_BYTES = 32       # a location int, shared by the n-gram entries that end at one position
DOC_LINK_BYTES = 96    # a document's uid int (32) and its key tuple in the global LRU order (64)
POS_BITS = 32          # a location is (uid << 32) | position; documents are < 2^32 tokens


def _held(n: int) -> int:
    """``n`` bytes as the allocator holds them (16-byte blocks)."""
    return -(-n // 16) * 16


class _Doc:
    __slots__ = ("doc_id", "key", "tokens", "uid")

    def __init__(self, key: bytes | None, doc_id: str, uid: int) -> None:
        self.key, self.doc_id, self.uid = key, doc_id, uid
        self.tokens = array("i")

    def nbytes(self, min_n: int) -> int:
        """Its record, id, tokens and LRU links, and the location ints of its indexed positions
        (one per position, shared by that position's entries; an upper bound, as a location
        whose entries were all overwritten is freed)."""
        return _held(sys.getsizeof(self)) + _held(sys.getsizeof(self.doc_id)) + \
            sys.getsizeof(self.tokens) + DOC_LINK_BYTES + VALUE_BYTES * max(0, len(self.tokens) - min_n)


class _Space:
    """One namespace: its documents (LRU order), their uids, its map."""

    __slots__ = ("by_uid", "docs", "map", "peak")

    def __init__(self) -> None:
        self.docs: OrderedDict[str, _Doc] = OrderedDict()
        self.by_uid: dict[int, _Doc] = {}
        self.map: dict[int, int] = {}
        self.peak = 0  # most map entries since the tables were last sized

    def compact(self) -> None:
        """Rebuild the containers at their current size once the map has halved: a dict never
        shrinks its table on deletion, so evicting would otherwise free entries, not bytes."""
        if len(self.map) * 2 <= self.peak:  # comprehensions: dict(d) may keep d's table size
            self.map = {k: v for k, v in self.map.items()}
            self.by_uid = {k: v for k, v in self.by_uid.items()}
            self.docs = OrderedDict(list(self.docs.items()))
            self.peak = len(self.map)

    def nbytes(self) -> int:
        """Its record, containers (tables and OrderedDict nodes) and map keys."""
        return sys.getsizeof(self) + sys.getsizeof(self.docs) + sys.getsizeof(self.by_uid) + \
            sys.getsizeof(self.map) + ENTRY_BYTES * len(self.map)


class SuffixIndex:
    """Per-namespace documents + n-gram map within ``max_bytes`` and ``max_namespaces`` (module
    docstring). Engine thread only."""

    def __init__(self, min_n: int = 3, max_n: int = 8, max_bytes: int = 64 << 20,
                 max_namespaces: int = 256) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError("need 1 <= min_n <= max_n")
        if max_bytes < 1 or max_namespaces < 1:
            raise ValueError("max_bytes and max_namespaces must be >= 1")
        self.min_n, self.max_n = min_n, max_n
        self.max_bytes, self.max_namespaces = max_bytes, max_namespaces
        self._spaces: OrderedDict[bytes | None, _Space] = OrderedDict()
        self._lru: OrderedDict[tuple[bytes | None, str], None] = OrderedDict()  # all documents
        self._lru_peak = 0
        self._uid = 0
        self._doc_bytes = 0    # sum of _Doc.nbytes()
        self._space_bytes = 0  # sum of _Space.nbytes()
        self.evicted_docs = 0
        self.evicted_namespaces = 0

    # -- accounting ------------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Bytes held (module docstring), ``sys.getsizeof`` of the containers included."""
        return self._doc_bytes + self._space_bytes + sys.getsizeof(self._spaces) + \
            sys.getsizeof(self._lru)

    @property
    def num_namespaces(self) -> int:
        """Namespaces held."""
        return len(self._spaces)

    def num_tokens(self, extra_key: bytes | None = None) -> int:
        """Tokens held in ``extra_key``'s documents."""
        sp = self._spaces.get(extra_key)
        return sum(len(d.tokens) for d in sp.docs.values()) if sp else 0

    # -- writing ---------------------------------------------------------------------------------
    def _space(self, key: bytes | None) -> _Space:
        sp = self._spaces.get(key)
        if sp is None:
            while len(self._spaces) >= self.max_namespaces:
                self._drop_space(next(iter(self._spaces)))
            sp = self._spaces[key] = _Space()
            self._space_bytes += sp.nbytes()
        else:
            self._spaces.move_to_end(key)
        return sp

    def _drop_space(self, key: bytes | None) -> None:
        sp = self._spaces.pop(key)
        for doc in sp.docs.values():
            self._doc_bytes -= doc.nbytes(self.min_n)
            del self._lru[(key, doc.doc_id)]
        self._space_bytes -= sp.nbytes()
        self.evicted_namespaces += 1
        self.evicted_docs += len(sp.docs)

    def _index(self, sp: _Space, doc: _Doc, start: int) -> None:
        """Map every n-gram of ``doc`` ending at an index in [start, len - 1) (the last token
        has no continuation yet)."""
        toks = doc.tokens.tolist()
        base = doc.uid << POS_BITS
        m = sp.map
        for end in range(max(start, self.min_n - 1), len(toks) - 1):
            loc = base | (end + 1)
            for n in range(self.min_n, min(self.max_n, end + 1) + 1):
                m[hash(tuple(toks[end + 1 - n:end + 1]))] = loc

    def _unindex(self, sp: _Space, doc: _Doc) -> None:
        """Delete the map entries that point into ``doc``."""
        toks = doc.tokens.tolist()
        base = doc.uid << POS_BITS
        m = sp.map
        for end in range(self.min_n - 1, len(toks) - 1):
            loc = base | (end + 1)
            for n in range(self.min_n, min(self.max_n, end + 1) + 1):
                h = hash(tuple(toks[end + 1 - n:end + 1]))
                if m.get(h) == loc:
                    del m[h]

    def _remove(self, sp: _Space, doc: _Doc) -> None:
        self._unindex(sp, doc)
        del sp.docs[doc.doc_id]
        del sp.by_uid[doc.uid]
        del self._lru[(doc.key, doc.doc_id)]
        self._doc_bytes -= doc.nbytes(self.min_n)

    def add(self, extra_key: bytes | None, doc_id: str, tokens: list[int]) -> None:
        """Record that ``tokens`` (under ``extra_key``) entered the tree, then evict to the
        budget (module docstring)."""
        if len(tokens) >= 1 << POS_BITS:
            return
        sp = self._space(extra_key)
        before = sp.nbytes()
        doc = sp.docs.get(doc_id)
        start = 0
        if doc is not None and len(tokens) >= len(doc.tokens) and \
                tokens[: len(doc.tokens)] == doc.tokens.tolist():
            start = max(len(doc.tokens) - 1, 0)  # n-grams ending at its old last token: new
            self._doc_bytes -= doc.nbytes(self.min_n)
            doc.tokens.extend(tokens[len(doc.tokens):])
            sp.docs.move_to_end(doc_id)
            self._lru.move_to_end((extra_key, doc_id))
        else:
            if doc is not None:  # not an extension: forget the old text first
                self._remove(sp, doc)
            self._uid += 1
            doc = _Doc(extra_key, doc_id, self._uid)
            doc.tokens.extend(tokens)
            sp.docs[doc_id] = doc
            sp.by_uid[doc.uid] = doc
            self._lru[(extra_key, doc_id)] = None
            self._lru_peak = max(self._lru_peak, len(self._lru))
        self._index(sp, doc, start)
        sp.peak = max(sp.peak, len(sp.map))
        self._doc_bytes += doc.nbytes(self.min_n)
        self._space_bytes += sp.nbytes() - before
        self._evict()

    def _evict(self) -> None:
        while self.nbytes > self.max_bytes and self._lru:
            key, doc_id = next(iter(self._lru))
            sp = self._spaces[key]
            before = sp.nbytes()
            self._remove(sp, sp.docs[doc_id])
            sp.compact()
            self._space_bytes += sp.nbytes() - before
            self.evicted_docs += 1
            if not sp.docs:
                self._spaces.pop(key)
                self._space_bytes -= sp.nbytes()
            if len(self._lru) * 2 <= self._lru_peak:  # the same for the global containers
                self._lru = OrderedDict(list(self._lru.items()))
                self._spaces = OrderedDict(list(self._spaces.items()))
                self._lru_peak = len(self._lru)

    # -- reading ---------------------------------------------------------------------------------
    def continuation(self, extra_key: bytes | None, suffix: list[int], k: int,
                     exclude: str | None = None) -> list[int]:
        """Up to ``k`` tokens that followed the longest indexed match (``max_n`` down to
        ``min_n`` tokens) of ``suffix``'s end in another document (not ``exclude``) of the
        namespace; [] when none."""
        sp = self._spaces.get(extra_key)
        if sp is None or k < 1:
            return []
        for n in range(min(self.max_n, len(suffix)), self.min_n - 1, -1):
            gram = suffix[-n:]
            loc = sp.map.get(hash(tuple(gram)))
            if loc is None:
                continue
            doc = sp.by_uid.get(loc >> POS_BITS)
            pos = loc & ((1 << POS_BITS) - 1)
            if doc is None or doc.doc_id == exclude or doc.tokens[pos - n:pos].tolist() != gram:
                continue
            out = doc.tokens[pos:pos + k].tolist()
            if out:
                self._spaces.move_to_end(extra_key)
                sp.docs.move_to_end(doc.doc_id)
                self._lru.move_to_end((extra_key, doc.doc_id))
                return out
        return []
