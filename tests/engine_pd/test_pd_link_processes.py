"""PDLink across two real processes (gloo): what one sends the other receives, bit for bit; a
peer that vanishes ends the receiver with ``on_dead``; different KV layouts refuse to pair."""

from __future__ import annotations

import multiprocessing as mp
import socket
import threading
from collections.abc import Iterator

import pytest
import torch

from prefixgate.local_engine.pd.link import KVLayout, LinkDead, PDLink, Received
from tests.engine_pd.pd_link_peer import SECRET, run_prefill


@pytest.fixture(autouse=True)
def _fresh_group() -> Iterator[None]:
    """One process group per test (a process joins one group at a time)."""
    yield None
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _decode(url: str, heads: int = 2, timeout_s: float = 20) -> PDLink:
    return PDLink("decode", url, KVLayout(2, heads, 4, 1, torch.float32, 64), torch.device("cpu"),
                  timeout_s=timeout_s, secret=SECRET)


def _spawn(url: str, heads: int, mode: str, wait_ready: bool = False) -> mp.process.BaseProcess:
    ctx = mp.get_context("spawn")
    ready = ctx.Event() if wait_ready else None
    p = ctx.Process(target=run_prefill, args=(url, heads, mode, ready))
    p.start()
    if ready is not None:
        assert ready.wait(60)
    return p


def _receive(link: PDLink) -> tuple[list[Received], threading.Event]:
    got: list[Received] = []
    dead = threading.Event()

    def on(r: Received) -> None:
        got.append(Received(r.transfer_id, r.start, r.tokens, r.extra_key, r.kv.clone()))

    t = threading.Thread(target=link.receive_forever, args=(on, dead.set), daemon=True)
    t.start()
    t.join(timeout=60)
    return got, dead


@pytest.mark.slow
def test_one_transfer_crosses_and_a_close_ends_the_receiver() -> None:
    url = _url()
    p = _spawn(url, 2, "send")
    link = _decode(url)
    link.start()
    got, dead = _receive(link)
    p.join(timeout=60)
    assert dead.is_set() and len(got) == 1
    r = got[0]
    assert (r.transfer_id, r.start, r.tokens, r.extra_key) == (77, 2, [5, 6, 7, 8, 9], b"salt")
    assert r.kv.shape == (2, 2, 3, 2, 4)
    assert torch.equal(r.kv.reshape(-1), torch.arange(r.kv.numel(), dtype=torch.float32))


@pytest.mark.slow
def test_a_vanished_peer_ends_the_receiver_with_on_dead() -> None:
    url = _url()
    p = _spawn(url, 2, "vanish")
    link = _decode(url)
    link.start()
    got, dead = _receive(link)
    p.join(timeout=60)
    assert dead.is_set() and got == [] and link.dead


@pytest.mark.slow
def test_different_layouts_refuse_to_pair() -> None:
    url = _url()
    p = _spawn(url, 3, "mismatch")
    link = _decode(url, heads=2)
    with pytest.raises(LinkDead, match="layouts differ"):
        link.start()
    p.join(timeout=60)
    assert p.exitcode == 3 and link.dead


@pytest.mark.slow
def test_heartbeats_keep_an_idle_link_past_its_receive_timeout() -> None:
    url = _url()
    p = _spawn(url, 2, "idle", wait_ready=True)
    link = _decode(url, timeout_s=3)
    link.start()
    got, dead = _receive(link)  # the peer idles 5 s (> 3 s) with pings, then sends
    p.join(timeout=60)
    assert dead.is_set() and len(got) == 1 and got[0].transfer_id == 77
