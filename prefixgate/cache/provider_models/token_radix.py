"""The counterfactual of a radix-cache engine over the engine's own token ids.

When the backend can render a request itself (``POST /tokenize``, vLLM's endpoint and our engine's),
the counterfactual needs no approximation of the chat template: the client's original request is
tokenized by the backend, and its ids go through an imitation of the engine's radix tree. The rules
are the engine's (``prefixgate/local_engine/sched/scheduler.py``, same as SGLang's RadixAttention
and vLLM's automatic prefix caching):

* A request is matched on all but its last token (the engine must compute one token to get
  logits), so ``cached = match(ids[:-1])``, rounded down to ``page_size`` (vLLM hashes full
  16-token blocks; SGLang and our engine default to pages of 1).
* Its whole prompt then stays in the tree; when the tree holds more than ``capacity_tokens``,
  least-recently-used leaves go first (the request just inserted is kept, like a lock_ref).
* The engine also keeps the tokens it generated; the counterfactual does not (it never sees
  them), so an answer that the next turn repeats verbatim is a hit the model misses. Agent
  traces replay their own recorded answers, which differ from a fresh generation after a few
  tokens, so the difference is small.

:class:`TokenCaches` keeps one tree per key, and a key is one REAL cache: the proxy uses the
engine's partition (deployment, the tenant where the backend salts by tenant, and the request's
``cache_salt``; :func:`prefixgate.proxy.observe.insight.partition_key`), never the session. An
engine's radix tree is shared by every request it serves, so a prefix another conversation
left there (the same system prompt and tools) is a hit the client's own body would have had
too, and is not a saving of rewriting (DESIGN.md, *Savings, measured honestly*; issue 19, item
3). Memory is bounded: per key ``capacity_tokens`` (the engine's KV pool; LRU leaves evicted
beyond it, as the engine does), at most ``max_keys`` keys and ``total_tokens`` ids in all (least
recently used keys dropped whole). Ids are stored as ``array('i')`` (4 bytes each). No I/O, no
time source: recency is a counter.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from prefixgate.cache.provider_models.base import CacheOutcome

#: Defaults: one engine's tree holds up to 1M ids (the radix block model's default KV size,
#: :class:`prefixgate.cache.provider_models.radix.RadixCacheModel`; an engine with a smaller pool
#: evicts sooner, so the counterfactual credits the client's body with more hits than it had:
#: savings err low, never high); 256 partitions and 4M ids in all (16 MB).
CACHE_CAPACITY_TOKENS = 1_000_000
MAX_KEYS = 256
TOTAL_TOKENS = 4_000_000


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences of the same type (binary search
    over slice comparisons, done in C for ``array`` and ``list``)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(eq=False)
class _Node:
    key: array  # type: ignore[type-arg]
    parent: _Node | None
    last_access: int
    children: dict[int, _Node] = field(default_factory=dict)


class TokenRadix:
    """A radix tree of token-id sequences with LRU eviction of leaves.

    ``capacity_tokens``: most ids kept (> 0). ``total_tokens`` is exact after every call
    (:meth:`check` recounts it).
    """

    def __init__(self, capacity_tokens: int = CACHE_CAPACITY_TOKENS) -> None:
        if capacity_tokens <= 0:
            raise ValueError("capacity_tokens must be positive")
        self.capacity_tokens = capacity_tokens
        self.total_tokens = 0
        self._clock = itertools.count(1)
        self._root = _Node(array("i"), None, 0)

    def match(self, ids: Sequence[int]) -> int:
        """Length of the longest stored prefix of ``ids``; touches the matched nodes."""
        key = array("i", ids)
        node, pos, now = self._root, 0, next(self._clock)
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                break
            n = common_prefix(child.key, key[pos:pos + len(child.key)])
            child.last_access = now
            pos += n
            if n < len(child.key):
                break
            node = child
        return pos

    def _split(self, node: _Node, at: int) -> _Node:
        """Cut ``node``'s key at ``at``; returns the new upper node (the path's end at ``at``)."""
        assert node.parent is not None and 0 < at < len(node.key)
        upper = _Node(node.key[:at], node.parent, node.last_access)
        node.parent.children[node.key[0]] = upper
        node.key = node.key[at:]
        node.parent = upper
        upper.children[node.key[0]] = node
        return upper

    def insert(self, ids: Sequence[int]) -> int:
        """Store ``ids`` whole, then evict LRU leaves down to capacity (the path of ``ids``
        kept). Returns the ids newly stored."""
        key = array("i", ids)
        node, pos, now = self._root, 0, next(self._clock)
        path: set[int] = set()
        added = 0
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                leaf = _Node(key[pos:], node, now)
                node.children[key[pos]] = leaf
                added = len(leaf.key)
                self.total_tokens += added
                path.add(id(leaf))
                break
            n = common_prefix(child.key, key[pos:pos + len(child.key)])
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            path.add(id(child))
            node, pos = child, pos + n
        self._evict(path)
        return added

    def _evict(self, keep: set[int]) -> None:
        if self.total_tokens <= self.capacity_tokens:
            return
        tick = itertools.count()
        heap: list[tuple[int, int, _Node]] = []
        stack = list(self._root.children.values())
        while stack:
            n = stack.pop()
            if n.children:
                stack.extend(n.children.values())
            elif id(n) not in keep:
                heap.append((n.last_access, next(tick), n))
        heapq.heapify(heap)
        while heap and self.total_tokens > self.capacity_tokens:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            self.total_tokens -= len(leaf.key)
            if parent is not self._root and not parent.children and id(parent) not in keep:
                heapq.heappush(heap, (parent.last_access, next(tick), parent))

    def check(self) -> None:
        """Assert the invariants: ``total_tokens`` equals the stored ids; every child is keyed
        by its first id, non-empty, and points back to its parent."""
        total = 0
        stack = [self._root]
        while stack:
            node = stack.pop()
            for first, child in node.children.items():
                assert len(child.key) > 0 and child.key[0] == first and child.parent is node
                total += len(child.key)
                stack.append(child)
        assert total == self.total_tokens, (total, self.total_tokens)


def engine_cached_tokens(tree: TokenRadix, ids: Sequence[int], page_size: int = 1) -> int:
    """Cached tokens the engine would report for prompt ``ids`` against ``tree`` (match on all
    but the last id, rounded down to ``page_size``); touches the matched path, stores nothing."""
    if page_size <= 0:
        raise ValueError("page_size must be positive")
    matched = tree.match(ids[:-1]) if len(ids) > 1 else 0
    return (matched // page_size) * page_size


def salt_id(salt: str) -> int:
    """A negative pseudo token id for ``salt`` (token ids are >= 0, so it never equals one);
    31 bits of its sha256, so it fits ``array('i')``."""
    return -1 - (int(hashlib.sha256(salt.encode("utf-8", "surrogatepass")).hexdigest()[:8], 16)
                 & 0x3FFFFFFF)


class TokenCaches:
    """One :class:`TokenRadix` per key, a key per real cache (see module docstring for the
    keys and the bounds)."""

    def __init__(self, capacity_tokens: int = CACHE_CAPACITY_TOKENS, max_keys: int = MAX_KEYS,
                 total_tokens: int = TOTAL_TOKENS, page_size: int = 1) -> None:
        if max_keys <= 0 or total_tokens <= 0:
            raise ValueError("max_keys and total_tokens must be positive")
        self.capacity_tokens = capacity_tokens
        self.max_keys = max_keys
        self.total_cap = total_tokens
        self.page_size = page_size
        self._trees: OrderedDict[str, TokenRadix] = OrderedDict()

    def __len__(self) -> int:
        return len(self._trees)

    def stored_tokens(self) -> int:
        """Ids held over all keys."""
        return sum(t.total_tokens for t in self._trees.values())

    def process(self, key: str, ids: Sequence[int], salt: str = "") -> CacheOutcome:
        """Account prompt ``ids`` of one request under ``key``: cached tokens by the engine's
        rule, then the prompt is stored. Returns a :class:`CacheOutcome` (no cache writes).

        ``salt``: the request's ``cache_salt`` as the backend receives it. Engines that take one
        (ours: ``local_engine.radix_cache`` ``extra_key``; vLLM >= 0.9: the salt in the first
        block's hash) never share a prefix across salts but keep every salt in the same KV
        pool, so the ids go into the key's one tree behind a pseudo id of the salt
        (:func:`salt_id`, never a real id): prefixes of different salts diverge at the root and
        share the capacity. The pseudo id is not counted in the outcome."""
        tree = self._trees.get(key)
        if tree is None:
            tree = self._trees[key] = TokenRadix(self.capacity_tokens)
        self._trees.move_to_end(key)
        if salt:
            keyed = [salt_id(salt), *ids]
            matched = max(0, tree.match(keyed[:-1]) - 1) if len(ids) > 1 else 0
            cached = matched // self.page_size * self.page_size
            tree.insert(keyed)
        else:
            cached = engine_cached_tokens(tree, ids, self.page_size)
            tree.insert(ids)
        while len(self._trees) > self.max_keys or (
                len(self._trees) > 1 and self.stored_tokens() > self.total_cap):
            self._trees.popitem(last=False)
        total = len(ids)
        return CacheOutcome(total, cached, 0, total - cached)
