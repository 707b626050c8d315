"""Block hashes of a prompt's token ids, as the engines publish them in their KV events.

The router's copy of the rule (the proxy never imports the engine; the definition in full is
:mod:`prefixgate.local_engine.kv.block_hash`, and ``tests/kv_events/test_block_hash_agreement.py``
holds the two equal):

- ``sha256`` (our engine's): ``h_0 = sha256(b"prefixgate-kv" + seed)``; block ``i`` (tokens
  ``[i*B, (i+1)*B)``, full blocks only) ``h_i = sha256(h_{i-1} || len(salt) 4 bytes big-endian
  || salt || tokens as 4-byte big-endian ints)``.
- ``sha256_cbor`` (vLLM's, vllm/v1/core/kv_cache_utils.py ``hash_block_tokens``):
  ``NONE_HASH = sha256(cbor(seed))``, ``h_i = sha256(cbor((h_{i-1}, tuple(tokens),
  extra_keys)))``, canonical CBOR, ``extra_keys = (cache_salt,)`` on the first block of a
  salted request, else None (multimodal and LoRA extra keys are not modelled: such requests
  match nothing, which only costs affinity).

:func:`wire_hashes` gives the 64-bit ints events carry (a digest's last 8 bytes, big-endian);
:func:`normalize` maps a hash read off the wire (vLLM sends the 32 bytes unless
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``) to the same int.
"""

from __future__ import annotations

import hashlib
import struct

import cbor2


def _root(algo: str, seed: str) -> bytes:
    if algo == "sha256":
        return hashlib.sha256(b"prefixgate-kv" + seed.encode()).digest()
    if algo == "sha256_cbor":
        return hashlib.sha256(cbor2.dumps(seed, canonical=True)).digest()
    raise ValueError(f"unknown KV block hash {algo!r} (sha256 or sha256_cbor)")


def digests(tokens: list[int], block_size: int, algo: str, seed: str,
            salt: bytes | None = None) -> list[bytes]:
    """32-byte digests of the full blocks of ``tokens`` (module docstring). ValueError for an
    unknown ``algo`` or a token id outside 0 .. 2**32-1."""
    parent = _root(algo, seed)
    out: list[bytes] = []
    for i in range(len(tokens) // block_size):
        block = tokens[i * block_size:(i + 1) * block_size]
        if algo == "sha256":
            key = salt or b""
            try:
                body = struct.pack(f">{len(block)}I", *block)
            except struct.error as e:
                raise ValueError(f"token id out of range: {e}") from None
            parent = hashlib.sha256(parent + len(key).to_bytes(4, "big") + key + body).digest()
        else:
            extra = (salt.decode("utf-8", "surrogateescape"),) if salt and i == 0 else None
            parent = hashlib.sha256(cbor2.dumps((parent, tuple(block), extra),
                                                canonical=True)).digest()
        out.append(parent)
    return out


def normalize(h: object) -> int | None:
    """A wire block hash as the index keys it: an int (masked to 64 bits) or bytes (their last
    8, big-endian); None for anything else."""
    if isinstance(h, bool):
        return None
    if isinstance(h, int):
        return h & ((1 << 64) - 1)
    if isinstance(h, bytes | bytearray) and h:
        return int.from_bytes(bytes(h[-8:]), "big")
    return None


def wire_hashes(tokens: list[int], block_size: int, algo: str, seed: str,
                salt: bytes | None = None) -> list[int]:
    """The index keys of ``tokens``' full blocks, in order."""
    return [int.from_bytes(d[-8:], "big") for d in digests(tokens, block_size, algo, seed, salt)]
