"""The prefill side of the two-process link tests (run in a spawned process)."""

from __future__ import annotations

import os

import torch


def run_prefill(init_method: str, heads: int, mode: str, ready: object = None) -> None:
    """Pair as rank 0; ``mode`` ``send``: send one transfer then close; ``vanish``: exit
    without a word after pairing (a lost peer); ``mismatch``: pair with another layout."""
    from prefixgate.local_engine.pd.link import KVLayout, LinkDead, PDLink

    layout = KVLayout(2, heads, 4, 1, torch.float32, 64)
    link = PDLink("prefill", init_method, layout, torch.device("cpu"),
                  timeout_s=3 if mode == "idle" else 20)
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
