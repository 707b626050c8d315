"""Next-token sampling: greedy, temperature, top-k, top-p, with a generator per request.

Rows with temperature 0 take the argmax. Other rows are scaled by 1/temperature, filtered by
top-k then top-p (nucleus, Holtzman et al. 2019: keep the smallest set of tokens whose
probability mass reaches p, always at least one), and drawn with ``torch.multinomial`` from the
request's own ``torch.Generator`` — so a seeded request gives the same tokens whatever else is in
the batch.
"""

from __future__ import annotations

import random

import torch

from prefixgate.local_engine.api_types import SamplingParams


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    """A generator seeded with ``seed`` (or a fresh random seed when None)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed if seed is not None else random.getrandbits(63))
    return gen


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask ``logits [V]`` outside top-k and top-p to -inf (returns a new tensor)."""
    out = logits
    if 0 < top_k < out.shape[-1]:
        kth = torch.topk(out, top_k).values[-1]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop_sorted[0] = False
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def apply_logits_processors(logits: torch.Tensor, params: list[SamplingParams],
                            completions: list[list[int]] | None) -> torch.Tensor:
    """Run each row's ``params[i].logits_processors`` on row ``i`` of ``logits [B, V]``
    (``completions[i]``: that row's completion token ids so far). Returns ``logits`` itself
    when no row has a processor, else a copy with the processed rows replaced."""
    if not any(p.logits_processors for p in params):
        return logits
    out = logits.clone()
    for i, p in enumerate(params):
        for proc in p.logits_processors:
            out[i] = proc(completions[i] if completions else [], out[i])
    return out


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator]) -> list[int]:
    """Pick one token per row of ``logits [B, V]`` (fp32) with row ``i``'s params and generator."""
    greedy = logits.argmax(dim=-1).tolist()
    out: list[int] = []
    for i, p in enumerate(params):
        if p.temperature == 0 or p.top_k == 1:
            out.append(int(greedy[i]))
            continue
        row = filter_logits(logits[i] / p.temperature, p.top_k, p.top_p)
        probs = torch.softmax(row, dim=-1)
        out.append(int(torch.multinomial(probs, 1, generator=generators[i]).item()))
    return out


def probs_of(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The distribution ``sample`` draws from, for each row of ``logits [R, V]``: softmax of the
    temperature-scaled, top-k / top-p filtered logits (``[R, V]`` fp32). Greedy params give the
    one-hot of the argmax."""
    if p.temperature == 0 or p.top_k == 1:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
    rows = [filter_logits(r / p.temperature, p.top_k, p.top_p) for r in logits]
    return torch.softmax(torch.stack(rows), dim=-1)
