"""The prefill side of the two-process link tests (run in a spawned process)."""

from __future__ import annotations

import os

import torch


def run_prefill(init_method: str, heads: int, mode: str) -> None:
    """Pair as rank 0; ``mode`` ``send``: send one transfer then close; ``vanish``: exit
    without a word after pairing (a lost peer); ``mismatch``: pair with another layout."""
    from prefixgate.local_engine.pd_link import KVLayout, LinkDead, PDLink

    layout = KVLayout(2, heads, 4, 1, torch.float32, 64)
    link = PDLink("prefill", init_method, layout, torch.device("cpu"), timeout_s=20)
    try:
        link.start()
    except LinkDead:
        os._exit(3)
    if mode == "vanish":
        os._exit(0)

    def fill(view: torch.Tensor) -> None:
        view.copy_(torch.arange(view.numel(), dtype=torch.float32).view_as(view))

    link.send(77, 2, [5, 6, 7, 8, 9], b"salt", fill)
    link.close()
