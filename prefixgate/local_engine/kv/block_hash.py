"""Block hashes of a token sequence, as the engine publishes them in its KV events.

A router recomputes them from the prompt's token ids alone (no engine state), so the two forms
are defined here in full; ``prefixgate/proxy/routing/kv_hash.py`` is the router's own copy (the
proxy never imports the engine) and ``tests/kv_events/test_block_hash_agreement.py`` holds them
equal.

Blocks: ``tokens[i*B:(i+1)*B]`` for every *full* block (``B`` = ``block_size``; a partial last
block has no hash). Hashes are chained: block ``i``'s hash covers its parent's hash, so one hash
names the whole prefix up to the end of its block (vLLM's prefix-caching design, "Automatic
Prefix Caching", vLLM docs).

- ``sha256`` (ours): ``h_0 = sha256(b"prefixgate-kv" + seed)``, then for each block
  ``h_i = sha256(h_{i-1} || len(extra_key) as 4 bytes big-endian || extra_key || tokens as
  4-byte big-endian unsigned ints)``; ``extra_key`` (the request's ``cache_salt`` bytes, empty
  without one) goes into every block.
- ``sha256_cbor`` (vLLM's ``--prefix-caching-hash-algo sha256_cbor``, vllm/v1/core/
  kv_cache_utils.py ``hash_block_tokens`` and ``init_none_hash``): ``NONE_HASH =
  sha256(cbor(seed))`` with ``seed`` = ``PYTHONHASHSEED`` or ``"vllm-none-hash"``, then
  ``h_i = sha256(cbor((h_{i-1}, tuple(tokens), extra_keys)))`` with canonical CBOR; the first
  block's ``extra_keys`` is ``(cache_salt,)`` when the request has one, else None.

On the wire a hash is a 64-bit unsigned int: the digest's last 8 bytes, big-endian (vLLM's
``maybe_convert_block_hash`` with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable

HashFn = Callable[[bytes, list[int], bytes | None, bool], bytes]

VLLM_DEFAULT_SEED = "vllm-none-hash"


def _sha256_block(parent: bytes, tokens: list[int], extra: bytes | None, first: bool) -> bytes:
    key = extra or b""
    body = struct.pack(f">{len(tokens)}I", *tokens)
    return hashlib.sha256(parent + len(key).to_bytes(4, "big") + key + body).digest()


def _cbor_block(parent: bytes, tokens: list[int], extra: bytes | None, first: bool) -> bytes:
    import cbor2

    extra_keys = (extra.decode("utf-8", "surrogateescape"),) if extra and first else None
    return hashlib.sha256(cbor2.dumps((parent, tuple(tokens), extra_keys), canonical=True)).digest()


def root_hash(algo: str, seed: str) -> bytes:
    """The parent hash of a sequence's first block (``h_0`` / ``NONE_HASH``). ValueError for an
    unknown ``algo``."""
    if algo == "sha256":
        return hashlib.sha256(b"prefixgate-kv" + seed.encode()).digest()
    if algo == "sha256_cbor":
        import cbor2

        return hashlib.sha256(cbor2.dumps(seed, canonical=True)).digest()
    raise ValueError(f"unknown KV block hash {algo!r} (sha256 or sha256_cbor)")


def block_fn(algo: str) -> HashFn:
    """The per-block hash of ``algo`` (``(parent, tokens, extra_key, first) -> digest``)."""
    root_hash(algo, "")  # validates the name
    return _sha256_block if algo == "sha256" else _cbor_block


def block_digests(tokens: list[int], block_size: int, algo: str, seed: str,
                  extra_key: bytes | None = None) -> list[bytes]:
    """32-byte digests of every full block of ``tokens``, in order (module docstring)."""
    fn, parent = block_fn(algo), root_hash(algo, seed)
    out: list[bytes] = []
    for i in range(len(tokens) // block_size):
        parent = fn(parent, tokens[i * block_size:(i + 1) * block_size], extra_key, i == 0)
        out.append(parent)
    return out


def wire_hash(digest: bytes) -> int:
    """The 64-bit int a digest is published as (its last 8 bytes, big-endian)."""
    return int.from_bytes(digest[-8:], "big")
