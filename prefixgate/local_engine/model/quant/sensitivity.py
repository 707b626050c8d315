"""Which decoder layers lose most when int8, and a prefill helper to measure it.

The engine's int8 mode keeps the LM head and ``kept_layers(...)`` in full precision
(``int8.quantize_model``); ``agreement`` / ``first_token_agreement`` are the measures that chose
them.
``prefill`` gives every position's logits of one sequence (a private KV pool), so greedy top-1
agreement can be measured teacher-forced over whole prompts (``bench/int8_sensitivity.py``,
``tests/engine/test_quant.py``) rather than on one next token per prompt.
"""

from __future__ import annotations

from typing import Any

import torch

from prefixgate.local_engine.kv.pool import KVPool
from prefixgate.local_engine.model.attention import AttnMeta, prefill_group
from prefixgate.local_engine.model.llama import CausalLM, rope_tables


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


# Layers ranked most sensitive first, per measured shape ``(num_layers, hidden_size)``: greedy
# top-1 agreement with only that layer int8, teacher-forced (``bench/int8_sensitivity.py`` ->
# ``bench/results/int8_sensitivity.json``, ``most_sensitive_layers``; SmolLM2-135M-Instruct).
MEASURED_SENSITIVITY: dict[tuple[int, int], tuple[int, ...]] = {
    (30, 576): (29, 18, 8, 28, 0, 9),
}


def kept_layers(num_layers: int, hidden_size: int, keep: int) -> list[int]:
    """The ``keep`` decoder layers int8 mode leaves in full precision, sorted ascending.

    A shape in ``MEASURED_SENSITIVITY`` takes its measured ranking first (then ``edge_layers``'
    order for any beyond it); any other model the positional rule ``edge_layers``. Chosen by
    ``bench/int8_keep_sweep.py`` (``bench/results/int8_keep_sweep.json``): on SmolLM2-135M the 6
    measured layers gave first-token greedy agreement 0.983 on the int8 benchmark's 60 prompts
    against 0.95 with the 2 edge layers, 0.967 with 4 and 0.95 with 6 edge layers.
    """
    ranked = MEASURED_SENSITIVITY.get((num_layers, hidden_size), ())
    order = list(ranked[:keep])
    for i in _edge_order(num_layers):
        if len(order) >= keep:
            break
        if i not in order:
            order.append(i)
    return sorted(order)


def _edge_order(num_layers: int) -> list[int]:
    """Layer indices from the ends inwards: last, first, second-last, second, ..."""
    out: list[int] = []
    lo, hi = 0, num_layers - 1
    while lo <= hi:
        out.append(hi)
        if lo != hi:
            out.append(lo)
        lo, hi = lo + 1, hi - 1
    return out


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
    return sorted(_edge_order(num_layers)[:max(0, keep)])


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
