"""The KV cache (engine layer 0): the per-layer K/V pool and its page allocator, the radix tree of
token ids -> KV slots (lock_ref, LRU eviction), block hashes and the KV events it publishes.
Imports no other engine package.
"""

__all__ = ["block_hash", "events", "pool", "publisher", "radix_cache"]
