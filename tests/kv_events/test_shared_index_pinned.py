"""The shared KV index summaries pinned point by point (issue 21; routing.kv_shared), with no
Redis: the Bloom filter's wire form (splitmix64 against its reference outputs, the probes, the
size rule, the text form both ways), then :class:`SharedKVIndex` on a recording state and fake
streams — what is written, under which name and expiry, when a filter is rebuilt, how long a
read is reused, and when a summary stops counting (as seen here, the bound itself included).
The two-replica behaviour on the real Redis is test_shared_index.py's."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from prefixgate.proxy.routing import kv_shared
from prefixgate.proxy.routing.kv_shared import BlockSummary, SharedKVIndex, _mix, _probes

# ---- the filter ----------------------------------------------------------------------------------


def test_the_mix_is_splitmix64_by_its_reference_outputs() -> None:
    """splitmix64 seeded with 0 (Vigna's splitmix64.c) outputs e220a8397b1dcdaf, 6e789e6aa1b965f4,
    06c45d188009454f; ``_mix(h)`` is one step from state ``h``, so from 0, golden, 2 x golden."""
    golden = 0x9E3779B97F4A7C15
    assert _mix(0) == 0xE220A8397B1DCDAF
    assert _mix(golden) == 0x6E789E6AA1B965F4
    assert _mix(2 * golden & (1 << 64) - 1) == 0x06C45D188009454F


@pytest.mark.parametrize("h", [0, 7, (1 << 64) + 7, (1 << 255) | 12345])
@pytest.mark.parametrize("bits", [8, 64, 1000])
def test_probes_are_double_hashing_of_the_mixed_low_64_bits(h: int, bits: int) -> None:
    z = _mix(h & (1 << 64) - 1)
    a, b = z & 0xFFFFFFFF, (z >> 32) | 1
    assert _probes(h, bits) == [(a + i * b) % bits for i in range(kv_shared.PROBES)]
    assert kv_shared.PROBES == 4 and len(_probes(h, bits)) == 4


def test_adding_a_hash_sets_exactly_its_probe_bits() -> None:
    s = BlockSummary(64)
    assert s.blocks == 0 and s.filt == bytearray(8)
    s.add(7)
    want = bytearray(8)
    for p in _probes(7, 64):
        want[p // 8] |= 1 << (p % 8)
    assert s.filt == want and s.blocks == 1
    assert 7 in s
    s.add(7)
    assert s.filt == want and s.blocks == 2  # counted again, no new bit


def test_membership_needs_every_probe_bit() -> None:
    s = BlockSummary(64)
    ps = _probes(7, 64)
    for p in ps[:-1]:  # all but the last probe's bit
        s.filt[p // 8] |= 1 << (p % 8)
    if ps[-1] not in ps[:-1]:
        assert 7 not in s
    s.filt[ps[-1] // 8] |= 1 << (ps[-1] % 8)
    assert 7 in s


@pytest.mark.parametrize(("n", "bits"), [(0, 64), (1, 64), (5, 64), (6, 72), (100, 1200)])
def test_a_summary_has_12_bits_per_block_and_at_least_64(n: int, bits: int) -> None:
    s = BlockSummary.of(list(range(1, n + 1)))
    assert (s.bits, s.blocks, len(s.filt)) == (bits, n, (bits + 7) // 8)


def test_a_summary_of_more_than_the_cap_keeps_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv_shared, "SUMMARY_MAX_BLOCKS", 4)
    s = BlockSummary.of([1, 2, 3, 4, 5, 6])
    ref = BlockSummary(64)
    for h in (3, 4, 5, 6):
        ref.add(h)
    assert (s.bits, s.blocks, s.filt) == (64, 4, ref.filt)


@pytest.mark.parametrize("bits", [0, 7, -8])
def test_fewer_than_8_bits_is_refused(bits: int) -> None:
    with pytest.raises(ValueError, match="^a block summary has at least 8 bits$"):
        BlockSummary(bits)


def test_a_filter_must_be_as_long_as_its_bit_count() -> None:
    assert len(BlockSummary(8).filt) == 1 and len(BlockSummary(9).filt) == 2
    assert BlockSummary(9, bytearray(2), 3).blocks == 3
    with pytest.raises(ValueError, match="^filter length does not match its bit count$"):
        BlockSummary(9, bytearray(1))
    with pytest.raises(ValueError, match="^filter length does not match its bit count$"):
        BlockSummary(8, bytearray(2))


def test_the_text_form_both_ways() -> None:
    s = BlockSummary.of([11, 22, 33])
    filt = base64.b64encode(s.filt).decode()
    assert s.text("w1", 7) == f"w1 7 3 64 {filt}"
    back = BlockSummary.parse(f"w1 7 3 64 {filt}")
    assert back is not None and (back.bits, back.blocks, back.filt) == (64, 3, s.filt)
    assert back.prefix_blocks([11, 22, 33]) == 3
    assert BlockSummary.parse(f"w1 7 3 64 {filt} extra") is None  # six parts
    assert BlockSummary.parse(f"w1 7 3 64  {filt}") is None  # an empty part: six
    assert BlockSummary.parse(f"w1 7 x 64 {filt}") is None
    assert BlockSummary.parse(f"w1 7 3 72 {filt}") is None  # 8 bytes, 72 bits want 9
    # a stray character is a corrupted text, never read as the filter that is left without it
    assert BlockSummary.parse(f"w1 7 3 64 {filt[:4]}!{filt[4:]}") is None
    assert BlockSummary.parse(f"w1 7 3 64 {filt[:4]}\n{filt[4:]}") is None


def test_the_prefix_walk_of_a_summary() -> None:
    s = BlockSummary.of([11, 22, 44])
    assert s.prefix_blocks([11, 22, 33, 44]) == 2
    assert s.prefix_blocks([11, 22, 44]) == 3
    assert s.prefix_blocks([]) == 0


# ---- SharedKVIndex on a recording state ------------------------------------------------------------


@dataclass
class Recording:
    """A shared state that records writes and answers reads from ``values``."""

    values: dict[str, str | None] = field(default_factory=dict)
    puts: list[tuple[str, str, float | None]] = field(default_factory=list)
    reads: list[list[str]] = field(default_factory=list)
    fail: bool = False

    async def put(self, name: str, value: str, ttl_s: float | None = None) -> None:
        self.puts.append((name, value, ttl_s))

    async def read_many(self, values: Sequence[str], tables: Sequence[str]) -> tuple[list[str | None], list[Any]]:
        self.reads.append(list(values))
        if self.fail:
            raise ConnectionError("down")
        return [self.values.get(v) for v in values], []


class Stream:
    """What SharedKVIndex reads of a stream: usable(), batches, index.blocks, settings."""

    def __init__(self, blocks: list[int], staleness: float = 5.0, usable: bool = True) -> None:
        self.batches, self.ok = 1, usable
        self.index = SimpleNamespace(blocks=dict.fromkeys(blocks))
        self.settings = SimpleNamespace(max_staleness_s=staleness)

    def usable(self) -> bool:
        return self.ok


def test_defaults_of_a_shared_index() -> None:
    ix = SharedKVIndex(Recording(), {})
    assert len(ix.writer) == 12 and int(ix.writer, 16) >= 0
    assert SharedKVIndex(Recording(), {}).writer != ix.writer
    assert ix.publish_s == 1.0 and ix.clock is kv_shared.time.monotonic
    assert (ix.publishes, ix.reads, ix.read_failures) == (0, 0, 0)
    assert SharedKVIndex(Recording(), {}, writer="w").writer == "w"


async def test_publish_writes_each_usable_streams_summary_with_twice_its_staleness() -> None:
    st = Recording()
    streams = {"d0": Stream([1, 2], staleness=3.0), "d1": Stream([5], usable=False), "d2": Stream([])}
    ix = SharedKVIndex(st, streams, writer="w")
    assert await ix.publish_once() == 2
    assert [(n, ttl) for n, _, ttl in st.puts] == [("kvindex:d0", 6.0), ("kvindex:d2", 10.0)]
    assert st.puts[0][1] == BlockSummary.of([1, 2]).text("w", 1)
    assert st.puts[1][1] == BlockSummary.of([]).text("w", 1)
    assert ix.publishes == 2
    streams["d1"].ok = True
    assert await ix.publish_once() == 3
    assert [v.split(" ")[1] for _, v, _ in st.puts[2:]] == ["2", "2", "2"]  # n counts publications
    assert ix.publishes == 5


async def test_a_filter_is_rebuilt_only_after_a_new_batch() -> None:
    st = Recording()
    s = Stream([1, 2])
    ix = SharedKVIndex(st, {"d0": s}, writer="w")
    await ix.publish_once()
    s.index.blocks[3] = None  # held now, but no new batch counted yet: the old filter
    await ix.publish_once()
    assert st.puts[-1][1] == BlockSummary.of([1, 2]).text("w", 2)
    s.batches += 1
    await ix.publish_once()
    assert st.puts[-1][1] == BlockSummary.of([1, 2, 3]).text("w", 3)


async def test_a_stream_without_settings_is_stale_after_5_seconds() -> None:
    now = [0.0]
    st = Recording(values={"kvindex:zz": BlockSummary.of([1]).text("o", 1)})
    ix = SharedKVIndex(st, {}, clock=lambda: now[0])
    await ix.refresh(["zz"])
    now[0] = 5.0
    assert ix.summary("zz") is not None
    now[0] = 5.01
    assert ix.summary("zz") is None


async def test_run_publishes_every_publish_s_and_survives_a_failed_write(
        caplog: pytest.LogCaptureFixture) -> None:
    calls: list[float] = []

    class Flaky(Recording):
        async def put(self, name: str, value: str, ttl_s: float | None = None) -> None:
            calls.append(asyncio.get_running_loop().time())
            if len(calls) == 1:
                raise ConnectionError("down")

    ix = SharedKVIndex(Flaky(), {"d0": Stream([1])}, writer="w", publish_s=0.05)
    task = asyncio.create_task(ix.run())
    await asyncio.sleep(0.4)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert 3 <= len(calls) <= 9  # ~0.05 s apart, not a busy loop
    assert ix.publishes == len(calls) - 1  # the failed one counts nothing
    failed = [r for r in caplog.records if r.name == "prefixgate.kv_events"]
    assert [(r.levelname, r.getMessage()) for r in failed] == [
        ("ERROR", "KV index summary publish failed")]
    assert failed[0].exc_info is not None and failed[0].exc_info[0] is ConnectionError


async def test_a_read_is_reused_for_read_max_age_s_that_instant_excluded() -> None:
    now = [0.0]
    st = Recording(values={"kvindex:d0": BlockSummary.of([1]).text("o", 1)})
    ix = SharedKVIndex(st, {}, clock=lambda: now[0])
    await ix.refresh(["d0"])
    assert st.reads == [["kvindex:d0"]] and ix.reads == 1
    now[0] = kv_shared.READ_MAX_AGE_S / 2
    await ix.refresh(["d0"])
    assert len(st.reads) == 1
    await ix.refresh(["d0", "d1"])  # another set of names: its own read
    assert len(st.reads) == 2
    now[0] = kv_shared.READ_MAX_AGE_S  # exactly that old: read again
    await ix.refresh(["d0"])
    assert len(st.reads) == 3 and ix.reads == 3


async def test_a_failed_read_is_counted_and_keeps_what_was_seen() -> None:
    now = [0.0]
    st = Recording(values={"kvindex:d0": BlockSummary.of([1]).text("o", 1)})
    ix = SharedKVIndex(st, {"d0": Stream([], staleness=1.0)}, clock=lambda: now[0])
    await ix.refresh(["d0"])
    st.fail = True
    now[0] = 0.5
    await ix.refresh(["d0"])
    assert (ix.reads, ix.read_failures) == (1, 1)
    assert ix.summary("d0") is not None
    now[0] = 0.6
    await ix.refresh(["d0"])
    assert (ix.reads, ix.read_failures) == (1, 2)


async def test_a_state_answering_the_wrong_number_of_values_is_an_error() -> None:
    class Short(Recording):
        async def read_many(self, values: Sequence[str], tables: Sequence[str]) -> tuple[list[str | None], list[Any]]:
            return [None], []

    ix = SharedKVIndex(Short(), {})
    with pytest.raises(ValueError):
        await ix.refresh(["d0", "d1"])


async def test_a_name_with_no_summary_does_not_hide_the_next_ones() -> None:
    st = Recording(values={"kvindex:d1": BlockSummary.of([1]).text("o", 1),
                           "kvindex:d2": BlockSummary.of([1, 2]).text("o", 1)})
    ix = SharedKVIndex(st, {}, clock=lambda: 0.0)
    await ix.refresh(["d0", "d1", "d2"])
    got = [ix.summary(n) for n in ("d0", "d1", "d2")]
    assert got[0] is None and got[1] is not None and got[2] is not None
    assert (got[1].blocks, got[2].blocks) == (1, 2)


async def test_a_summary_counts_while_its_text_changed_within_the_staleness_bound() -> None:
    now = [0.0]
    st = Recording(values={"kvindex:d0": BlockSummary.of([1, 2]).text("o", 1)})
    ix = SharedKVIndex(st, {"d0": Stream([], staleness=1.0)}, clock=lambda: now[0])
    assert ix.summary("d0") is None  # never read
    await ix.refresh(["d0"])
    got = ix.summary("d0")
    assert got is not None and got.prefix_blocks([1, 2, 3]) == 2
    now[0] = 0.6
    await ix.refresh(["d0"])  # the same text: its age runs from when it was first seen
    now[0] = 1.0
    assert ix.summary("d0") is not None  # the bound itself included
    now[0] = 1.1
    assert ix.summary("d0") is None
    st.values["kvindex:d0"] = BlockSummary.of([1]).text("o", 2)  # the writer published again
    await ix.refresh(["d0"])
    got = ix.summary("d0")
    assert got is not None and got.prefix_blocks([1, 2]) == 1
    now[0] = 2.1
    assert ix.summary("d0") is not None
    del st.values["kvindex:d0"]  # expired: forgotten
    now[0] = 2.2
    await ix.refresh(["d0"])
    assert ix.summary("d0") is None and "d0" not in ix._seen and "d0" not in ix._parsed
    st.values["kvindex:d0"] = "not a summary"
    now[0] = 2.3
    await ix.refresh(["d0"])
    assert ix.summary("d0") is None  # fresh but unreadable
