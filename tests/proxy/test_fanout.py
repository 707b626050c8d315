"""First-writer gating of fan-outs (``prefixgate/proxy/routing/fanout.py``): the gate's state machine, the fan-out
simulation with hand-computed figures, and a live fan-out through the proxy against an upstream
that caches like Anthropic (an entry is readable once the writer's response has begun)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.schema import FanoutSettings
from prefixgate.proxy.app import build_app
from prefixgate.proxy.routing.fanout import MAX_KEYS, GateCore, fanout_key
from prefixgate.proxy.sim.fanout import FanoutCase, figures, simulate
from tests.proxy.conftest import make_policy
from tests.proxy.upstream import completion
from tests.servers import serve_app

ON = FanoutSettings(enabled=True, max_hold_ms=5000, ttft_factor=2.0, warm_s=300)


def test_gate_core_writer_holds_warm_and_deadline() -> None:
    g = GateCore(ON)
    assert g.arrive("k", 0.0) is None and g.is_writer("k", 0.0)        # the writer goes
    assert g.arrive("k", 0.1) == pytest.approx(5.1)                     # held: max_hold_ms
    g.answered("k", 0.5, ok=True)                                       # headers at 0.5 s
    assert g.arrive("k", 0.6) is None and not g.is_writer("k", 0.6)    # warm: straight through
    assert g.arrive("k", 301.0) is None and g.is_writer("k", 301.0)    # warm_s passed: writer
    assert g.arrive("j", 0.0) is None
    assert g.arrive("j", 0.2) == pytest.approx(0.2 + 2.0 * 0.5)         # 2 x observed TTFT
    g.answered("j", 9.0, ok=False)                                       # a failed writer
    assert "j" not in g.warm and g.arrive("j", 9.1) is None and g.is_writer("j", 9.1)


def test_gate_core_remembers_a_bounded_number_of_prefixes() -> None:
    g = GateCore(ON)
    for i in range(MAX_KEYS + 10):
        g.arrive(str(i), 0.0)
        g.answered(str(i), 0.1, ok=True)
    assert len(g.warm) == MAX_KEYS and "0" not in g.warm


def test_fanout_key_ignores_the_last_message_only() -> None:
    body = {"model": "m", "system": "s", "messages": [{"role": "user", "content": "a"}]}
    other = {**body, "messages": [{"role": "user", "content": "b"}]}
    assert fanout_key(body)[0] == fanout_key(other)[0]
    assert fanout_key(body)[0] != fanout_key({**body, "system": "t"})[0]


def test_simulation_by_hand() -> None:
    """N = 4 at 0, 1/300, 2/300, 0.01 s; prefix 1000, suffix 100; TTFT 0.3 + tokens / 20000.

    Ungated: all four start before anyone's first byte: 4 x 1100 = 4400 written; the last
    first byte is 0.01 + 0.355 = 0.365 s. Gated: the writer writes 1100 and answers at 0.355;
    the three held start then and read the prefix, writing 100 each: 1400; their first byte at
    0.355 + 0.305 = 0.66 s. Cut 3000 / 4400 = 0.682 of an ideal 3/4: 0.909; added 0.295 s,
    under the writer's TTFT of 0.355 s."""
    case = FanoutCase(4, prefix=1000, suffix=100)
    off, on = simulate(case, False), simulate(case, True)
    assert (off.write_tokens, on.write_tokens, on.held) == (4400, 1400, 3)
    assert (off.last_first_byte_s, on.last_first_byte_s) == pytest.approx((0.365, 0.66))
    fig = figures(case)
    assert fig["write_cut_share_of_ideal"] == pytest.approx(0.9091, abs=1e-4)
    assert fig["added_wall_s"] == pytest.approx(0.295) and fig["first_ttft_s"] == 0.355


@pytest.mark.parametrize("n", [4, 8, 16])
def test_fanout_goals(n: int) -> None:
    fig = figures(FanoutCase(n))
    assert fig["write_cut_share_of_ideal"] >= 0.9
    assert fig["added_wall_s"] <= fig["first_ttft_s"]


def test_a_short_deadline_releases_the_held_requests_unread() -> None:
    """Held 0.1 s at most while the writer needs 0.71 s: they go at 0.1 s and write too."""
    case = FanoutCase(8)
    on = simulate(case, True, FanoutSettings(enabled=True, max_hold_ms=100))
    assert on.write_tokens == simulate(case, False).write_tokens and on.held == 7


# ---------------------------------------------------------------------------------------------
# Live: the proxy in front of an upstream that caches like Anthropic
# ---------------------------------------------------------------------------------------------

TTFT_S = 0.4
SYSTEM = "You are one worker of a map step. " * 200


class CachingUpstream:
    """Chat Completions upstream: a request whose shared prefix (all messages but the last) a
    response has already *begun* for reads it, else writes it; answers after ``TTFT_S``."""

    def __init__(self) -> None:
        self.visible: set[str] = set()
        self.writes = 0
        self.reads = 0

    def app(self) -> Starlette:
        async def handle(request: Request) -> Response:
            body = json.loads(await request.body())
            key = json.dumps(body["messages"][:-1], sort_keys=True)
            hit = key in self.visible
            self.reads += hit
            self.writes += not hit
            await asyncio.sleep(TTFT_S)
            self.visible.add(key)  # the response begins: the entry is readable from now
            return Response(json.dumps(completion("done")), media_type="application/json")

        return Starlette(routes=[Route("/v1/chat/completions", handle, methods=["POST"])])


async def _fan_out(url: str, n: int) -> list[float]:
    async with httpx.AsyncClient(timeout=30) as client:
        async def one(i: int) -> float:
            t0 = time.perf_counter()
            r = await client.post(url + "/v1/chat/completions", json={
                "model": "m1", "messages": [{"role": "system", "content": SYSTEM},
                                            {"role": "user", "content": f"item {i}"}]})
            assert r.status_code == 200, r.text
            return time.perf_counter() - t0
        return await asyncio.gather(*(one(i) for i in range(n)))


@pytest.mark.parametrize(("enabled", "providers"), [(True, ["radix"]), (False, ["radix"]),
                                                   (True, ["anthropic", "openai"])])
def test_live_fanout_through_the_proxy(tmp_path: Path, enabled: bool,
                                       providers: list[str]) -> None:
    """The test backend is OpenAI-compatible (provider ``radix``): gated only when the policy
    lists ``radix`` (the default list leaves our engine, which shares prefixes in a batch)."""
    up = CachingUpstream()
    with serve_app(up.app()) as up_url:
        policy = make_policy(up_url, tmp_path / "ledger.sqlite", fanout={
            "enabled": enabled, "max_hold_ms": 60_000, "providers": providers})
        with serve_app(build_app(policy, ledger=Ledger(policy.ledger.path))) as url:
            times = asyncio.run(_fan_out(url, 4))
    if enabled and "radix" in providers:
        assert (up.writes, up.reads) == (1, 3)
        # released by the writer's answer, not by the 60 s deadline (a loose bound: shared CI cores)
        assert max(times) < 20.0
    else:
        assert (up.writes, up.reads) == (4, 0)


# ---------------------------------------------------------------------------------------------
# Tenants: a gate key per tenant (issue 20, Medium 8: the hold was a cross-tenant timing channel)
# ---------------------------------------------------------------------------------------------


def test_fanout_key_is_per_tenant() -> None:
    body = {"model": "m", "system": "s" * 5000, "messages": [{"role": "user", "content": "a"}]}
    keys = {t: fanout_key(body, t)[0] for t in ("", "acme", "globex", "acme/team-a")}
    assert len(set(keys.values())) == 4  # no two tenants (nor none) share a key
    assert fanout_key(body, "acme") == fanout_key(body, "acme")  # same tenant: one key
    assert fanout_key(body, "acme")[1] == fanout_key(body)[1]  # the size is the body's
    # the tenant is length-prefixed: moving bytes between the name and the body never collides
    assert fanout_key({"model": "m"}, "a")[0] != fanout_key({"model": "m"}, "a|")[0]


async def _two_at_once(gate: object, a: str, b: str) -> tuple[int, float]:
    """A's request writes (0.3 s to its headers); B's arrives 0.05 s later with the same
    prefix. Returns (holds, seconds B waited to go upstream)."""
    body = {"model": "m", "system": "s" * 5000, "messages": [{"role": "user", "content": "x"}]}
    waited: list[float] = []

    async def first() -> None:
        async with gate.turn(body, "anthropic", tenant=a):  # type: ignore[attr-defined]
            await asyncio.sleep(0.3)

    async def second() -> None:
        await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        async with gate.turn(body, "anthropic", tenant=b):  # type: ignore[attr-defined]
            waited.append(time.perf_counter() - t0)

    await asyncio.gather(first(), second())
    return gate.held, waited[0]  # type: ignore[attr-defined]


def test_another_tenants_writer_never_holds_a_request() -> None:
    from prefixgate.proxy.routing.fanout import FanoutGate

    held, waited = asyncio.run(_two_at_once(FanoutGate(ON), "acme", "globex"))
    assert held == 0 and waited < 0.1  # globex goes at once: nothing tells it acme is writing
    held, waited = asyncio.run(_two_at_once(FanoutGate(ON), "acme", "acme"))
    assert held == 1 and waited >= 0.2  # the same tenant still reads its own writer's prefix
    held, _ = asyncio.run(_two_at_once(FanoutGate(ON), "acme", "acme/team-a"))
    assert held == 0  # a sub-tenant is a tenant of its own


def test_live_fanout_holds_within_a_tenant_only(tmp_path: Path) -> None:
    """Through the proxy, tenants named by the header: two tenants' identical fan-outs each get
    their own writer; the gate holds only each tenant's followers."""
    up = CachingUpstream()

    async def fan(url: str) -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            async def one(tenant: str, i: int) -> None:
                r = await client.post(url + "/v1/chat/completions", headers={
                    "x-prefixgate-tenant": tenant}, json={
                    "model": "m1", "messages": [{"role": "system", "content": SYSTEM},
                                                {"role": "user", "content": f"item {i}"}]})
                assert r.status_code == 200, r.text
            await asyncio.gather(*(one(t, i) for t in ("acme", "globex") for i in range(2)))

    with serve_app(up.app()) as up_url:
        policy = make_policy(up_url, tmp_path / "ledger.sqlite", tenants={"header": "on"},
                             fanout={"enabled": True, "max_hold_ms": 60_000,
                                     "providers": ["radix"]})
        app = build_app(policy, ledger=Ledger(policy.ledger.path))
        with serve_app(app) as url:
            asyncio.run(fan(url))
    assert app.state.proxy.fanout.held == 2  # one follower per tenant, never across
