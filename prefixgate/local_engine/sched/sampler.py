"""Next-token sampling: greedy, temperature, top-k, top-p, min-p, biases and penalties, with a
generator per request.

Per row, in order (vLLM's order):

1. **adjust** (``adjust_logits``, only when the request sets one): ``logit_bias`` added
   (OpenAI), ``repetition_penalty`` over prompt + completion tokens (CTRL, Keskar et al. 2019, as
   vLLM / HF: a positive logit is divided by it, a negative one multiplied), presence and
   frequency penalties over the completion so far (OpenAI's formula
   ``l[j] -= c[j] * frequency + (c[j] > 0) * presence``). The result is clipped to the dtype's
   finite maximum, so no bias or penalty can create ``+inf``.
2. **greedy** (``is_greedy``): temperature 0, any temperature below ``TEMPERATURE_FLOOR``, or
   top_k 1 takes the argmax.
3. **scale**: ``(l - max(l)) / temperature`` — the same distribution as ``l / temperature``
   after softmax, but every value is ≤ 0, so a small temperature gives ``-inf`` (probability 0)
   instead of overflowing to ``+inf`` and making ``inf - inf = nan`` in softmax.
4. **filter**: top-k, then top-p (nucleus, Holtzman et al. 2019: keep the smallest set of tokens
   whose probability mass reaches p, always at least one), then min-p (keep tokens whose
   probability is at least ``min_p`` × the top one's; the top one always stays).
5. **draw** with ``torch.multinomial`` from the request's own ``torch.Generator`` — so a seeded
   request gives the same tokens whatever else is in the batch.

Every parameter value ``SamplingParams.validate`` accepts gives a finite distribution summing to
1 for every row that has at least one finite logit and no NaN / ``+inf`` (``check_rows``); a row
that does not (a broken model output, a grammar mask that allows nothing) raises
``SamplingError`` for that request alone (the engine fails only it).
"""

from __future__ import annotations

import random

import torch

from prefixgate.local_engine.sched.api_types import SamplingParams

TEMPERATURE_FLOOR = 1e-2  # vLLM's _MAX_TEMP: below it, numerical errors (nan / inf) in fp32 / fp16


class SamplingError(RuntimeError):
    """One request's logits give no distribution to sample from (NaN, ``+inf``, or every
    token masked); the engine fails that request alone."""


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    """A generator seeded with ``seed`` (or a fresh random seed when None)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed if seed is not None else random.getrandbits(63))
    return gen


def is_greedy(p: SamplingParams) -> bool:
    """True when ``p`` takes the argmax: temperature below ``TEMPERATURE_FLOOR`` (0 included;
    the limit of softmax(l / T) as T → 0 is the argmax) or top_k 1."""
    return p.temperature < TEMPERATURE_FLOOR or p.top_k == 1


NO_DISTRIBUTION = "this request's logits hold NaN or +inf, or allow no token (all -inf)"


def check_rows(logits: torch.Tensor) -> None:
    """Raise ``SamplingError`` unless every row of ``logits [R, V]`` has no NaN, no ``+inf`` and
    a finite value (one reduction: ``max`` propagates NaN, is ``+inf`` with one and ``-inf``
    with no finite value)."""
    if not bool(torch.isfinite(logits.amax(dim=-1)).all()):
        raise SamplingError(NO_DISTRIBUTION)


def adjust_logits(row: torch.Tensor, p: SamplingParams, token_ids: list[int],
                  num_prompt: int) -> torch.Tensor:
    """Step 1 of the module docstring on ``row [V]`` (fp32) of a request whose tokens so far are
    ``token_ids`` (the first ``num_prompt`` are the prompt). Returns ``row`` itself when ``p``
    adjusts nothing, else a new tensor."""
    if not p.adjusts_logits:
        return row
    out = row.clone()
    vocab = out.shape[-1]
    if p.logit_bias:
        ids = torch.tensor(list(p.logit_bias), dtype=torch.int64, device=out.device)
        bias = torch.tensor(list(p.logit_bias.values()), dtype=out.dtype, device=out.device)
        out.index_add_(0, ids, bias)
    if p.repetition_penalty != 1 and token_ids:
        seen = torch.unique(torch.tensor(token_ids, dtype=torch.int64, device=out.device))
        vals = out.index_select(0, seen)
        r = p.repetition_penalty
        out.index_copy_(0, seen, torch.where(vals > 0, vals / r, vals * r))
    completion = token_ids[num_prompt:]
    if (p.presence_penalty != 0 or p.frequency_penalty != 0) and completion:
        counts = torch.bincount(torch.tensor(completion, dtype=torch.int64, device=out.device),
                                minlength=vocab).to(out.dtype)
        out -= counts * p.frequency_penalty + (counts > 0).to(out.dtype) * p.presence_penalty
    return out.clamp_(max=torch.finfo(out.dtype).max)


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float,
                  min_p: float = 0.0) -> torch.Tensor:
    """Mask ``logits [V]`` outside top-k, top-p and min-p to -inf (returns a new tensor)."""
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
    if min_p > 0.0:
        probs = torch.softmax(out, dim=-1)
        out = out.masked_fill(probs < min_p * probs.max(), float("-inf"))
    return out


def _scaled(row: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Steps 3-4 on one checked row: filtered logits, all ≤ 0 or -inf, max exactly 0."""
    return filter_logits((row - row.max()) / p.temperature, p.top_k, p.top_p, p.min_p)


def needs_preparing(p: SamplingParams) -> bool:
    """True when ``prepare_row`` changes anything for ``p``."""
    return bool(p.logits_processors) or p.adjusts_logits


def prepare_row(row: torch.Tensor, p: SamplingParams, token_ids: list[int],
                num_prompt: int) -> torch.Tensor:
    """What the sampler draws from for one row ``[V]`` before scaling: the request's
    ``logits_processors`` in order (each shown the completion ids ``token_ids[num_prompt:]``;
    constrained decoding masks here), then ``adjust_logits`` — a bias never lifts a masked
    (``-inf``) token. Returns ``row`` itself when nothing applies."""
    completion = token_ids[num_prompt:]
    for proc in p.logits_processors:
        row = proc(completion, row)
    return adjust_logits(row, p, token_ids, num_prompt)


def sample_rows(logits: torch.Tensor, params: list[SamplingParams],
                generators: list[torch.Generator]) -> list[int | SamplingError]:
    """One token per row of ``logits [B, V]`` (fp32, already adjusted) with row ``i``'s params
    and generator, or the ``SamplingError`` of a row without a distribution — per row, so one
    bad row costs only its request. Checks and greedy argmaxes take one batched reduction."""
    if logits.shape[0] == 0:
        return []
    top, arg = logits.max(dim=-1)  # NaN propagates: a row is usable iff its max is finite
    ok, greedy = torch.isfinite(top).tolist(), arg.tolist()
    out: list[int | SamplingError] = []
    for i, p in enumerate(params):
        if not ok[i]:
            out.append(SamplingError(NO_DISTRIBUTION))
        elif is_greedy(p):
            out.append(int(greedy[i]))
        else:
            probs = torch.softmax(_scaled(logits[i], p), dim=-1)
            out.append(int(torch.multinomial(probs, 1, generator=generators[i]).item()))
    return out


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator]) -> list[int]:
    """``sample_rows`` for callers that want an exception: raises the first row's
    ``SamplingError``."""
    out = sample_rows(logits, params, generators)
    for tok in out:
        if isinstance(tok, SamplingError):
            raise tok
    return [int(t) for t in out]  # type: ignore[arg-type]


def probs_of(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The distribution ``sample`` draws from, for each row of ``logits [R, V]`` (adjusted):
    softmax of the scaled, top-k / top-p / min-p filtered logits (``[R, V]`` fp32). Greedy
    params give the one-hot of the argmax. Raises ``SamplingError`` for a row without one."""
    check_rows(logits)
    if is_greedy(p):
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
    return torch.softmax(torch.stack([_scaled(r, p) for r in logits]), dim=-1)
