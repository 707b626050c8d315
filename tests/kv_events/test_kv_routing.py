"""Exact prefix-aware routing from KV events, under the existing load guard: the policy's
``kv_events``, one ``/tokenize`` per request, the index lookup, and the Sender's order."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest

from prefixgate.config.loader import PolicyError, parse_policy
from prefixgate.config.schema import Policy
from prefixgate.proxy.bridges import bridge_for
from prefixgate.proxy.routing.balance import Balancer, rendezvous_order
from prefixgate.proxy.routing.breaker import BreakerBoard
from prefixgate.proxy.routing.kv_events import KVEventHub, KVEventStream
from prefixgate.proxy.routing.kv_hash import wire_hashes
from prefixgate.proxy.routing.kv_match import event_matches
from prefixgate.proxy.routing.retries import Sender, Step
from prefixgate.proxy.routing.router import plan_targets
from tests.kv_events.helpers import Published

PROMPT = list(range(300, 316))  # 4 blocks of 4
BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


def _policy(pubs: list[Published], imbalance_abs: int = 2) -> Policy:
    deps = [{"name": f"d{i}", "base_url": f"http://10.0.0.{i + 1}:8000/v1",
             "kv_events": {"endpoint": p.pub_at, "replay": p.replay_at, "block_size": 4}}
            for i, p in enumerate(pubs)]
    return parse_policy({"backends": {"g": {"kind": "openai_compat", "deployments": deps,
                                            "affinity": {"mode": "exact",
                                                         "imbalance_abs": imbalance_abs}}},
                         "routes": [{"match": "*", "backend": "g"}],
                         "breaker": {"enabled": False}})


def _tokenizer(ids: list[int], seen: list[httpx.Request]) -> httpx.AsyncClient:
    def handle(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(200, json={"tokens": ids, "count": len(ids)})
    return httpx.AsyncClient(transport=httpx.MockTransport(handle))


@pytest.fixture
def fleet() -> Any:
    pubs = [Published(), Published(), Published()]
    yield pubs
    for p in pubs:
        p.close()


async def _synced_hub(policy: Policy) -> KVEventHub:
    hub = KVEventHub.from_policy(policy)
    for s in hub.streams.values():
        assert await s.resync()
    return hub


async def _catch_up(hub: KVEventHub) -> None:
    await asyncio.sleep(0.05)  # the publishers' flush
    for s in hub.streams.values():
        assert await s.replay_from(s.seq.last + 1)


def test_policy_reads_kv_events_per_deployment(fleet: list[Published]) -> None:
    policy = _policy(fleet)
    deps = policy.backends["g"].group("g")
    assert [d.kv_events.endpoint for d in deps if d.kv_events] == [p.pub_at for p in fleet]
    assert deps[0].kv_events is not None and deps[0].kv_events.hash_seed() == ""
    with pytest.raises(PolicyError, match="ZMQ address"):
        parse_policy({"backends": {"g": {"kind": "openai_compat", "deployments": [
            {"base_url": "http://a/v1", "kv_events": {"endpoint": "http://a:5557"}}]}},
            "routes": [{"match": "*", "backend": "g"}]})


async def test_one_tokenize_then_the_longest_held_prefix_wins(fleet: list[Published]) -> None:
    policy = _policy(fleet)
    hub = await _synced_hub(policy)
    fleet[1].insert(PROMPT[:8])  # d1: 2 blocks
    fleet[2].insert(PROMPT[:12] + [0, 0, 0, 0])  # d2: 3 blocks, then it diverges
    await _catch_up(hub)
    seen: list[httpx.Request] = []
    target = plan_targets(policy, "m", "openai")[0]
    deps = policy.backends["g"].group("g")
    async with _tokenizer(PROMPT + [1], seen) as client:
        got = await event_matches(client, hub, target, deps, BODY)
    assert got == [0, 8, 12]
    assert len(seen) == 1 and str(seen[0].url) == "http://10.0.0.1:8000/tokenize"
    assert orjson.loads(seen[0].content)["add_generation_prompt"] is True


async def test_sender_routes_for_the_cache_until_the_load_guard_says_no(
        fleet: list[Published]) -> None:
    policy = _policy(fleet)
    hub = await _synced_hub(policy)
    fleet[0].insert(PROMPT)
    await _catch_up(hub)
    seen: list[httpx.Request] = []
    client = _tokenizer(PROMPT, seen)

    async def match(t: Any, deps: Any, body: bytes) -> list[int]:
        found = await event_matches(client, hub, t, deps, body)
        assert found is not None
        return found

    balancer = Balancer()
    sender = Sender(lambda *a, **k: None, policy.retry, BreakerBoard(policy.breaker), balancer,  # type: ignore[arg-type]
                    match)
    step = Step(plan_targets(policy, "m", "openai")[0], bridge_for("openai", "openai"), BODY)
    key = next(k for k in (f"session-{i}" for i in range(100))
               if rendezvous_order(k, ["d0", "d1", "d2"])[0] != 0)
    order = await sender.order(step, key)  # a new key: its placement, not another key's prefix
    assert order[0][1] == "affinity" and order[0][0].name != "d0"
    order = await sender.order(step, key)  # known now: its longest held prefix
    assert (order[0][0].name, order[0][1]) == ("d0", "cache_match")
    assert balancer.place(key, ["d0", "d1", "d2"], policy.backends["g"].affinity) == 0  # followed
    for _ in range(3):
        balancer.acquire("d0")  # d0 is 3 ahead: over imbalance_abs 2
    order = await sender.order(step, key)
    assert order[0][1] == "load_guard" and order[0][0].name != "d0"
    await client.aclose()


async def test_no_fresh_index_or_no_tokens_falls_back(fleet: list[Published]) -> None:
    policy = _policy(fleet)
    target = plan_targets(policy, "m", "openai")[0]
    deps = policy.backends["g"].group("g")
    hub = KVEventHub.from_policy(policy)  # never synced: nothing usable
    async with _tokenizer(PROMPT, []) as client:
        assert await event_matches(client, hub, target, deps, BODY) is None
    hub = await _synced_hub(policy)

    def broken(req: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"detail": "Not Found"})
    async with httpx.AsyncClient(transport=httpx.MockTransport(broken)) as client:
        assert await event_matches(client, hub, target, deps, BODY) is None
    async with _tokenizer(PROMPT, []) as client:
        assert await event_matches(client, hub, target, deps, b"not json") is None
        assert await event_matches(client, KVEventHub({}), target, deps, BODY) is None
        assert await event_matches(client, hub, target, deps, BODY) == [0, 0, 0]


async def test_a_salted_request_matches_only_its_tenants_blocks(fleet: list[Published]) -> None:
    policy = _policy(fleet[:2])
    hub = await _synced_hub(policy)
    fleet[0].insert(PROMPT, salt=b"acme")
    fleet[1].insert(PROMPT)
    await _catch_up(hub)
    target = plan_targets(policy, "m", "openai")[0]
    deps = policy.backends["g"].group("g")
    salted = orjson.dumps({**orjson.loads(BODY), "cache_salt": "acme"})
    async with _tokenizer(PROMPT, []) as client:
        assert await event_matches(client, hub, target, deps, salted) == [16, 0]
        assert await event_matches(client, hub, target, deps, BODY) == [0, 16]


def test_stream_settings_come_from_the_deployment(fleet: list[Published]) -> None:
    hub = KVEventHub.from_policy(_policy(fleet[:1]))
    assert isinstance(hub.streams["d0"], KVEventStream)
    assert hub.streams["d0"].settings.replay == fleet[0].replay_at


def test_a_tie_goes_to_the_keys_placement_when_it_is_among_the_tied() -> None:
    from prefixgate.config.routing import AffinitySettings
    from prefixgate.proxy.routing.balance import Choice, choose, rendezvous

    names, ex = ["d0", "d1", "d2"], AffinitySettings(mode="exact")
    # every replica holds the shared system prompt (16 tokens): the placement keeps the key
    for placed in range(3):
        assert choose(names, [0, 0, 0], "k", ex, matches=[16, 16, 16], placed=placed) == Choice(
            placed, "cache_match")
    # the placement is not among the longest: rendezvous among those
    want = [0, 2][rendezvous("k", ["d0", "d2"])]
    assert choose(names, [0, 0, 0], "k", ex, matches=[32, 16, 32], placed=1) == Choice(
        want, "cache_match")
    assert choose(names, [0, 0, 0], "k", ex, matches=[16, 48, 16], placed=0) == Choice(
        1, "cache_match")  # a longer match beats the placement


def test_the_app_follows_the_policys_streams_while_it_runs(fleet: list[Published],
                                                           tmp_path: Any) -> None:
    import time

    from prefixgate.proxy.app import build_app
    from tests.servers import serve_app

    policy = parse_policy({**_policy(fleet[:2]).model_dump(exclude_unset=True),
                           "ledger": {"path": str(tmp_path / "l.sqlite")}})
    app = build_app(policy, rewrite_fn=None, analyze=False)
    with serve_app(app):
        hub = app.state.proxy.kv_events
        assert hub is not None and set(hub.streams) == {"d0", "d1"}
        fleet[1].insert(PROMPT)
        deadline = time.monotonic() + 10
        hashes = wire_hashes(PROMPT, 4, "sha256", "")
        while hub.streams["d1"].index.prefix_blocks(hashes) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hub.streams["d1"].usable() and len(hub.streams["d1"].index) == 4
    assert all(t.done() for t in hub._tasks) or hub._tasks == []  # stopped with the app
