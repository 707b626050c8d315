"""Teacher-forced comparison of two prompts' next-token distributions over one answer.

A reference prompt ``P`` and its answer ``A`` (token ids); another prompt ``Q`` (a variant, or
the same prompt computed another way). Both are run as prompts ``P + A`` and ``Q + A`` with the
engine's prompt log-probs (``SamplingParams.prompt_logprobs``): the rows of the answer positions
(:func:`answer_positions`) are each prompt's next-token distribution at every answer token,
with the answer forced. Per position, in nats:

* ``KL(ref || other) = sum_v p(v) (log p(v) - log q(v))`` with ``p`` the reference's row — the
  expected extra surprise of the other prompt at what the reference would say (Kullback and
  Leibler 1951; the direction of issue 33 and issue 36's table: the original is the reference);
* top-1 agreement: the other row's argmax equals the answer's token (for a greedy reference
  answer its own argmax), the share of positions;
* NLL delta: ``-log q(a) - (-log p(a))`` for the answer token ``a``.

Per request the figures are means over the answer positions both prompts computed (a position
whose K/V came from the cache has no row: ``missing``); across requests :func:`summary` takes
the mean of the per-request means (each request weighs the same). Used by
``bench/span_reuse.py`` (reference: a full recompute) and ``bench/answer_stability.py``
(reference: the client's original body).
"""

from __future__ import annotations

import asyncio
import statistics
from typing import Any


def answer_positions(prompt_len: int, answer_len: int) -> list[int]:
    """Positions of ``prompt + answer`` whose next-token rows predict the answer's tokens:
    ``prompt_len - 1 .. prompt_len + answer_len - 2`` (empty for an empty answer)."""
    return list(range(prompt_len - 1, prompt_len - 1 + answer_len))


def kl_rows(ref: Any, other: Any) -> list[float]:
    """Per-row KL(ref || other) in nats of two ``[n, vocab]`` log-softmax tensors (float64
    arithmetic; rows of equal count; rounding below 0 clipped to 0)."""
    import torch

    p = ref.to(torch.float64)
    q = other.to(torch.float64)
    return [max(0.0, float(v)) for v in (p.exp() * (p - q)).sum(dim=-1)]


def rows_at(logprobs: Any, positions: list[int]) -> tuple[Any, list[int]]:
    """``(rows [m, vocab], kept)``: the rows of ``positions`` a ``PromptLogprobs`` holds, and
    the indexes (into ``positions``) it held them for (a position whose K/V was reused has no
    row)."""
    import torch

    got, kept = [], []
    for i, pos in enumerate(positions):
        r = logprobs.row(pos) if logprobs is not None else None
        if r is not None:
            got.append(r)
            kept.append(i)
    return (torch.stack(got) if got else None), kept


def compare(ref: Any, other: Any, ref_pos: list[int], other_pos: list[int],
            answer: list[int]) -> dict[str, Any]:
    """KL(ref || other), top-1 agreement and NLL delta over the answer positions both
    computed: ``{"kl_mean", "kl_max", "top1", "nll_delta", "positions", "missing"}`` (figures
    None when no position is shared). ``ref`` / ``other``: ``PromptLogprobs``-like (``row(pos)``);
    ``*_pos``: each one's answer positions; ``answer``: the answer's token ids."""
    r_rows, r_kept = rows_at(ref, ref_pos)
    o_rows, o_kept = rows_at(other, other_pos)
    both = sorted(set(r_kept) & set(o_kept))
    if not both or r_rows is None or o_rows is None:
        return {"kl_mean": None, "kl_max": None, "top1": None, "nll_delta": None,
                "positions": 0, "missing": len(answer)}
    ri = [r_kept.index(i) for i in both]
    oi = [o_kept.index(i) for i in both]
    kls = kl_rows(r_rows[ri], o_rows[oi])
    top = o_rows[oi].argmax(dim=-1).tolist()
    agree = sum(1 for t, i in zip(top, both) if t == answer[i])
    nll = [float(r_rows[a][answer[i]]) - float(o_rows[b][answer[i]]) for a, b, i in zip(ri, oi, both)]
    return {"kl_mean": sum(kls) / len(kls), "kl_max": max(kls), "top1": agree / len(both),
            "nll_delta": sum(nll) / len(nll), "positions": len(both),
            "missing": len(answer) - len(both)}


IDENTICAL = {"kl_mean": 0.0, "kl_max": 0.0, "top1": 1.0, "nll_delta": 0.0}
""":func:`compare`'s figures for a variant whose tokens equal the reference's (not run)."""


def summary(per_request: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"kl_mean", "top1_agreement", "nll_delta", "requests", "missing_positions"}``: the
    means over requests of :func:`compare`'s per-request figures (requests with none skipped;
    figures None when no request has any), rounded to 6 places."""
    got = [r for r in per_request if r.get("kl_mean") is not None]

    def mean(key: str) -> float | None:
        return round(statistics.fmean(r[key] for r in got), 6) if got else None
    return {"kl_mean": mean("kl_mean"), "top1_agreement": mean("top1"),
            "nll_delta": mean("nll_delta"), "requests": len(got),
            "missing_positions": sum(r.get("missing", 0) for r in per_request)}


def prompt_rows(engine: Any, prompts: list[list[int]], starts: list[int],
                extra_key: bytes | None = None) -> list[Any]:
    """Each prompt's ``PromptLogprobs`` from its position ``starts[i]`` on, all prompts in one
    continuous batch on ``engine`` (``prefixgate.local_engine.engine.Engine``; one output token
    each, discarded). ``extra_key``: the prefix-cache namespace (a position whose K/V the cache
    held has no row, so a reference is run where its own answer is not cached)."""
    from prefixgate.local_engine.engine import SamplingParams

    async def one(ids: list[int], start: int) -> Any:
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=True,
                                prompt_logprobs_start=start)
        rows = None
        async for out in engine.generate(list(ids), params, extra_key=extra_key):
            if out.prompt_logprobs is not None:
                rows = out.prompt_logprobs
        return rows

    async def every() -> list[Any]:
        return list(await asyncio.gather(*(one(p, s) for p, s in zip(prompts, starts))))
    return asyncio.run(every())
