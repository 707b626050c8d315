"""Radix tree over token ids whose nodes hold KV-pool slot indices (the prefix cache).

After mini-sglang's ``kvcache/radix_cache.py`` and SGLang's RadixAttention (Zheng et al. 2024):
an edge is a run of token ids, its node holds the slots of those tokens' K/V. A request's prompt
is matched against the tree (``match_prefix``); the matched node is locked (``lock``) for as long
as the request uses those slots, so they cannot be evicted; when the request finishes its
computed tokens are inserted (``insert``) and the lock is dropped (``unlock``). Eviction frees
least-recently-used unlocked leaves first (a heap).

Two counters are exact after every operation (``check`` asserts it):
``evictable_size`` (slots in nodes nobody locks) + ``protected_size`` (slots in locked nodes) ==
total slots held by the tree.

``extra_key`` namespaces the tree: entries inserted under one extra key (e.g. a hash of the
images in the prompt) never match a lookup under another (case B23: the same image placeholder
tokens with different pixels must not share KV). With ``page_size > 1`` keys are matched and
split in whole pages only.

``on_evict`` (optional) is told of every leaf eviction ``(extra_key, path tokens from the root,
depth of the leaf's parent)``: the KV event recorder (:mod:`prefixgate.local_engine.kv.events`)
turns it into ``BlockRemoved``. ``reset`` empties the unlocked tree (``on_reset`` is told).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable
from dataclasses import dataclass


class TreeNode:
    """One edge of the tree: ``key`` token ids, ``value`` their slots (same length)."""

    __slots__ = ("children", "key", "last_access", "parent", "ref_count", "uid", "value")
    _next_uid = 0

    def __init__(self, key: list[int], value: list[int], parent: TreeNode | None) -> None:
        self.key = key
        self.value = value
        self.parent = parent
        self.children: dict[Hashable, TreeNode] = {}
        self.ref_count = 0
        self.last_access = 0
        TreeNode._next_uid += 1
        self.uid = TreeNode._next_uid

    @property
    def is_root(self) -> bool:
        """True for the tree's root (empty key, never evicted)."""
        return self.parent is None


@dataclass(frozen=True)
class CacheHandle:
    """What a request holds of the tree: the deepest matched node and the matched length."""

    node: TreeNode
    cached_len: int


@dataclass(frozen=True)
class MatchResult:
    """``slots``: slots of the matched prefix (``len == handle.cached_len``)."""

    slots: list[int]
    handle: CacheHandle


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    step = 64
    while i + step <= n and a[i:i + step] == b[i:i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _path(node: TreeNode) -> list[int]:
    """The tokens from the root to the end of ``node``'s edge."""
    parts: list[list[int]] = []
    n: TreeNode | None = node
    while n is not None and not n.is_root:
        parts.append(n.key)
        n = n.parent
    return [t for part in reversed(parts) for t in part]


def _nodes(root: TreeNode) -> list[TreeNode]:
    """Every node under ``root`` (root excluded)."""
    out, stack = [], list(root.children.values())
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(n.children.values())
    return out


class RadixCache:
    """Prefix cache over token ids → slot ids, with lock_ref counts and LRU leaf eviction."""

    def __init__(self, page_size: int = 1) -> None:
        self.page_size = page_size
        self._roots: dict[bytes | None, TreeNode] = {}
        self.evictable_size = 0
        self.protected_size = 0
        self._clock = 0
        self.on_evict: Callable[[bytes | None, list[int], int], None] | None = None
        self.on_reset: Callable[[], None] | None = None

    # -- helpers --------------------------------------------------------------------------
    def _child_key(self, tokens: list[int], pos: int) -> Hashable:
        if self.page_size == 1:
            return tokens[pos]
        return tuple(tokens[pos:pos + self.page_size])

    def _root(self, extra_key: bytes | None, create: bool) -> TreeNode | None:
        root = self._roots.get(extra_key)
        if root is None and create:
            root = TreeNode([], [], None)
            root.ref_count = 1  # roots are never evicted and hold no slots
            self._roots[extra_key] = root
        return root

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _split(self, node: TreeNode, at: int) -> TreeNode:
        """Split ``node``'s edge at ``at`` tokens; returns the new upper node."""
        parent = node.parent
        assert parent is not None and 0 < at < len(node.key)
        upper = TreeNode(node.key[:at], node.value[:at], parent)
        upper.ref_count = node.ref_count
        upper.last_access = node.last_access
        node.key, node.value, node.parent = node.key[at:], node.value[at:], upper
        upper.children[self._child_key(node.key, 0)] = node
        parent.children[self._child_key(upper.key, 0)] = upper
        return upper

    def _walk(self, root: TreeNode, tokens: list[int]) -> tuple[TreeNode, int]:
        """Descend along ``tokens`` (page-aligned length), splitting a partially matched edge.

        Returns the deepest node whose path equals ``tokens[:pos]`` and ``pos``.
        """
        node, pos, ps = root, 0, self.page_size
        now = self._tick()
        while pos < len(tokens):
            child = node.children.get(self._child_key(tokens, pos))
            if child is None:
                break
            m = common_prefix_len(child.key, tokens[pos:])
            m -= m % ps
            if m == 0:
                break
            child.last_access = now
            if m < len(child.key):
                child = self._split(child, m)
            node, pos = child, pos + m
            if m < len(child.key):
                break
        return node, pos

    # -- public API -----------------------------------------------------------------------
    def match_prefix(self, tokens: list[int], extra_key: bytes | None = None) -> MatchResult:
        """Longest cached prefix of ``tokens`` (whole pages) under ``extra_key``.

        Callers pass all but the last prompt token, so at least one token is left to compute
        and there are logits to sample from. Does not lock: call ``lock(result.handle)``.
        """
        root = self._root(extra_key, create=True)
        assert root is not None
        usable = len(tokens) - len(tokens) % self.page_size
        node, pos = self._walk(root, tokens[:usable])
        parts: list[list[int]] = []
        n = node
        while not n.is_root:
            parts.append(n.value)
            n = n.parent  # type: ignore[assignment]
        slots = [s for part in reversed(parts) for s in part]
        return MatchResult(slots=slots, handle=CacheHandle(node=node, cached_len=pos))

    def peek_prefix_len(self, tokens: list[int], extra_key: bytes | None = None) -> int:
        """Matched length of ``tokens`` without splitting nodes or touching LRU times."""
        root = self._roots.get(extra_key)
        node, pos, ps = root, 0, self.page_size
        while node is not None and pos < len(tokens):
            child = node.children.get(self._child_key(tokens, pos)) if (
                len(tokens) - pos >= ps) else None
            if child is None:
                break
            m = common_prefix_len(child.key, tokens[pos:])
            m -= m % ps
            pos += m
            if m < len(child.key):
                break
            node = child
        return pos

    def continuations(self, node: TreeNode, max_len: int, max_branches: int,
                      exclude: TreeNode | None = None
                      ) -> list[tuple[list[int], list[int], TreeNode]]:
        """Cached token runs that continue below ``node`` (span reuse looks for a re-alignment).

        For each of ``node``'s children, most recently used first (at most ``max_branches``),
        descends to a leaf by the most recently used child at every level and returns
        ``(tokens, slots, deepest node read)``, at most ``max_len`` tokens each; the child
        ``exclude`` (the caller's own path) is skipped. Reads only:
        no split, no LRU touch. The caller locks ``deepest`` (``lock(CacheHandle(deepest, 0))``)
        while it reads the slots.
        """
        out: list[tuple[list[int], list[int], TreeNode]] = []
        kids = heapq.nlargest(max(0, max_branches), (c for c in node.children.values() if c is not exclude),
                              key=lambda n: (n.last_access, n.uid))  # O(children): the root may hold many
        for child in kids:
            tokens: list[int] = []
            slots: list[int] = []
            n = child
            while True:
                room = max_len - len(tokens)
                tokens += n.key[:room]
                slots += n.value[:room]
                if len(tokens) >= max_len or not n.children:
                    break
                n = max(n.children.values(), key=lambda c: (c.last_access, c.uid))
            out.append((tokens, slots, n))
        return out

    def lock(self, handle: CacheHandle) -> None:
        """Increment lock_ref on the handle's path: its slots become protected from eviction."""
        node: TreeNode | None = handle.node
        while node is not None and not node.is_root:
            if node.ref_count == 0:
                self.evictable_size -= len(node.value)
                self.protected_size += len(node.value)
            node.ref_count += 1
            node = node.parent

    def unlock(self, handle: CacheHandle) -> None:
        """Decrement lock_ref on the handle's path (inverse of ``lock``)."""
        node: TreeNode | None = handle.node
        while node is not None and not node.is_root:
            assert node.ref_count > 0, "unlock of an unlocked node"
            node.ref_count -= 1
            if node.ref_count == 0:
                self.protected_size -= len(node.value)
                self.evictable_size += len(node.value)
            node = node.parent

    def insert(self, tokens: list[int], slots: list[int], extra_key: bytes | None = None) -> int:
        """Insert ``tokens`` (their K/V in ``slots``) and return the length already cached.

        Only the page-aligned part is inserted; the tree takes ownership of
        ``slots[returned:aligned_len]``. The caller still owns ``slots[:returned]`` that are not
        the tree's own (duplicates it computed itself: free them) and ``slots[aligned_len:]``.
        """
        assert len(tokens) == len(slots)
        usable = len(tokens) - len(tokens) % self.page_size
        root = self._root(extra_key, create=True)
        assert root is not None
        node, pos = self._walk(root, tokens[:usable])
        if pos < usable:
            leaf = TreeNode(tokens[pos:usable], slots[pos:usable], node)
            leaf.last_access = self._tick()
            node.children[self._child_key(leaf.key, 0)] = leaf
            self.evictable_size += len(leaf.value)
        return pos

    def evict(self, num_slots: int) -> list[int]:
        """Free at least ``num_slots`` slots (if that many are evictable), LRU leaves first.

        Returns the freed slots (the caller gives them back to the KV pool).
        """
        if num_slots <= 0:
            return []
        heap: list[tuple[int, int, TreeNode, bytes | None]] = []
        for extra, root in self._roots.items():
            stack = [root]
            while stack:
                n = stack.pop()
                if n.children:
                    stack.extend(n.children.values())
                elif not n.is_root and n.ref_count == 0:
                    heap.append((n.last_access, n.uid, n, extra))
        heapq.heapify(heap)
        freed: list[int] = []
        while heap and len(freed) < num_slots:
            _, _, leaf, extra = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            if self.on_evict is not None:
                path = _path(leaf)
                self.on_evict(extra, path, len(path) - len(leaf.key))
            freed.extend(leaf.value)
            self.evictable_size -= len(leaf.value)
            del parent.children[self._child_key(leaf.key, 0)]
            if not parent.is_root and not parent.children and parent.ref_count == 0:
                heapq.heappush(heap, (parent.last_access, parent.uid, parent, extra))
        for k in [k for k, r in self._roots.items() if k is not None and not r.children]:
            del self._roots[k]
        return freed

    def reset(self) -> list[int] | None:
        """Empty the tree when nothing is locked (vLLM's ``reset_prefix_cache``): returns every
        slot it held (the caller frees them) and tells ``on_reset``; None (nothing changed) while
        a request holds a lock."""
        if self.protected_size:
            return None
        slots = [s for root in self._roots.values() for n in _nodes(root) for s in n.value]
        self._roots.clear()
        self.evictable_size = 0
        if self.on_reset is not None:
            self.on_reset()
        return slots

    @property
    def total_size(self) -> int:
        """Slots held by the tree (= evictable + protected)."""
        return self.evictable_size + self.protected_size

    def check(self) -> None:
        """Assert the invariants: counters exact, a locked node's ancestors locked, keys aligned."""
        evictable = protected = 0
        for root in self._roots.values():
            stack = list(root.children.values())
            while stack:
                n = stack.pop()
                assert len(n.key) == len(n.value) and len(n.key) > 0
                assert len(n.key) % self.page_size == 0
                assert n.parent is not None
                if not n.parent.is_root:
                    assert n.parent.ref_count >= n.ref_count
                if n.ref_count > 0:
                    protected += len(n.value)
                else:
                    evictable += len(n.value)
                stack.extend(n.children.values())
        assert evictable == self.evictable_size, (evictable, self.evictable_size)
        assert protected == self.protected_size, (protected, self.protected_size)
