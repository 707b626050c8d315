"""The replay exchange and the gap rules of the KV event consumer pinned on a scripted replay
socket (issue 21; routing.kv_events): a ROUTER on an ``inproc://`` address answers each
``start_seq`` with frames chosen by the test, so every branch of
:meth:`KVEventStream.replay_from` and of :meth:`KVEventStream.handle`'s gap path is met
exactly; the real publishers' replay is test_stream.py's. Also the follow loop's error path."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import msgpack
import pytest
import zmq
import zmq.asyncio

from prefixgate.config.routing import KVEventsSettings
from prefixgate.proxy.routing.kv_events import KVEventStream

Frames = list[list[bytes]]


def seqb(n: int) -> bytes:
    return n.to_bytes(8, "big", signed=True)


def batch(*hashes: int, ts: float = 0.0) -> bytes:
    return msgpack.packb([ts, [["BlockStored", list(hashes)]]])


END = [seqb(-1), b""]


class Replayer:
    """A scripted replay socket: ``answer(start)`` -> the frames to send (each without the
    identity; ``delimiter``: put REQ's empty frame first, as vLLM's ROUTER does)."""

    def __init__(self, answer: Callable[[int], Frames], delimiter: bool = True) -> None:
        self.addr = f"inproc://replay-{uuid.uuid4().hex[:8]}"
        self.answer, self.delimiter = answer, delimiter
        self.asked: list[list[bytes]] = []
        self.sock = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(self.addr)
        self.task = asyncio.create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            ident, *rest = await self.sock.recv_multipart()
            self.asked.append(rest)
            start = int.from_bytes(rest[-1], "big", signed=True)
            for frames in self.answer(start):
                await self.sock.send_multipart([ident] + ([b""] if self.delimiter else []) + frames)

    async def close(self) -> None:
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task
        self.sock.close()


def stream(rep: Replayer, now: list[float] | None = None, timeout_s: float = 1.0) -> KVEventStream:
    t = now if now is not None else [5.0]
    return KVEventStream("d0", KVEventsSettings(endpoint="tcp://127.0.0.1:9", replay=rep.addr,
                                                block_size=4),
                         clock=lambda: t[0], wall=lambda: 0.0, replay_timeout_s=timeout_s)


async def test_a_replay_asks_from_start_with_reqs_delimiter_and_applies_in_order() -> None:
    rep = Replayer(lambda start: [[seqb(5), batch(1)], [seqb(6), batch(2, ts=-50.0)], END])
    s = stream(rep)
    try:
        assert await s.replay_from(0) is True  # from 0 on an empty stream: whatever comes first
        assert rep.asked == [[b"", seqb(0)]]
        assert (s.seq.last, list(s.index.blocks), s.batches, s.replays, s.seen_at) == (6, [1, 2], 2, 1, 5.0)
        assert len(s.lags_ms) == 0  # replayed batches are not live: no lag sample
    finally:
        await rep.close()


async def test_a_replay_from_a_number_keeps_what_follows_and_ignores_the_old() -> None:
    rep = Replayer(lambda start: [[seqb(2), batch(9)], [seqb(3), batch(9)], [seqb(4), batch(4)],
                                  [seqb(5), batch(5)], END])
    s = stream(rep)
    s.seq.last = 3
    try:
        assert await s.replay_from(4) is True
        assert rep.asked[-1] == [b"", seqb(4)]
        assert (s.seq.last, list(s.index.blocks)) == (5, [4, 5])  # 2, 3 already seen: ignored, no hole
    finally:
        await rep.close()


async def test_a_full_replay_takes_its_first_batch_then_only_what_follows() -> None:
    rep = Replayer(lambda start: [[seqb(5), batch(5)], [seqb(7), batch(7)], END])
    s = stream(rep)
    try:
        assert await s.replay_from(0) is False  # 6 missing
        assert (s.seq.last, list(s.index.blocks)) == (5, [5])
        s2 = stream(rep)
        assert await s2.replay_from(1) is False  # from 1 on an empty stream: 5 is a hole
        assert (s2.seq.last, list(s2.index.blocks)) == (0, [])
    finally:
        await rep.close()


async def test_a_resync_that_brings_exactly_the_batch_does_not_apply_it_again() -> None:
    def answer(start: int) -> Frames:
        if start == 0:
            return [[seqb(n), batch(n)] for n in range(1, 7)] + [END]
        return [END]

    rep = Replayer(answer)
    s = stream(rep)
    s.seq.last = 3
    try:
        await s.handle(6, batch(6))
        assert (s.gaps, s.resyncs, s.seq.last, s.batches, len(s.lags_ms)) == (1, 1, 6, 6, 0)
    finally:
        await rep.close()


async def test_a_hole_in_the_replay_is_not_whole() -> None:
    rep = Replayer(lambda start: [[seqb(4), batch(4)], [seqb(6), batch(6)], END])  # 5 missing
    s = stream(rep)
    s.seq.last = 3
    try:
        assert await s.replay_from(4) is False
        assert (s.seq.last, list(s.index.blocks)) == (4, [4])
    finally:
        await rep.close()


async def test_a_replay_batch_that_starts_over_replaces_the_index() -> None:
    cleared = msgpack.packb([0.0, [["AllBlocksCleared"], ["BlockStored", [8]]]])
    rep = Replayer(lambda start: [[seqb(40), cleared], END])
    s = stream(rep)
    s.index.apply(["BlockStored", [1, 2]])
    s.seq.last = 3
    try:
        assert await s.replay_from(4) is True
        assert (s.seq.last, list(s.index.blocks), len(s.lags_ms)) == (40, [8], 0)
    finally:
        await rep.close()


async def test_an_unreadable_batch_is_skipped_and_the_replay_goes_on() -> None:
    rep = Replayer(lambda start: [[seqb(1), b"\xc1"], [seqb(1), batch(1)], END])
    s = stream(rep)
    try:
        assert await s.replay_from(1) is True
        assert (s.seq.last, list(s.index.blocks), s.index.bad) == (1, [1], 0)
    finally:
        await rep.close()


async def test_a_replier_without_the_delimiter_is_read_too() -> None:
    rep = Replayer(lambda start: [[seqb(1), batch(1)], END], delimiter=False)
    s = stream(rep)
    try:
        assert await s.replay_from(1) is True and list(s.index.blocks) == [1]
    finally:
        await rep.close()


async def test_a_short_answer_or_no_answer_is_a_failed_replay() -> None:
    rep = Replayer(lambda start: [[seqb(1)]])  # one frame: not [seq, payload]
    s = stream(rep)
    try:
        assert await s.replay_from(1) is False and s.seen_at == float("-inf")
    finally:
        await rep.close()
    silent = Replayer(lambda start: [])
    s = stream(silent, timeout_s=0.1)
    try:
        assert await asyncio.wait_for(s.replay_from(1), 3.0) is False
        assert s.seen_at == float("-inf") and s.replays == 1
    finally:
        await silent.close()


async def test_a_gap_filled_by_the_replay_up_to_the_batch_needs_no_resync() -> None:
    rep = Replayer(lambda start: [[seqb(n), batch(n)] for n in range(start, 7)] + [END])
    s = stream(rep)
    s.seq.last = 3
    try:
        await s.handle(7, batch(7))
        assert rep.asked == [[b"", seqb(4)]]
        assert (s.gaps, s.resyncs, s.seq.last, list(s.index.blocks), s.batches) == (1, 0, 7, [4, 5, 6, 7], 4)
        assert len(s.lags_ms) == 1  # only the live batch
    finally:
        await rep.close()


async def test_a_replay_that_brought_the_batch_too_does_not_apply_it_twice() -> None:
    rep = Replayer(lambda start: [[seqb(n), batch(n)] for n in range(start, 8)] + [END])
    s = stream(rep)
    s.seq.last = 3
    try:
        await s.handle(7, batch(7))
        assert (s.gaps, s.resyncs, s.seq.last, s.batches, len(s.lags_ms)) == (1, 0, 7, 4, 0)
    finally:
        await rep.close()


async def test_a_replay_short_of_the_batch_is_a_resync_which_may_bring_it() -> None:
    def answer(start: int) -> Frames:
        if start == 0:  # the full state: batches 1 .. 7
            return [[seqb(n), batch(n)] for n in range(1, 8)] + [END]
        return [[seqb(start), batch(start)], END]  # only one batch of the gap

    rep = Replayer(answer)
    s = stream(rep)
    s.seq.last = 3
    try:
        await s.handle(6, batch(6))  # 4 comes back, 5 does not: resync from 0, which brings 6
        assert [a[-1] for a in rep.asked] == [seqb(4), seqb(0)]
        assert (s.gaps, s.resyncs, s.synced, s.seq.last) == (1, 1, True, 7)
        assert list(s.index.blocks) == [1, 2, 3, 4, 5, 6, 7] and len(s.lags_ms) == 0
        await s.handle(9, batch(9))  # a second gap, counted again, filled by 8 alone
        assert (s.gaps, s.resyncs, s.seq.last) == (2, 1, 9)
    finally:
        await rep.close()


async def test_resync_replays_from_zero() -> None:
    rep = Replayer(lambda start: [[seqb(n), batch(n)] for n in range(max(start, 1), 3)] + [END]
                   if start == 0 else [END])
    s = stream(rep)
    s.index.apply(["BlockStored", [99]])
    try:
        assert await s.resync() is True
        assert rep.asked == [[b"", seqb(0)]] and (s.synced, list(s.index.blocks)) == (True, [1, 2])
        assert await s.resync() is True and s.resyncs == 2
    finally:
        await rep.close()


async def test_restarts_are_counted_each() -> None:
    rep = Replayer(lambda start: [END])
    s = stream(rep)
    try:
        await s.handle(5, batch(5))
        await s.handle(1, batch(1))  # 1 after 5: a restart
        await s.handle(2, batch(2))
        await s.handle(1, batch(1))  # 1 after 2: another
        assert (s.resyncs, s.gaps, s.seq.last, list(s.index.blocks)) == (2, 0, 1, [1])
    finally:
        await rep.close()


async def test_a_failed_session_is_logged_unsynced_and_retried_after_probe_s(
        caplog: pytest.LogCaptureFixture) -> None:
    from tests.kv_events.helpers import until

    s = KVEventStream("d7", KVEventsSettings(endpoint="tcp://127.0.0.1:9"), probe_s=0.3)
    calls: list[tuple[bool, float]] = []

    async def session() -> None:
        calls.append((s.synced, asyncio.get_running_loop().time()))
        s.synced = True
        if len(calls) == 1:
            raise RuntimeError("boom")
        await asyncio.Event().wait()

    s._session = session  # type: ignore[method-assign]
    task = asyncio.create_task(s.run())
    await until(lambda: len(calls) == 1)
    await asyncio.sleep(0.05)
    assert not s.synced  # failed: unsynced, waiting probe_s
    await until(lambda: len(calls) == 2)
    assert s.synced and not task.done() and calls[1][0] is False
    assert calls[1][1] - calls[0][1] >= 0.29
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    got = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "prefixgate.kv_events"]
    assert got == [("ERROR", "KV events of d7: stream failed; resyncing")]
    assert caplog.records[-1].exc_info is not None


async def test_a_quiet_stream_is_probed_from_last_plus_one_and_a_failed_probe_resyncs() -> None:
    """The follow loop: a resync at start (from 0), then after each ``probe_s`` of silence a
    probe from ``last + 1`` that keeps the stream synced while answered; a probe not answered
    unsyncs it, and the next quiet turn resyncs (from 0) once the replay answers again."""
    from tests.kv_events.helpers import until

    mode = ["up"]

    def answer(start: int) -> Frames:
        if mode[0] == "down":
            return []
        return ([[seqb(1), batch(1)]] if start == 0 else []) + [END]

    rep = Replayer(answer)
    s = KVEventStream("d0", KVEventsSettings(endpoint=f"inproc://pub-{uuid.uuid4().hex[:8]}",
                                             replay=rep.addr),
                      replay_timeout_s=0.5, probe_s=0.05)
    task = asyncio.create_task(s.run())
    try:
        await until(lambda: len(rep.asked) >= 4)
        assert [a[-1] for a in rep.asked[:4]] == [seqb(0), seqb(2), seqb(2), seqb(2)]
        assert (s.resyncs, s.synced, s.seq.last) == (1, True, 1)
        mode[0] = "down"
        await until(lambda: not s.synced)
        mode[0] = "up"
        await until(lambda: s.synced and s.resyncs >= 2)
        assert not task.done()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await rep.close()


async def test_an_undecodable_batch_in_the_replay_buffer_is_skipped_not_a_hole() -> None:
    """Issue 34, item 14: the publisher's buffer holds one batch that cannot be read; a resync
    (from 0) still syncs, the batches after it apply, and the skip is counted."""
    rep = Replayer(lambda start: [[seqb(n), b"\xc1" if n == 2 else batch(n)]
                                  for n in range(max(start, 1), 5)] + [END])
    s = stream(rep)
    try:
        assert await s.resync() is True and s.usable()
        assert (s.seq.last, sorted(s.index.blocks), s.undecodable) == (4, [1, 3, 4], 1)
        assert await s.replay_from(5) is True  # the probe after it: whole
        s2 = stream(rep)
        s2.seq.last = 1
        assert await s2.replay_from(2) is True  # a gap repair that meets it first
        assert (s2.seq.last, sorted(s2.index.blocks), s2.undecodable) == (4, [3, 4], 1)
    finally:
        await rep.close()


async def test_an_undecodable_batch_last_in_the_replay_passes_its_number() -> None:
    rep = Replayer(lambda start: [[seqb(3), batch(3)], [seqb(4), b"\xc1"], END])
    s = stream(rep)
    s.seq.last = 2
    try:
        assert await s.replay_from(3) is True
        assert (s.seq.last, s.undecodable) == (4, 1)
    finally:
        await rep.close()


async def test_an_undecodable_live_batch_is_skipped_without_a_gap_or_a_replay() -> None:
    rep = Replayer(lambda start: [END])
    s = stream(rep)
    s.seq.last, s.synced = 1, True
    try:
        await s.handle(2, b"\xc1")
        await s.handle(3, batch(3))
        assert (s.seq.last, s.gaps, s.replays, s.undecodable) == (3, 0, 0, 1)
        assert list(s.index.blocks) == [3]
    finally:
        await rep.close()
