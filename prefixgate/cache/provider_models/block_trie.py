"""A prefix tree over prompt blocks: longest-prefix match with a partial last block, idle expiry
and LRU eviction by token capacity. Shared by the OpenAI and radix models.

Each node is one :class:`~prefixgate.cache.provider_models.prefix_blocks.PrefixBlock` (keyed by its
sha256) and stores the block's canonical text (compressed when long,
:mod:`~prefixgate.cache.provider_models.kept_text`), its tokens and its last-access time. A match
walks full blocks, then credits the common character prefix of the first differing block against
the stored sibling that shares most
(:func:`~prefixgate.cache.provider_models.prefix_blocks.partial_tokens`), like a token radix tree
splitting a node. Siblings are not split on insert, so two children sharing a partial prefix both
count their full tokens against the capacity (a small overestimate of memory, never of hits).

Invariant (asserted by tests): ``total_tokens`` equals the sum of ``tokens`` over live nodes.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from prefixgate.cache.provider_models.kept_text import Kept, keep, partial_tokens_kept
from prefixgate.cache.provider_models.prefix_blocks import PrefixBlock


@dataclass(eq=False)
class _Node:
    key: str
    text: Kept  # a long text compressed (kept_text)
    tokens: int
    parent: _Node | None
    created: float
    last_access: float
    children: dict[str, _Node] = field(default_factory=dict)


@dataclass(frozen=True)
class TrieMatch:
    """Result of :meth:`BlockTrie.match`: ``full_blocks`` blocks matched whole, covering
    ``full_tokens`` tokens; ``partial_tokens`` more from the first differing block."""

    full_blocks: int
    full_tokens: int
    partial_tokens: int

    @property
    def tokens(self) -> int:
        """All matched tokens."""
        return self.full_tokens + self.partial_tokens


class BlockTrie:
    """Block-prefix tree. ``idle_s``: a node unused that long is gone; ``max_age_s``: a node
    older than that is gone (OpenAI's 1-hour ceiling); both ``None`` = no expiry."""

    def __init__(self, idle_s: float | None = None, max_age_s: float | None = None) -> None:
        self._root = _Node("", "", 0, None, 0.0, 0.0)
        self.idle_s = idle_s
        self.max_age_s = max_age_s
        self.total_tokens = 0
        self._tick = itertools.count()

    def _expired(self, node: _Node, now_s: float) -> bool:
        if self.idle_s is not None and now_s - node.last_access > self.idle_s:
            return True
        return self.max_age_s is not None and now_s - node.created > self.max_age_s

    def _drop(self, node: _Node) -> None:
        stack = [node]
        while stack:
            n = stack.pop()
            self.total_tokens -= n.tokens
            stack.extend(n.children.values())
        if node.parent is not None:
            del node.parent.children[node.key]

    def _child(self, node: _Node, key: str, now_s: float) -> _Node | None:
        child = node.children.get(key)
        if child is not None and self._expired(child, now_s):
            self._drop(child)
            return None
        return child

    def match(self, blocks: Sequence[PrefixBlock], now_s: float, touch: bool = True) -> TrieMatch:
        """Longest stored prefix of ``blocks``; refreshes last-access of matched nodes when
        ``touch``. Expired nodes met on the way are removed."""
        node = self._root
        tokens = 0
        n = 0
        for b in blocks:
            child = self._child(node, b.sha256, now_s)
            if child is None:
                break
            if touch:
                child.last_access = now_s
            node = child
            tokens += b.tokens
            n += 1
        partial = 0
        if n < len(blocks):
            block = blocks[n]
            for key in list(node.children):
                sib = self._child(node, key, now_s)
                if sib is not None:
                    partial = max(partial, partial_tokens_kept(block, sib.text))
        return TrieMatch(n, tokens, partial)

    def insert(self, blocks: Sequence[PrefixBlock], now_s: float) -> int:
        """Store the whole prefix ``blocks``; returns tokens newly stored."""
        node = self._root
        added = 0
        for b in blocks:
            child = self._child(node, b.sha256, now_s)
            if child is None:
                child = _Node(b.sha256, keep(b.text, b.sha256), b.tokens, node, now_s, now_s)
                node.children[b.sha256] = child
                self.total_tokens += b.tokens
                added += b.tokens
            child.last_access = now_s
            node = child
        return added

    def evict_lru(self, capacity_tokens: int, protect: Sequence[PrefixBlock] = ()) -> int:
        """Evict least-recently-used leaves until ``total_tokens <= capacity_tokens``; nodes on
        the path ``protect`` (the request in flight, like a lock_ref) are kept. Returns tokens
        evicted."""
        if self.total_tokens <= capacity_tokens:
            return 0
        locked: set[int] = set()
        node = self._root
        for b in protect:
            node_next = node.children.get(b.sha256)
            if node_next is None:
                break
            locked.add(id(node_next))
            node = node_next
        heap: list[tuple[float, int, _Node]] = []
        stack = list(self._root.children.values())
        while stack:
            n = stack.pop()
            if n.children:
                stack.extend(n.children.values())
            elif id(n) not in locked:
                heap.append((n.last_access, next(self._tick), n))
        heapq.heapify(heap)
        evicted = 0
        while heap and self.total_tokens > capacity_tokens:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            self._drop(leaf)
            evicted += leaf.tokens
            if parent is not None and parent is not self._root and not parent.children \
                    and id(parent) not in locked:
                heapq.heappush(heap, (parent.last_access, next(self._tick), parent))
        return evicted

    def expire_all(self, now_s: float) -> int:
        """Remove every expired node (lazy expiry only sees walked paths); returns tokens
        removed. A child is never fresher than its parent, so whole subtrees go at once."""
        before = self.total_tokens
        stack = [self._root]
        while stack:
            node = stack.pop()
            for child in list(node.children.values()):
                if self._expired(child, now_s):
                    self._drop(child)
                else:
                    stack.append(child)
        return before - self.total_tokens

    def clone(self) -> BlockTrie:
        """An independent copy (same nodes, times and totals), built iteratively: a trie is as
        deep as a prompt has blocks, too deep for ``copy.deepcopy``'s recursion."""
        twin = BlockTrie(self.idle_s, self.max_age_s)
        twin.total_tokens = self.total_tokens
        stack = [(self._root, twin._root)]
        while stack:
            src, dst = stack.pop()
            for key, c in src.children.items():
                n = _Node(c.key, c.text, c.tokens, dst, c.created, c.last_access)
                dst.children[key] = n
                stack.append((c, n))
        return twin

    def node_count(self) -> int:
        """Number of stored nodes (root excluded)."""
        count = 0
        stack = list(self._root.children.values())
        while stack:
            n = stack.pop()
            count += 1
            stack.extend(n.children.values())
        return count

    def stored_tokens(self) -> int:
        """Recount of stored tokens (for invariant checks; equals ``total_tokens``)."""
        total = 0
        stack = list(self._root.children.values())
        while stack:
            n = stack.pop()
            total += n.tokens
            stack.extend(n.children.values())
        return total
