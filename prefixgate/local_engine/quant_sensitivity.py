"""Which decoder layers lose most when int8, and a prefill helper to measure it.

``quant.quantize_model`` keeps the LM head and ``edge_layers(n, keep)`` in full precision.
``prefill`` gives every position's logits of one sequence (a private KV pool), so greedy top-1
agreement can be measured teacher-forced over whole prompts (``bench/int8_sensitivity.py``,
``tests/engine/test_quant.py``) rather than on one next token per prompt.
"""

from __future__ import annotations

from typing import Any

import torch

from prefixgate.local_engine.attention import AttnMeta, prefill_group
from prefixgate.local_engine.kv_pool import KVPool
from prefixgate.local_engine.model import CausalLM, rope_tables


def prefill(model: CausalLM, ids: list[int]) -> torch.Tensor:
    """Logits ``[len(ids), vocab]`` fp32 of one sequence's prefill on a private KV pool (the
    model's device). Raises ``ValueError`` for an empty ``ids``."""
    if not ids:
        raise ValueError("prefill needs at least one token")
    a, dev, dt = model.args, model.embed.weight.device, model.embed.weight.dtype
    n = len(ids)
    pool = KVPool(a.num_layers, n, a.num_kv_heads, a.head_dim, dt, dev)
    cos, sin = rope_tables(a, n, dt, dev)
    gqa = a.num_heads // a.num_kv_heads
    pos = torch.arange(n, device=dev)
    meta = AttnMeta(cos=cos.unsqueeze(1), sin=sin.unsqueeze(1), out_slots=pos,
                    groups=[prefill_group(0, 0, n, pos, gqa, dev)], gqa=gqa)
    with torch.no_grad():
        return model(torch.tensor(ids, device=dev), meta, pool, pos)


def edge_layers(num_layers: int, keep: int) -> list[int]:
    """The ``keep`` layers to leave in full precision: from the ends inwards (last, first,
    second-last, second, ...), sorted ascending.

    Source: ``bench/int8_sensitivity.py`` on SmolLM2-135M-Instruct — with one layer int8 at a
    time, teacher-forced greedy top-1 agreement was lowest for layer 29 in both runs (0.963 on 6
    prompts / 1398 positions; 0.960 on 3 prompts / 575 positions, the recorded JSON), with 0 and
    28 among the five lowest in both (the middle layers mostly 0.98-0.99; 18 and 8 varied). A
    per-product output-error proxy on a calibration prefill did not find them (it ranked 9, 12,
    13, 25 first), so the rule is positional, as llama.cpp's quantization mixes give the first
    and last layers more bits.
    """
    order: list[int] = []
    lo, hi = 0, num_layers - 1
    while lo <= hi and len(order) < keep:
        order.append(hi)
        if lo != hi and len(order) < keep:
            order.append(lo)
        lo, hi = lo + 1, hi - 1
    return sorted(order)


def first_token_agreement(ref: list[int], got: list[int]) -> float:
    """Share of prompts whose first greedy completion token ``got[i]`` equals ``ref[i]`` (the
    int8 benchmark's figure, ``bench/engine_speculative.py``), rounded to 4 places. Raises
    ``ValueError`` when the lists differ in length or are empty."""
    if not ref or len(ref) != len(got):
        raise ValueError(f"agreement needs two equal, non-empty lists ({len(ref)} vs {len(got)})")
    return round(sum(int(a) == int(b) for a, b in zip(ref, got)) / len(ref), 4)


def agreement(ref_top: list[torch.Tensor], got_top: list[torch.Tensor]) -> dict[str, Any]:
    """Greedy agreement of two models over the same prompts, teacher-forced.

    ``ref_top`` / ``got_top``: per prompt the argmax token ids ``[len(prompt)]`` of every
    position (``prefill(...).argmax(-1)``). Returns ``first_token_agreement`` (share of prompts
    whose last position agrees: the token greedy decoding emits first), ``teacher_forced_
    agreement`` (share of all positions, each prompt weighted by its length) and
    ``disagreeing_prompts`` (indices whose last position differs). Raises ``ValueError`` when
    the lists differ in length or are empty, or a prompt's positions differ in number.
    """
    if not ref_top or len(ref_top) != len(got_top):
        raise ValueError(f"agreement needs two equal, non-empty lists ({len(ref_top)} vs {len(got_top)})")
    same = total = 0
    for i, (r, g) in enumerate(zip(ref_top, got_top)):
        if r.shape != g.shape:
            raise ValueError(f"prompt {i}: {tuple(r.shape)} positions against {tuple(g.shape)}")
        same += int((r == g).sum())
        total += r.numel()
    bad = [i for i, (r, g) in enumerate(zip(ref_top, got_top)) if int(r[-1]) != int(g[-1])]
    return {"first_token_agreement": first_token_agreement([int(r[-1]) for r in ref_top],
                                                           [int(g[-1]) for g in got_top]),
            "teacher_forced_agreement": round(same / total, 4), "disagreeing_prompts": bad}
