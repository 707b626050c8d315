"""Prefill and decode roles over a loopback link: the KV moved is the KV the decode side uses
(greedy output identical to colocated), only the uncached suffix moves, and abort / timeout /
a lost peer leave no page locked on either side."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from prefixgate.local_engine.pd import roles as pd_roles
from prefixgate.local_engine.pd.link import LinkDead
from prefixgate.local_engine.pd.roles import DecodeRole, PrefillRole
from prefixgate.local_engine.sched.api_types import SamplingParams
from prefixgate.local_engine.server.pd_setup import layout_of
from tests.engine_pd.conftest import LoopbackLink

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
ONE = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


def _pair(make_engine: Any, timeout_s: float = 5.0, chunk: int = 256, **kw: Any
          ) -> tuple[Any, Any, PrefillRole, DecodeRole, LoopbackLink]:
    pre, dec = make_engine(**kw), make_engine(**kw)
    link = LoopbackLink(layout_of(pre, 512))
    prole = PrefillRole(pre, link, timeout_s)
    drole = DecodeRole(dec, link, timeout_s, import_chunk_tokens=chunk)  # type: ignore[arg-type]
    link.decode = drole
    prole.start()
    return pre, dec, prole, drole, link


def _settle(eng: Any) -> None:
    eng.call(lambda: None).result(timeout=10)  # lock releases queued before this have run


def _decode(dec: Any, prompt: list[int], given: list[int] | None) -> list[Any]:
    """Every ``RequestOutput`` of a greedy decode request (``given_ids`` handed over)."""
    async def run() -> list[Any]:
        return [o async for o in dec.generate(prompt, GREEDY, given_ids=given)]
    return asyncio.run(run())


def _split_run(pre: Any, dec: Any, prole: PrefillRole, drole: DecodeRole, prompt: list[int],
               hand_first: bool = True) -> tuple[list[int], Any, list[Any]]:
    """Prefill on ``pre`` (one token), export, import, decode on ``dec`` with the prefill's
    first token handed over (``hand_first``) or recomputed; (completion ids, ticket, outputs)."""
    first = pre.generate_batch([prompt], ONE)[0]
    start = dec.cache.peek_prefix_len(prompt)
    ticket = prole.export(prompt, None, start)
    pending = drole.claim(ticket.transfer_id, 5.0) if ticket.transfer_id else None
    outs = _decode(dec, prompt, first if hand_first else None)
    if pending is not None:
        drole.unclaim(pending)
    return [t for o in outs for t in o.new_token_ids], ticket, outs


def test_split_greedy_output_is_identical_to_colocated(make_engine: Any) -> None:
    prompt = list(range(100, 160))
    colo = make_engine().generate_batch([prompt], GREEDY)[0]
    pre, dec, prole, drole, link = _pair(make_engine)
    out, ticket, outs = _split_run(pre, dec, prole, drole, prompt)
    assert out == colo
    assert ticket.start == 0 and ticket.num_tokens == len(prompt)  # the last prompt token too
    # the prefill side's first token is the decode side's first output, before any forward
    assert outs[0].new_token_ids == colo[:1] and outs[0].scheduled_at is None
    assert dec.stats()["cache_hit_tokens_total"] == len(prompt)  # no prompt token recomputed
    assert dec.stats()["prefill_tokens_total"] == 0
    assert dec.stats()["decode_tokens_total"] == len(colo) - 1  # one step per later token
    _settle(pre)
    _settle(dec)
    assert pre.cache.protected_size == 0 and dec.cache.protected_size == 0
    assert drole.stats()["kv_transfer_tokens_total"] == len(prompt)
    prole.stop()


def test_without_the_first_token_the_decode_side_recomputes_the_last_one(
        make_engine: Any) -> None:
    prompt = list(range(100, 160))
    colo = make_engine().generate_batch([prompt], GREEDY)[0]
    pre, dec, prole, drole, link = _pair(make_engine)
    out, ticket, outs = _split_run(pre, dec, prole, drole, prompt, hand_first=False)
    assert out == colo and outs[0].scheduled_at is not None
    assert dec.stats()["cache_hit_tokens_total"] == len(prompt) - 1  # vLLM's recompute
    assert dec.stats()["decode_tokens_total"] == len(colo)
    prole.stop()


def test_a_handed_first_token_that_ends_the_request_runs_no_step(make_engine: Any) -> None:
    pre, dec, prole, drole, link = _pair(make_engine)
    prompt = list(range(100, 140))
    first = pre.generate_batch([prompt], ONE)[0]

    async def run() -> list[Any]:
        return [o async for o in dec.generate(prompt, ONE, given_ids=first)]
    outs = asyncio.run(run())
    assert [o.new_token_ids for o in outs] == [first] and outs[-1].finished
    assert outs[-1].finish_reason == "length" and outs[-1].completion_tokens == 1
    assert dec.stats()["decode_tokens_total"] == 0 and dec.stats()["num_running"] == 0
    with pytest.raises(ValueError, match="given token id"):
        _decode(dec, prompt, [10 ** 9])
    prole.stop()


def test_a_follow_up_turn_moves_only_what_the_decode_side_lacks(make_engine: Any) -> None:
    pre, dec, prole, drole, _ = _pair(make_engine)
    turn1 = list(range(200, 240))
    _split_run(pre, dec, prole, drole, turn1)
    turn2 = turn1 + list(range(300, 320))
    colo = make_engine().generate_batch([turn2], GREEDY)[0]
    out, ticket, _ = _split_run(pre, dec, prole, drole, turn2)
    assert ticket.start >= len(turn1)  # the decode side holds turn 1 (and its answer)
    assert ticket.num_tokens == len(turn2) - ticket.start
    assert ticket.num_tokens < 25
    assert out == colo
    prole.stop()


def test_an_unclaimed_import_is_released_at_its_timeout(make_engine: Any) -> None:
    pre, dec, prole, drole, _ = _pair(make_engine, timeout_s=0.3)
    prompt = list(range(10, 50))
    pre.generate_batch([prompt], ONE)
    ticket = prole.export(prompt, None, 0)
    deadline = time.monotonic() + 5
    while drole.pending_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    _settle(dec)
    free = dec.pool.free_slots
    # written, held for its request, but not in the tree: nobody else hits it (issue 34)
    assert dec.cache.peek_prefix_len(prompt) == 0 and dec.cache.protected_size == 0
    time.sleep(0.6)
    _settle(dec)
    assert dec.cache.protected_size == 0 and dec.cache.peek_prefix_len(prompt) == 0
    assert dec.pool.free_slots == free + len(prompt)  # its pages went back unused
    assert drole.claim(ticket.transfer_id, 0.05) is None
    assert drole.stats()["kv_transfer_failures_total:timeout"] == 1
    prole.stop()


def test_a_lost_peer_releases_the_decode_sides_imports_and_wakes_waiters(make_engine: Any) -> None:
    pre, dec, prole, drole, link = _pair(make_engine)
    prompt = list(range(10, 40))
    pre.generate_batch([prompt], ONE)
    prole.export(prompt, None, 0)
    deadline = time.monotonic() + 5
    while drole.pending_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    link.dead = True
    drole.on_dead()
    _settle(dec)
    assert dec.cache.protected_size == 0 and drole.pending_count() == 0
    t0 = time.monotonic()
    assert drole.claim(12345, 5.0) is None  # dead link: no wait for the full timeout
    assert time.monotonic() - t0 < 1.0
    prole.stop()


def test_a_send_that_fails_releases_the_prefill_sides_lock(make_engine: Any) -> None:
    pre, dec, prole, drole, link = _pair(make_engine)
    prompt = list(range(10, 40))
    pre.generate_batch([prompt], ONE)
    link.fail_next = True
    prole.export(prompt, None, 0)
    deadline = time.monotonic() + 5
    while not prole.stats().get("kv_transfer_failures_total:link_down") and time.monotonic() < deadline:
        time.sleep(0.02)
    _settle(pre)
    assert pre.cache.protected_size == 0
    assert dec.cache.protected_size == 0 and drole.pending_count() == 0
    with pytest.raises(LinkDead):
        prole.export(prompt, None, 0)  # the link is down now: refused, nothing locked
    _settle(pre)
    assert pre.cache.protected_size == 0
    prole.stop()


def test_a_transfer_queued_past_its_timeout_is_released_unsent(make_engine: Any) -> None:
    pre, dec, prole, drole, link = _pair(make_engine, timeout_s=0.0)
    prompt = list(range(10, 40))
    pre.generate_batch([prompt], ONE)
    prole.export(prompt, None, 0)
    deadline = time.monotonic() + 5
    while not prole.stats().get("kv_transfer_failures_total:timeout") and time.monotonic() < deadline:
        time.sleep(0.02)
    _settle(pre)
    assert link.sent == 0 and pre.cache.protected_size == 0
    prole.stop()


def test_claim_then_abort_releases_the_import(make_engine: Any) -> None:
    pre, dec, prole, drole, _ = _pair(make_engine)
    prompt = list(range(60, 90))
    pre.generate_batch([prompt], ONE)
    ticket = prole.export(prompt, None, 0)
    pending = drole.claim(ticket.transfer_id, 5.0)
    assert pending is not None and pending.new_tokens == len(prompt)
    _settle(dec)
    assert dec.cache.protected_size == len(prompt)
    drole.unclaim(pending)  # the decode request went away before admission
    _settle(dec)
    assert dec.cache.protected_size == 0
    prole.stop()


def test_nothing_to_send_when_the_decode_side_holds_the_prompt(make_engine: Any) -> None:
    pre, dec, prole, drole, link = _pair(make_engine)
    prompt = list(range(60, 90))
    dec.generate_batch([prompt], ONE)
    out, ticket, _ = _split_run(pre, dec, prole, drole, prompt)
    assert ticket.transfer_id == 0 and ticket.num_tokens == 0 and link.sent == 0
    _settle(pre)
    assert pre.cache.protected_size == 0
    prole.stop()


def test_an_idle_prefill_side_sends_heartbeats(make_engine: Any) -> None:
    pre, dec, prole, drole, link = _pair(make_engine)
    link.timeout_s = 0.3
    prole.stop()  # the loop picks the new timeout up on a fresh start
    prole2 = PrefillRole(pre, link, 5.0)
    link.dead = False
    prole2.start()
    time.sleep(0.6)
    assert getattr(link, "pings", 0) >= 1
    prole2.stop()


def _keep_busy(eng: Any, request_id: str) -> threading.Thread:
    """A long greedy decode running on ``eng`` in a thread (abort it by ``request_id``)."""
    long = SamplingParams(max_tokens=450, temperature=0.0, ignore_eos=True)

    async def run() -> None:
        async for _ in eng.generate(list(range(5, 15)), long, request_id=request_id):
            pass
    th = threading.Thread(target=lambda: asyncio.run(run()), daemon=True)
    th.start()
    deadline = time.monotonic() + 10
    while not eng.scheduler.has_work() and time.monotonic() < deadline:
        time.sleep(0.005)
    return th


def test_a_long_import_is_written_a_chunk_per_engine_step(make_engine: Any,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    pre, dec, prole, drole, _ = _pair(make_engine, chunk=16)
    colo = make_engine().generate_batch([list(range(300, 364))], GREEDY)[0]
    writes: list[tuple[int, int, int]] = []  # (steps run when it ran, first row, end row)
    real = pd_roles.write_import

    def spy(pool: Any, res: Any, kv: Any, lo: int, hi: int) -> None:
        writes.append((dec.steps_run, lo, hi))
        real(pool, res, kv, lo, hi)
    monkeypatch.setattr(pd_roles, "write_import", spy)
    busy = _keep_busy(dec, "busy")
    out, ticket, _ = _split_run(pre, dec, prole, drole, list(range(300, 364)))
    dec.abort("busy")
    busy.join(timeout=10)
    assert ticket.num_tokens == 64
    assert [(lo, hi) for _, lo, hi in writes] == [(0, 16), (16, 32), (32, 48), (48, 64)]
    steps = [s for s, _, _ in writes]
    assert all(b > a for a, b in zip(steps, steps[1:]))  # a decode step between two chunks
    assert out == colo  # the pieces make the same KV
    _settle(dec)
    assert dec.cache.protected_size == 0
    prole.stop()


def test_an_import_that_fails_midway_gives_its_pages_back(make_engine: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    pre, dec, prole, drole, _ = _pair(make_engine, chunk=16)
    real = pd_roles.write_import
    calls: list[int] = []

    def fail_second(pool: Any, res: Any, kv: Any, lo: int, hi: int) -> None:
        calls.append(lo)
        if len(calls) == 2:
            raise RuntimeError("copy failed")
        real(pool, res, kv, lo, hi)
    monkeypatch.setattr(pd_roles, "write_import", fail_second)
    free = dec.pool.free_slots
    prompt = list(range(400, 448))
    pre.generate_batch([prompt], ONE)
    ticket = prole.export(prompt, None, 0)
    t0 = time.monotonic()
    assert drole.claim(ticket.transfer_id, 5.0) is None  # recompute, at once
    assert time.monotonic() - t0 < 1.0
    _settle(dec)
    assert dec.pool.free_slots == free and dec.cache.protected_size == 0
    assert dec.cache.peek_prefix_len(prompt) == 0  # nothing half-written entered the tree
    assert drole.stats()["kv_transfer_failures_total:error"] == 1
    prole.stop()


def test_kv_nobody_claimed_is_never_a_prefix_other_requests_hit(make_engine: Any) -> None:
    """Issue 34: a transfer arrives and its decode request never comes; another request for
    the same prompt on the decode instance computes it itself (no cache hit on KV that no
    request here asked for), and once claimed the same import is hit."""
    pre, dec, prole, drole, _ = _pair(make_engine, timeout_s=5.0)
    prompt = list(range(70, 110))
    pre.generate_batch([prompt], ONE)
    ticket = prole.export(prompt, None, 0)
    deadline = time.monotonic() + 5
    while drole.pending_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert drole.pending_count() == 1
    other = _decode(dec, prompt, None)
    assert other[-1].cached_tokens == 0  # another request: no hit on the unclaimed import
    pending = drole.claim(ticket.transfer_id, 5.0)
    assert pending is not None and pending.handle is not None
    _settle(dec)
    assert dec.cache.protected_size >= len(prompt)  # claimed: in the tree, locked for it
    drole.unclaim(pending)
    _settle(dec)
    assert dec.cache.protected_size == 0
    prole.stop()
