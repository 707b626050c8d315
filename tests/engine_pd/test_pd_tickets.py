"""A decode instance answers a transfer it will never get at once, on its own bounded threads
(issue 34, item 2): made-up or altered ``kv_transfer_params`` (their ``transfer_tag`` does not
verify) are a 400, a ticket already claimed recomputes without waiting, a claim while the link
is not paired recomputes without waiting, claim waits never run on asyncio's default executor
and at most ``MAX_CLAIM_WAITERS`` wait at once."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest

from prefixgate.local_engine.pd.auth import ticket_tag, verify_ticket
from prefixgate.local_engine.pd.roles import DecodeRole, PrefillRole
from prefixgate.local_engine.server import build_app, pd_handoff
from prefixgate.local_engine.server.pd_handoff import PDHandoff, PDRequest
from prefixgate.local_engine.server.pd_setup import layout_of
from tests.engine_pd.conftest import PD_SECRET, LoopbackLink

PROMPT = list(range(400, 450))
BODY = {"model": "m", "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
PREFILL = {**BODY, "max_tokens": 1, "stream": False,
           "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}}


def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://e")


def test_the_tag_binds_the_id_the_first_tokens_and_the_prompt() -> None:
    tag = ticket_tag(PD_SECRET, 7, [3], PROMPT, b"s")
    assert verify_ticket(PD_SECRET, tag, 7, [3], PROMPT, b"s")
    for tid, first, prompt, salt, secret in ((8, [3], PROMPT, b"s", PD_SECRET),
                                             (7, [4], PROMPT, b"s", PD_SECRET),
                                             (7, [3], PROMPT[:-1], b"s", PD_SECRET),
                                             (7, [3], PROMPT, b"t", PD_SECRET),
                                             (7, [3], PROMPT, b"s", b"x" * 32)):
        assert not verify_ticket(secret, tag, tid, first, prompt, salt)
    assert not verify_ticket(PD_SECRET, None, 7, [3], PROMPT, b"s")


async def test_made_up_or_altered_params_are_a_400_and_a_replay_recomputes_at_once(
        make_engine: Any) -> None:
    pre, dec = make_engine(), make_engine()
    link = LoopbackLink(layout_of(pre, 256))
    prole = PrefillRole(pre, link)  # type: ignore[arg-type]
    drole = DecodeRole(dec, link, timeout_s=3.0)  # type: ignore[arg-type]
    link.decode = drole
    prole.start()
    p_app = build_app(pre, pd=PDHandoff("prefill", prefill_role=prole, port=1))
    d_app = build_app(dec, pd=PDHandoff("decode", decode_role=drole))
    async with _client(p_app) as pc, _client(d_app) as dc:
        params = (await pc.post("/v1/completions", json=PREFILL)).json()["kv_transfer_params"]
        assert params["transfer_id"] > 0 and len(params["transfer_tag"]) == 64
        forged = [
            {**params, "transfer_id": params["transfer_id"] + 1},  # another (unknown) transfer
            {**params, "first_token_ids": [39, 3791]},  # chosen output
            {**params, "transfer_tag": "0" * 64},
            {k: v for k, v in params.items() if k != "transfer_tag"},
        ]
        for bad in forged:
            r = await dc.post("/v1/completions", json={**BODY, "kv_transfer_params": bad})
            assert r.status_code == 400 and r.json()["error"]["param"] == "kv_transfer_params"
        other = {**BODY, "prompt": list(range(600, 650)), "kv_transfer_params": params}
        r = await dc.post("/v1/completions", json=other)  # the ticket on another prompt
        assert r.status_code == 400
        ok = await dc.post("/v1/completions", json={**BODY, "kv_transfer_params": params})
        assert ok.status_code == 200
        assert ok.json()["usage"]["prompt_tokens_details"]["kv_transfer_tokens"] == len(PROMPT)
        again = await dc.post("/v1/completions", json={**BODY, "kv_transfer_params": params})
        assert again.status_code == 200  # a replay: served, recomputed, never waited for
        stats = drole.stats()
        assert stats["kv_transfer_failures_total:replayed"] == 1
        assert "kv_transfer_failures_total:not_arrived" not in stats
        assert again.json()["choices"][0]["text"] == ok.json()["choices"][0]["text"]
    prole.stop()


def test_a_claim_while_the_link_is_not_paired_is_answered_at_once(make_engine: Any) -> None:
    dec = make_engine()
    link = LoopbackLink(layout_of(dec, 256))
    link.ready.clear()  # pairing still under way (or the peer is gone, being paired again)
    drole = DecodeRole(dec, link, timeout_s=3.0)  # type: ignore[arg-type]
    assert drole.claim(12345) is None
    stats = drole.stats()
    assert stats["kv_transfer_failures_total:link_down"] == 1
    assert "kv_transfer_failures_total:not_arrived" not in stats


class _BlockingRole:
    """A decode role whose claims wait until ``go`` is set; records the threads they ran on."""

    def __init__(self) -> None:
        self.link = type("L", (), {"secret": PD_SECRET})()
        self.go = threading.Event()
        self.threads: list[str] = []
        self.lock = threading.Lock()

    def claim(self, transfer_id: int) -> None:
        with self.lock:
            self.threads.append(threading.current_thread().name)
        self.go.wait(30)

    def stats(self) -> dict[str, Any]:
        return {}


async def test_claims_wait_on_the_handoffs_own_bounded_threads() -> None:
    role = _BlockingRole()
    hooks = PDHandoff("decode", decode_role=role)  # type: ignore[arg-type]
    n = pd_handoff.MAX_CLAIM_WAITERS
    reqs = [PDRequest("decode", transfer_id=i + 1) for i in range(n + 3)]
    waiting = [asyncio.create_task(hooks.before(r)) for r in reqs[:n]]
    for _ in range(200):
        await asyncio.sleep(0.01)
        if len(role.threads) == n:
            break
    assert len(role.threads) == n
    # the loop's default executor is free: a plain request's tokenizing is not held
    assert await asyncio.wait_for(asyncio.to_thread(lambda: 5), 10) == 5
    over = await asyncio.wait_for(asyncio.gather(*(hooks.before(r) for r in reqs[n:])), 10)
    assert over == [None, None, None]  # beyond the bound: recompute at once
    assert hooks.stats()["kv_transfer_failures_total:claims_busy"] == 3
    role.go.set()
    await asyncio.wait_for(asyncio.gather(*waiting), 30)
    assert all(t.startswith("pd-claim") for t in role.threads), role.threads


@pytest.mark.parametrize("tid", [0, 5])
def test_a_decode_request_without_a_tag_never_reaches_a_claim(tid: int) -> None:
    role = _BlockingRole()
    hooks = PDHandoff("decode", decode_role=role)  # type: ignore[arg-type]
    pd = PDRequest("decode", transfer_id=tid, first_token_ids=(17,), tag="f" * 64)
    with pytest.raises(pd_handoff.ApiError):
        asyncio.run(hooks.before(pd, PROMPT, None))
    assert role.threads == []


async def test_health_and_metrics_say_whether_the_link_is_paired_and_how_often(
        make_engine: Any) -> None:
    dec = make_engine()
    link = LoopbackLink(layout_of(dec, 256))
    link.pairings = 3  # type: ignore[attr-defined]  # the decode peer was lost twice
    link.refused = {"auth": 1}  # type: ignore[attr-defined]
    drole = DecodeRole(dec, link)  # type: ignore[arg-type]
    async with _client(build_app(dec, pd=PDHandoff("decode", decode_role=drole))) as dc:
        health = (await dc.get("/health")).json()
        assert health == {"status": "ok", "kv_link": {"role": "decode", "up": True,
                                                      "pairings": 3, "repairs": 2}}
        link.dead = True
        assert (await dc.get("/health")).json()["kv_link"]["up"] is False
        metrics = (await dc.get("/metrics")).text
        assert "engine_kv_link_up 0.0" in metrics and "engine_kv_link_repairs_total 2.0" in metrics
        assert 'engine_kv_link_pairing_failures_total{reason="auth"} 1.0' in metrics
    async with _client(build_app(dec)) as c:
        assert (await c.get("/health")).json() == {"status": "ok"}
