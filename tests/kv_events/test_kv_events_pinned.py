"""The KV event consumer's rules pinned point by point without a publisher (issue 21;
routing.kv_events): what a batch payload is, when a batch starts over, freshness at its bound,
the lag percentile by hand, each verdict's effect in :meth:`KVEventStream.handle` (no replay
socket: a gap is a full resync), and the hub's matches (own index, shared summary, neither).
The socket paths (replay, probes, reconnects) are test_stream.py's, on real publishers."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest

from prefixgate.config.loader import parse_policy
from prefixgate.config.routing import KVEventsSettings
from prefixgate.proxy.routing.kv_batch import read_batch
from prefixgate.proxy.routing.kv_events import KVEventHub, KVEventStream
from prefixgate.proxy.routing.kv_hash import wire_hashes
from prefixgate.proxy.routing.kv_shared import BlockSummary

EP = "tcp://127.0.0.1:9"  # nothing is ever read from it here


def _batch(ts: float, *events: Any) -> bytes:
    return msgpack.packb([ts, list(events)])


@pytest.mark.parametrize(("doc", "want"), [
    ([1.5, [["BlockStored", [1]]]], (1.5, [("stored", [1])])),
    ([2, [], 0], (2.0, [])),  # an int ts, a dp_rank
])
def test_a_batch_payload_decodes_to_its_ts_and_events(doc: Any, want: Any) -> None:
    got = read_batch(msgpack.packb(doc))
    assert got is not None and isinstance(got.ts, float)
    assert (got.ts, [(k, list(h)) for k, h in got.ops]) == want


@pytest.mark.parametrize("payload", [
    b"\xc1", b"\x92\x01", msgpack.packb([1.0, []]) + b"\x90", msgpack.packb({"ts": 1}),
    msgpack.packb([1.0]), msgpack.packb(["1.0", []]), msgpack.packb([1.0, {"e": 1}]),
    msgpack.packb([None, []]), b"",
])
def test_anything_else_is_not_a_batch(payload: bytes) -> None:
    assert read_batch(payload) is None


def test_a_batch_with_int_keys_still_decodes() -> None:
    got = read_batch(msgpack.packb([1.0, [{1: 2}]]))
    assert got is not None and (got.ts, got.ops, got.bad) == (1.0, [], 1)  # the event is bad


@pytest.mark.parametrize(("events", "want"), [
    ([["AllBlocksCleared"]], True), ([("AllBlocksCleared",), ["BlockStored", [1]]], True),
    ([], False), ([[]], False), (["AllBlocksCleared"], False), ([()], False),
    ([["BlockStored", [1]], ["AllBlocksCleared"]], False), ([["Other"]], False),
])
def test_a_batch_starts_over_only_when_its_first_event_is_all_blocks_cleared(events: Any, want: bool) -> None:
    got = read_batch(msgpack.packb([0.0, events]))
    assert got is not None and got.first_cleared is want


def _stream(now: list[float], wall: list[float] | None = None, staleness: float = 2.0,
            **kw: Any) -> KVEventStream:
    w = wall if wall is not None else [0.0]
    return KVEventStream("d0", KVEventsSettings(endpoint=EP, block_size=4, max_staleness_s=staleness),
                         clock=lambda: now[0], wall=lambda: w[0], **kw)


def test_a_new_stream_is_unsynced_never_seen_and_counts_nothing() -> None:
    s = _stream([0.0])
    assert (s.replay_timeout_s, s.probe_s, s.synced, s.seen_at) == (1.0, 1.0, False, float("-inf"))
    assert (s.gaps, s.replays, s.resyncs, s.batches) == (0, 0, 0, 0)
    assert s.lags_ms.maxlen == 10_000 and s.lag_p99_ms() is None
    assert not s.usable()


def test_a_stream_is_usable_while_synced_and_seen_within_the_bound_included() -> None:
    now = [100.0]
    s = _stream(now)
    assert asyncio.run(s.resync()) is True  # no replay socket: synced, empty, seen now
    assert (s.synced, s.seen_at, s.resyncs, s.seq.last, s.index.cleared) == (True, 100.0, 1, 0, 1)
    now[0] = 102.0
    assert s.staleness_s() == 2.0 and s.usable()
    now[0] = 102.5
    assert not s.usable()
    s.seen_at, s.synced = 102.5, False
    assert not s.usable()


def test_the_lag_p99_is_the_sample_at_int_of_99_percent_of_the_count() -> None:
    s = _stream([0.0])
    s.lags_ms.extend([5.0])
    assert s.lag_p99_ms() == 5.0
    s.lags_ms.clear()
    s.lags_ms.extend(float(x) for x in range(200, 0, -1))  # 1 .. 200, unsorted
    assert s.lag_p99_ms() == 199.0  # xs[int(198.0)]
    s.lags_ms.clear()
    s.lags_ms.extend(float(x) for x in range(1, 51))
    assert s.lag_p99_ms() == 50.0  # xs[min(49, int(49.5))]


def test_handle_applies_in_order_drops_old_and_samples_the_lag() -> None:
    now, wall = [10.0], [1000.0]
    s = _stream(now, wall)
    asyncio.run(s.handle(5, _batch(999.75, ["BlockStored", [1, 2]])))  # anything first
    assert (s.seq.last, s.batches, s.seen_at, list(s.index.blocks)) == (5, 1, 10.0, [1, 2])
    assert list(s.lags_ms) == [250.0]
    now[0] = 11.0
    asyncio.run(s.handle(6, _batch(1000.5, ["BlockStored", [3]])))  # a ts ahead: lag 0, never negative
    assert (s.seq.last, s.batches, s.seen_at, list(s.index.blocks)) == (6, 2, 11.0, [1, 2, 3])
    assert list(s.lags_ms) == [250.0, 0.0]
    now[0] = 12.0
    asyncio.run(s.handle(4, _batch(1000.0, ["BlockStored", [9]])))  # old: only seen
    assert (s.seq.last, s.batches, s.seen_at, list(s.index.blocks)) == (6, 2, 12.0, [1, 2, 3])
    assert len(s.lags_ms) == 2 and (s.gaps, s.resyncs, s.replays) == (0, 0, 0)


def test_a_payload_that_is_not_a_batch_counts_bad_and_changes_nothing() -> None:
    now = [10.0]
    s = _stream(now)
    asyncio.run(s.handle(1, _batch(1.0, ["BlockStored", [1]])))
    now[0] = 20.0
    asyncio.run(s.handle(2, b"\xc1"))
    # skipped, its number passed (issue 34, item 14: an unreadable batch is no gap)
    assert (s.index.bad, s.seq.last, s.batches, s.seen_at, s.undecodable) == (1, 2, 1, 10.0, 1)
    asyncio.run(s.handle(2, b"not msgpack at all \xc1"))
    assert s.index.bad == 2 and s.seq.last == 2


def test_a_restarted_publisher_empties_the_index_and_counts_a_resync() -> None:
    s = _stream([10.0])
    asyncio.run(s.handle(7, _batch(0.0, ["BlockStored", [1, 2]])))
    asyncio.run(s.handle(1, _batch(0.0, ["BlockStored", [3]])))
    assert (s.seq.last, list(s.index.blocks), s.resyncs, s.index.cleared, s.batches) == (1, [3], 1, 1, 2)
    assert len(s.lags_ms) == 2


def test_a_gap_whose_batch_starts_over_needs_no_replay() -> None:
    s = _stream([10.0])
    asyncio.run(s.handle(3, _batch(0.0, ["BlockStored", [1, 2]])))
    asyncio.run(s.handle(9, _batch(0.0, ["AllBlocksCleared"], ["BlockStored", [4]])))
    assert (s.seq.last, list(s.index.blocks), s.gaps, s.resyncs, s.replays) == (9, [4], 0, 0, 0)
    assert s.index.cleared == 2  # the stream's clear and the event's own


def test_a_gap_without_a_replay_socket_is_a_full_resync_then_the_batch() -> None:
    s = _stream([10.0])
    asyncio.run(s.handle(3, _batch(0.0, ["BlockStored", [1, 2]])))
    asyncio.run(s.handle(4, _batch(0.0, ["BlockStored", [5]])))
    asyncio.run(s.handle(9, _batch(0.0, ["BlockStored", [7]])))
    assert (s.gaps, s.resyncs, s.replays, s.synced) == (1, 1, 0, True)
    assert (s.seq.last, list(s.index.blocks), s.batches) == (9, [7], 3)
    assert asyncio.run(s.replay_from(1)) is False and s.replays == 0


# ---- the hub ---------------------------------------------------------------------------------------

TOKENS = list(range(100, 112))  # 3 blocks of 4


def _policy(extra_kv: dict[str, Any] | None = None) -> Any:
    deps = [{"name": "d0", "base_url": "http://10.0.0.1:8000/v1",
             "kv_events": {"endpoint": EP, "block_size": 4}},
            {"name": "d1", "base_url": "http://10.0.0.2:8000/v1",
             "kv_events": {"endpoint": EP, "block_size": 2, "subscribe": False, **(extra_kv or {})}},
            {"name": "d2", "base_url": "http://10.0.0.3:8000/v1"}]
    return parse_policy({"backends": {"g": {"kind": "openai_compat", "deployments": deps,
                                            "affinity": {"mode": "exact"}}},
                         "routes": [{"match": "*", "backend": "g"}]})


class Summaries:
    def __init__(self, by_name: dict[str, BlockSummary]) -> None:
        self.by_name, self.refreshed = by_name, []

    def summary(self, name: str) -> BlockSummary | None:
        return self.by_name.get(name)

    async def refresh(self, names: list[str]) -> None:
        self.refreshed.append(list(names))


def test_a_hub_has_a_stream_per_deployment_with_kv_events_and_its_options() -> None:
    hub = KVEventHub.from_policy(_policy(), probe_s=0.25)
    assert sorted(hub.streams) == ["d0", "d1"] and hub.shared is None
    assert hub.streams["d1"].settings.block_size == 2 and hub.streams["d0"].probe_s == 0.25
    deps = _policy().backends["g"].group("g")
    assert hub.covers(deps) and hub.covers(deps[1:2]) and not hub.covers(deps[2:])
    assert KVEventHub().streams == {}


def test_matches_count_whole_held_blocks_per_deployment() -> None:
    p = _policy()
    deps = p.backends["g"].group("g")
    hub = KVEventHub.from_policy(p)
    assert hub.matches(deps, TOKENS) is None  # nothing synced: the caller falls back
    for s in hub.streams.values():
        asyncio.run(s.resync())
    h4 = wire_hashes(TOKENS, 4, "sha256", "")
    h2 = wire_hashes(TOKENS, 2, "sha256", "")
    hub.streams["d0"].index.apply(["BlockStored", h4[:2]])
    hub.streams["d1"].index.apply(["BlockStored", h2[:5]])
    assert hub.matches(deps, TOKENS) == [8, 10, 0]
    salted = hub.matches(deps, TOKENS, salt=b"tenant")  # other hashes: nothing held
    assert salted == [0, 0, 0]


def test_a_stale_stream_routes_on_the_fresh_shared_summary_else_counts_zero() -> None:
    now = [0.0]
    p = _policy()
    deps = p.backends["g"].group("g")
    hub = KVEventHub.from_policy(p, clock=lambda: now[0])
    for s in hub.streams.values():
        asyncio.run(s.resync())
    h4 = wire_hashes(TOKENS, 4, "sha256", "")
    hub.streams["d0"].index.apply(["BlockStored", h4])
    now[0] = 100.0  # both streams stale
    assert hub.matches(deps, TOKENS) is None
    shared = Summaries({"d0": BlockSummary.of(h4[:1])})
    hub.shared = shared  # type: ignore[assignment]
    assert hub.matches(deps, TOKENS) == [4, 0, 0]  # d0's summary, not its stale index
    asyncio.run(hub.refresh_shared(deps))
    assert shared.refreshed == [["d0", "d1"]]  # the stale ones with a stream, not d2
    hub.streams["d0"].seen_at = hub.streams["d1"].seen_at = 100.0
    asyncio.run(hub.refresh_shared(deps))
    assert len(shared.refreshed) == 1  # every stream usable: no read
    assert hub.matches(deps, TOKENS) == [12, 0, 0]  # its own index again


def test_refresh_shared_without_shared_state_reads_nothing() -> None:
    hub = KVEventHub.from_policy(_policy())
    asyncio.run(hub.refresh_shared(_policy().backends["g"].group("g")))  # no error, no I/O


async def test_start_runs_the_subscribed_streams_and_the_publisher_and_stop_ends_them() -> None:
    class Publisher:
        async def run(self) -> None:
            await asyncio.Event().wait()

    hub = KVEventHub.from_policy(_policy(), probe_s=0.05)
    hub.start()
    assert [t.get_name() for t in hub._tasks] == ["kv-events:d0"]  # d1 does not subscribe
    await hub.stop()
    hub.shared = Publisher()  # type: ignore[assignment]
    hub.start()
    tasks = list(hub._tasks)
    assert [t.get_name() for t in tasks] == ["kv-events:d0", "kv-index-summaries"]
    await asyncio.sleep(0.1)
    await hub.stop()
    assert hub._tasks == [] and all(t.cancelled() for t in tasks)


def test_unnamed_deployments_stream_under_their_group_name() -> None:
    p = parse_policy({"backends": {"g": {"kind": "openai_compat", "deployments": [
        {"base_url": "http://10.0.0.1:8000/v1", "kv_events": {"endpoint": EP}},
        {"base_url": "http://10.0.0.2:8000/v1", "kv_events": {"endpoint": EP}}]}},
        "routes": [{"match": "*", "backend": "g"}]})
    hub = KVEventHub.from_policy(p)
    assert sorted(hub.streams) == ["g#0", "g#1"]
    assert [hub.streams[n].name for n in ("g#0", "g#1")] == ["g#0", "g#1"]


async def test_a_hub_keeps_the_shared_index_it_is_given_and_stops_before_starting() -> None:
    shared = Summaries({})
    hub = KVEventHub(shared=shared)  # type: ignore[arg-type]
    assert hub.shared is shared
    await hub.stop()
    assert hub._tasks == []
