"""The engine's block hash and the router's recomputation agree, and sha256_cbor is vLLM's
definition (vllm/v1/core/kv_cache_utils.py: ``hash_block_tokens``, ``init_none_hash``)."""

from __future__ import annotations

import hashlib

import cbor2
import pytest

from prefixgate.local_engine.kv import block_hash as engine_hash
from prefixgate.proxy.routing import kv_hash as router_hash

TOKENS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]


@pytest.mark.parametrize("algo,seed", [("sha256", ""), ("sha256", "s1"),
                                       ("sha256_cbor", "vllm-none-hash"), ("sha256_cbor", "0")])
@pytest.mark.parametrize("salt", [None, b"acme"])
def test_router_recomputes_the_engine_hashes(algo: str, seed: str, salt: bytes | None) -> None:
    digests = engine_hash.block_digests(TOKENS, 4, algo, seed, salt)
    assert len(digests) == 2  # 11 tokens: two full blocks, the partial third has no hash
    assert router_hash.digests(TOKENS, 4, algo, seed, salt) == digests
    assert router_hash.wire_hashes(TOKENS, 4, algo, seed, salt) == [
        engine_hash.wire_hash(d) for d in digests]


def test_sha256_cbor_is_vllms_chain() -> None:
    none_hash = hashlib.sha256(cbor2.dumps("vllm-none-hash", canonical=True)).digest()
    h1 = hashlib.sha256(cbor2.dumps((none_hash, (1, 2, 3, 4), None), canonical=True)).digest()
    h2 = hashlib.sha256(cbor2.dumps((h1, (5, 6, 7, 8), None), canonical=True)).digest()
    assert router_hash.digests(TOKENS, 4, "sha256_cbor", "vllm-none-hash") == [h1, h2]
    salted = hashlib.sha256(cbor2.dumps((none_hash, (1, 2, 3, 4), ("acme",)),
                                        canonical=True)).digest()
    assert router_hash.digests(TOKENS[:4], 4, "sha256_cbor", "vllm-none-hash", b"acme") == [salted]


def test_a_hash_names_its_whole_prefix() -> None:
    a = router_hash.wire_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4, "sha256", "")
    b = router_hash.wire_hashes([9, 2, 3, 4, 5, 6, 7, 8], 4, "sha256", "")
    assert a[1] != b[1]  # same second block, different first: different hash
    assert router_hash.wire_hashes([1, 2, 3, 4], 4, "sha256", "", b"t") != a[:1]  # salted apart
    assert router_hash.wire_hashes([1, 2, 3, 4], 4, "sha256", "x") != a[:1]  # seeded apart


def test_wire_forms_normalize_to_one_key() -> None:
    d = router_hash.digests([1, 2, 3, 4], 4, "sha256_cbor", "vllm-none-hash")[0]
    as_int = int.from_bytes(d, "big") & ((1 << 64) - 1)  # vLLM's int form
    assert router_hash.normalize(d) == router_hash.normalize(as_int) == router_hash.wire_hashes(
        [1, 2, 3, 4], 4, "sha256_cbor", "vllm-none-hash")[0]
    assert router_hash.normalize(True) is None and router_hash.normalize("x") is None


def test_unknown_hash_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown KV block hash"):
        router_hash.digests(TOKENS, 4, "xxhash", "")
    with pytest.raises(ValueError, match="unknown KV block hash"):
        engine_hash.block_digests(TOKENS, 4, "xxhash", "")
    with pytest.raises(ValueError, match="out of range"):
        router_hash.digests([-1, 2, 3, 4], 4, "sha256", "")
