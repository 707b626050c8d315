"""The P/D link proves both peers and pairs again after a lost one (issue 34, items 1 and 9),
across real processes (gloo): a process without the pair's secret is refused whichever rank it
takes — as a fake decode instance it receives no prompt token, as a fake prefill instance it
injects no KV — and a prefill instance whose decode instance died pairs with the restarted one.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import socket
import threading
from collections.abc import Iterator

import pytest
import torch

from prefixgate.local_engine.pd.link import KVLayout, LinkDead, PDLink
from prefixgate.local_engine.pd.roles import _supervise
from tests.engine_pd.pd_link_peer import SECRET, run_decode_once, run_decode_try, run_prefill

WRONG = b"not-the-pair-secret-0123456789ab"


@pytest.fixture(autouse=True)
def _fresh_group() -> Iterator[None]:
    yield None
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


PEER_START_S = 240
"""How long a test waits for a spawned peer's first word. The peer is a fresh interpreter that
imports torch: under a loaded machine (the suite at -n 2 beside a benchmark) that alone took
over 90 s, while the pairing after it takes 1-2 s (timed with a 2 s prefill timeout and four
busy loops beside it: the decode side paired on its third attempt each time it started)."""


def _url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _layout() -> KVLayout:
    return KVLayout(2, 2, 4, 1, torch.float32, 64)


@pytest.mark.slow
def test_a_decode_peer_without_the_secret_is_refused_before_any_token_crosses() -> None:
    url = _url()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=run_decode_once, args=(url, WRONG, out))
    p.start()
    link = PDLink("prefill", url, _layout(), torch.device("cpu"), timeout_s=20, secret=SECRET)
    with pytest.raises(LinkDead) as e:
        link.start()
    assert e.value.reason == "auth" and link.refused["auth"] == 1
    assert link.dead and not link.ready.is_set() and link.pairings == 0
    with pytest.raises(LinkDead):  # nothing can be sent to it
        link.send(5, 0, [1, 2, 3], None, lambda v: None)
    assert out.get(timeout=60) == "refused:auth"  # it refused us too
    p.join(timeout=60)


@pytest.mark.slow
def test_a_prefill_peer_without_the_secret_cannot_inject_kv() -> None:
    url = _url()
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=run_prefill, args=(url, 2, "send", None, WRONG))
    p.start()
    link = PDLink("decode", url, _layout(), torch.device("cpu"), timeout_s=20, secret=SECRET)
    with pytest.raises(LinkDead) as e:
        link.start()
    assert e.value.reason == "auth" and link.dead
    p.join(timeout=60)
    assert p.exitcode == 3  # the fake prefill side was refused before it could send


@pytest.mark.slow
def test_a_prefill_side_pairs_again_with_a_restarted_decode_instance() -> None:
    url = _url()
    link = PDLink("prefill", url, _layout(), torch.device("cpu"), timeout_s=5, secret=SECRET)
    stop = threading.Event()

    def session() -> None:  # one transfer per pairing, its id the pairing's number
        link.send(link.pairings, 0, [1, 2, 3], None, lambda v: v.fill_(1.0))
        while not link.dead and not stop.wait(0.2):
            try:
                link.ping()
            except LinkDead:
                return

    t = threading.Thread(target=_supervise, args=(link, stop, session), daemon=True)
    t.start()
    ctx = mp.get_context("spawn")
    got = []
    try:
        for _ in range(2):  # a decode instance that dies after one transfer, then its restart
            out = ctx.Queue()
            p = ctx.Process(target=run_decode_once, args=(url, SECRET, out))
            p.start()
            try:
                got.append(out.get(timeout=PEER_START_S))
            except queue.Empty:
                got.append(None)
            p.join(timeout=30)
    finally:
        stop.set()
        t.join(timeout=30)
    assert got == [1, 2]
    assert link.pairings == 2


@pytest.mark.slow
def test_a_prefill_side_that_waited_through_failed_pairings_still_pairs_with_a_late_peer() -> None:
    """Each failed pairing attempt (no peer within the timeout) must leave nothing that the next
    one depends on: torch counts a group for a failed init and names the group's store keys by
    that count, so without a reset the two sides waited on different keys forever (found with
    two real engines: a restarted decode engine never paired)."""
    url = _url()
    link = PDLink("prefill", url, _layout(), torch.device("cpu"), timeout_s=2, secret=SECRET)
    stop = threading.Event()

    def session() -> None:
        link.send(link.pairings, 0, [1, 2, 3], None, lambda v: v.fill_(1.0))
        while not link.dead and not stop.wait(0.2):
            try:
                link.ping()
            except LinkDead:
                return

    t = threading.Thread(target=_supervise, args=(link, stop, session), daemon=True)
    t.start()
    ctx = mp.get_context("spawn")
    try:
        import time
        end = time.monotonic() + 60
        while link.refused["rendezvous"] < 2 and time.monotonic() < end:
            time.sleep(0.1)
        assert link.refused["rendezvous"] >= 2  # two attempts failed: nobody came
        out = ctx.Queue()
        p = ctx.Process(target=run_decode_once, args=(url, SECRET, out))
        p.start()
        try:  # a spawned interpreter importing torch on a loaded 2-core box: minutes, not s
            got = out.get(timeout=PEER_START_S)
        except queue.Empty:
            got = None
        p.join(timeout=30)
    finally:
        stop.set()
        t.join(timeout=30)
    assert got == 1 and link.pairings == 1


@pytest.mark.slow
def test_a_second_decode_rank_is_refused_while_the_link_is_paired() -> None:
    url = _url()
    ctx = mp.get_context("spawn")
    out_a, out_b, hold = ctx.Queue(), ctx.Queue(), ctx.Event()
    link = PDLink("prefill", url, _layout(), torch.device("cpu"), timeout_s=20, secret=SECRET)
    pairing = threading.Thread(target=link.start, daemon=True)
    pairing.start()
    a = ctx.Process(target=run_decode_try, args=(url, SECRET, out_a, hold))
    a.start()
    try:
        assert out_a.get(timeout=PEER_START_S) == "paired"
        pairing.join(timeout=30)
        b = ctx.Process(target=run_decode_try, args=(url, SECRET, out_b, hold))
        b.start()
        assert out_b.get(timeout=PEER_START_S) == "refused:second_rank"
        b.join(timeout=30)
        assert link.pairings == 1 and link.ready.is_set() and not link.dead  # the first one's
    finally:
        hold.set()
        a.join(timeout=30)
