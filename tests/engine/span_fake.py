"""A model-free scheduler harness for span reuse: K/V that depend only on (token, position).

``FakeModel.forward(batch)`` writes, for every computed token, ``K = R(pos) u(token)`` (a 2-d
RoPE rotation by ``pos`` radians, inv_freq 1.0) and ``V = (token, -token)``, so the K/V any
slot must hold is known exactly: a span-reused copy is right iff the copied keys equal the
fresh keys at their new positions (re-rotation) and the values are unchanged.
"""

from __future__ import annotations

import math

import torch

from prefixgate.local_engine.kv.pool import KVPool, ReqToTokenTable
from prefixgate.local_engine.kv.radix_cache import RadixCache, TreeNode
from prefixgate.local_engine.kv.span_match import SpanBounds
from prefixgate.local_engine.sched.api_types import SamplingParams
from prefixgate.local_engine.sched.scheduler import ScheduledSeq, Scheduler
from prefixgate.local_engine.sched.sequence import Sequence

CPU = torch.device("cpu")
TOKEN = 7


def make(slots: int, page: int = 1, budget: int = 64, chunk: int = 64, running: int = 4,
         bounds: SpanBounds | None = SpanBounds(2, 6, 4)) -> Scheduler:
    """A scheduler over a 1-layer pool of 2-d keys; ``bounds`` None: span reuse off."""
    from prefixgate.local_engine.sched.span_reuse import SpanReuse

    pool = KVPool(1, slots, 1, 2, torch.float32, CPU, page)
    span = None if bounds is None else SpanReuse(bounds, torch.tensor([1.0]))
    return Scheduler(pool, ReqToTokenTable(8, 512, CPU), RadixCache(page), budget, chunk,
                     running, span)


def request(rid: str, prompt: list[int], max_tokens: int = 4) -> Sequence:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return Sequence(rid, prompt, params, max_tokens, None, torch.Generator(), None,  # type: ignore[arg-type]
                    set(), lambda out: None)


def kv_of(token: int, pos: int) -> tuple[list[float], list[float]]:
    """The K (post-RoPE) and V the fake model writes for ``token`` at ``pos``."""
    a, b = 1.0 + token % 7, 0.5
    c, s = math.cos(pos), math.sin(pos)
    return [a * c - b * s, b * c + a * s], [float(token), -float(token)]


def forward(s: Scheduler, batch: list[ScheduledSeq]) -> None:
    """Write every scheduled token's K/V (the model's part of a step)."""
    for it in batch:
        seq = it.seq
        for pos in range(it.start, it.start + it.n):
            k, v = kv_of(seq.token_ids[pos], pos)
            slot = seq.slots[pos]
            s.pool.k[0][slot] = torch.tensor([k])
            s.pool.v[0][slot] = torch.tensor([v])


def check_kv(s: Scheduler, seq: Sequence, upto: int) -> None:
    """``seq``'s first ``upto`` slots hold the K/V of its tokens at their positions."""
    check_kv_range(s, seq, 0, upto)


def check_kv_range(s: Scheduler, seq: Sequence, lo: int, hi: int) -> None:
    """``seq``'s slots ``[lo, hi)`` hold the K/V of its tokens at their positions."""
    for pos in range(lo, hi):
        k, v = kv_of(seq.token_ids[pos], pos)
        slot = seq.slots[pos]
        assert torch.allclose(s.pool.k[0][slot, 0], torch.tensor(k), atol=1e-4), (pos, slot)
        assert torch.allclose(s.pool.v[0][slot, 0], torch.tensor(v)), (pos, slot)


def check_tree_kv(s: Scheduler) -> None:
    """Every slot in the tree holds the K/V of its path's token at its depth."""
    assert s.cache is not None
    for root in s.cache._roots.values():
        stack: list[tuple[TreeNode, int]] = [(c, 0) for c in root.children.values()]
        while stack:
            n, depth = stack.pop()
            for i, (tok, slot) in enumerate(zip(n.key, n.value)):
                k, v = kv_of(tok, depth + i)
                assert torch.allclose(s.pool.k[0][slot, 0], torch.tensor(k), atol=1e-4)
                assert torch.allclose(s.pool.v[0][slot, 0], torch.tensor(v))
            stack.extend((c, depth + len(n.key)) for c in n.children.values())


def step(s: Scheduler) -> tuple[list[ScheduledSeq], list[Sequence]]:
    """Schedule, compute (fake), sample TOKEN for ready requests, finish at max_tokens."""
    batch = s.schedule()
    forward(s, batch)
    done = []
    for seq in s.complete_step(batch):
        seq.token_ids.append(TOKEN)
        if seq.num_completion >= seq.max_tokens:
            s.finish(seq)
            done.append(seq)
    return batch, done
