"""A huge KV-event batch never holds the proxy's event loop (issue 34 item 10): a 10 MB batch of
2 M hashes took the loop 2.15 s in one decode and one apply. Now it is read in the KV-event
thread (:func:`read_batch_off_loop`, from 64 KiB) and applied in slices of ``SLICE_HASHES`` with
the loop turning between them; and the streaming read gives the index exactly what a whole
decode gave it (same blocks, order and counters), bad events included."""

from __future__ import annotations

import asyncio
import random
import threading
from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.config.routing import KVEventsSettings
from prefixgate.proxy.routing.kv_events import KVEventStream
from prefixgate.proxy.routing.kv_index import BlockIndex

SLICE_HASHES = 4096  # kv_batch.SLICE_HASHES (checked below)


def _stream() -> KVEventStream:
    return KVEventStream("d0", KVEventsSettings(endpoint="tcp://127.0.0.1:9", block_size=4))


def _huge(n: int) -> tuple[list[int], bytes]:
    hashes = random.Random(0).sample(range(1, 1 << 62), n)
    return hashes, msgpack.packb([1.0, [["BlockStored", hashes, None, [], 16, None, "GPU"]]])


async def _turns_while_handled(s: KVEventStream, payload: bytes) -> int:
    """How often another task on the loop ran while ``s`` handled ``payload``."""
    turns = 0
    done = asyncio.Event()

    async def other_requests() -> None:  # stands for the loop's other work
        nonlocal turns
        while not done.is_set():
            turns += 1
            await asyncio.sleep(0)
    task = asyncio.create_task(other_requests())
    await asyncio.sleep(0)
    start = turns
    await s.handle(1, payload)
    done.set()
    await task
    return turns - start


def test_a_huge_batch_lets_the_loop_run_while_it_is_read_and_applied() -> None:
    n = 40 * SLICE_HASHES
    hashes, payload = _huge(n)
    s = _stream()
    turns = asyncio.run(_turns_while_handled(s, payload))
    assert turns >= n // SLICE_HASHES  # the loop turned between the slices (it was 0)
    assert len(s.index) == n and list(s.index.blocks)[:3] == hashes[:3]
    assert (s.seq.last, s.batches, s.index.stored) == (1, 1, n)


def test_a_large_payload_is_read_in_the_kv_events_thread_and_a_small_one_at_once() -> None:
    from prefixgate.proxy.routing import kv_batch

    assert kv_batch.SLICE_HASHES == SLICE_HASHES
    readers: list[str] = []
    real = kv_batch.read_batch

    def spy(p: bytes) -> Any:
        readers.append(threading.current_thread().name)
        return real(p)

    _, big = _huge(2 * SLICE_HASHES)
    assert len(big) >= kv_batch.OFF_LOOP_BYTES
    small = msgpack.packb([1.0, [["BlockStored", [1, 2]]]])
    kv_batch.read_batch = spy  # type: ignore[assignment]
    try:
        for p in (big, small):
            assert asyncio.run(kv_batch.read_batch_off_loop(p)) is not None
    finally:
        kv_batch.read_batch = real  # type: ignore[assignment]
    assert readers[0].startswith("kv-events") and readers[1] == threading.main_thread().name


HASH = st.one_of(st.integers(0, 40), st.binary(min_size=1, max_size=9), st.none(), st.booleans(),
                 st.text(max_size=2))
EVENT = st.one_of(
    st.tuples(st.just("BlockStored"), st.lists(HASH, max_size=6)).map(list),
    st.tuples(st.just("BlockStored"), st.lists(HASH, max_size=6), st.none(), st.lists(st.integers(0, 9)),
              st.just(16), st.none(), st.just("GPU")).map(list),
    st.tuples(st.just("BlockRemoved"), st.lists(HASH, max_size=6), st.just("GPU")).map(list),
    st.just(["AllBlocksCleared"]), st.just([]), st.just(["BlockStored"]), st.just(["BlockStored", 5]),
    st.just(["Nope", [1]]), st.just([7, [1]]), st.just({"BlockStored": [1]}), st.just("AllBlocksCleared"))


@settings(max_examples=300, deadline=None)
@given(st.lists(EVENT, max_size=12), st.lists(EVENT, max_size=12), st.integers(1, 5), st.integers(2, 30))
def test_the_streaming_read_applies_what_a_whole_decode_applied(
        first: list[Any], second: list[Any], slice_n: int, max_blocks: int) -> None:
    from prefixgate.proxy.routing.kv_batch import read_batch

    whole, sliced = BlockIndex(max_blocks=max_blocks), BlockIndex(max_blocks=max_blocks)
    for events in (first, second):
        payload = msgpack.packb([0.5, events])
        whole.apply_all(msgpack.unpackb(payload, raw=False, strict_map_key=False)[1])
        batch = read_batch(payload)
        assert batch is not None
        list(sliced.apply_ops(batch.ops, slice_n))
        sliced.bad += batch.bad
    assert list(sliced.blocks) == list(whole.blocks)
    assert (sliced.stored, sliced.removed, sliced.cleared, sliced.bad) == (
        whole.stored, whole.removed, whole.cleared, whole.bad)
