"""The peer side of the two-process link tests (run in a spawned process)."""

from __future__ import annotations

import os

import torch

SECRET = b"test-pd-secret-0123456789abcdef"  # tests.engine_pd.conftest.PD_SECRET


def run_prefill(init_method: str, heads: int, mode: str, ready: object = None,
                secret: bytes = SECRET) -> None:
    """Pair as rank 0; ``mode`` ``send``: send one transfer then close; ``vanish``: exit
    without a word after pairing (a lost peer); ``mismatch``: pair with another layout."""
    from prefixgate.local_engine.pd.link import KVLayout, LinkDead, PDLink

    layout = KVLayout(2, heads, 4, 1, torch.float32, 64)
    link = PDLink("prefill", init_method, layout, torch.device("cpu"),
                  timeout_s=3 if mode == "idle" else 20, secret=secret)
    if ready is not None:
        ready.set()  # type: ignore[attr-defined]  # imports done: pairing is quick now
    try:
        link.start()
    except LinkDead:
        os._exit(3)
    if mode == "vanish":
        os._exit(0)
    if mode == "idle":  # idle past the receive timeout, kept alive by heartbeats
        import time
        for _ in range(10):
            time.sleep(0.5)
            link.ping()

    def fill(view: torch.Tensor) -> None:
        view.copy_(torch.arange(view.numel(), dtype=torch.float32).view_as(view))

    link.send(77, 2, [5, 6, 7, 8, 9], b"salt", fill)
    link.close()


def run_decode_once(init_method: str, secret: bytes, out: object) -> None:
    """Pair as rank 1, put the first transfer's id on the queue ``out`` (or ``refused:<reason>``
    when pairing is refused), then exit without a word (a decode instance that dies)."""
    from prefixgate.local_engine.pd.link import KVLayout, LinkDead, PDLink, Received

    link = PDLink("decode", init_method, KVLayout(2, 2, 4, 1, torch.float32, 64),
                  torch.device("cpu"), timeout_s=20, secret=secret)
    for _ in range(20):  # the running prefill side may still hold its last pairing's store
        try:
            link.start()
            break
        except LinkDead as exc:
            if exc.reason == "auth":
                _say(out, f"refused:{exc.reason}")
                os._exit(3)
            import time
            time.sleep(0.5)

    def on_transfer(r: Received) -> None:
        _say(out, r.transfer_id)
        os._exit(0)

    link.receive_forever(on_transfer, lambda: os._exit(4))


def _say(out: object, what: object) -> None:
    """Put ``what`` on the queue and flush it (``os._exit`` would drop a pending put)."""
    out.put(what)  # type: ignore[attr-defined]
    out.close()  # type: ignore[attr-defined]
    out.join_thread()  # type: ignore[attr-defined]


def run_decode_try(init_method: str, secret: bytes, out: object, hold: object) -> None:
    """Try to pair once as rank 1; put ``paired`` or ``refused:<reason>`` on ``out``; a paired
    process stays until ``hold`` (an Event) is set."""
    from prefixgate.local_engine.pd.link import KVLayout, LinkDead, PDLink

    link = PDLink("decode", init_method, KVLayout(2, 2, 4, 1, torch.float32, 64),
                  torch.device("cpu"), timeout_s=10, secret=secret)
    try:
        link.start()
    except LinkDead as exc:
        _say(out, f"refused:{exc.reason}")
        os._exit(3)
    out.put("paired")  # type: ignore[attr-defined]
    hold.wait(60)  # type: ignore[attr-defined]
    os._exit(0)
