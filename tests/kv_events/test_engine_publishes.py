"""Our engine (tiny random model, real scheduler and radix tree) publishes its KV events when
asked to, and a router stream rebuilds exactly its cached prefix; off by default."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from prefixgate.config.routing import KVEventsSettings
from prefixgate.local_engine.engine import Engine, EngineConfig, SamplingParams
from prefixgate.proxy.routing.kv_events import KVEventStream
from prefixgate.proxy.routing.kv_hash import wire_hashes
from tests.kv_events.helpers import endpoints, until
from tests.tiny_model import make_tiny_model_dir


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny_kv_events"))


@pytest.mark.slow
def test_publishing_is_off_by_default(tiny_dir: Path) -> None:
    eng = Engine(EngineConfig(model_path=str(tiny_dir), num_kv_slots=512, max_context_len=256))
    try:
        assert eng.kv_events is None and eng.cache is not None and eng.cache.on_evict is None
    finally:
        eng.shutdown()


@pytest.mark.slow  # loads transformers (its import alone takes long on a busy box)
@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
async def test_router_index_follows_the_engine(tiny_dir: Path, algo: str) -> None:
    pub, rep = endpoints()
    seed = "vllm-none-hash" if algo == "sha256_cbor" else ""
    eng = Engine(EngineConfig(model_path=str(tiny_dir), num_kv_slots=512, max_context_len=256,
                              kv_events_endpoint=pub, kv_events_replay=rep,
                              kv_events_block_size=8, kv_events_hash=algo, kv_events_seed=seed))
    s = KVEventStream("e0", KVEventsSettings(endpoint=pub, replay=rep, block_size=8, hash=algo),
                      probe_s=0.2)
    task = asyncio.create_task(s.run())
    try:
        await until(lambda: s.synced)
        prompt = list(range(1000, 1040))
        async for _ in eng.generate(prompt, SamplingParams(max_tokens=3, temperature=0)):
            pass
        assert eng.cache is not None
        cached = eng.cache.peek_prefix_len(prompt + [7] * 8)
        hashes = wire_hashes(prompt + [7] * 8, 8, algo, seed)
        await until(lambda: s.index.prefix_blocks(hashes) == cached // 8)
        assert cached >= 40  # the prompt (and what was decoded) went into the tree
        assert await asyncio.to_thread(eng.reset_prefix_cache)
        await until(lambda: len(s.index) == 0)
        assert eng.cache.total_size == 0 and eng.pool.free_slots == eng.pool.num_slots
    finally:
        task.cancel()
        eng.shutdown()
