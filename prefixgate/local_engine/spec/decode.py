"""Speculative decoding inside continuous batching: proposing, verifying, adapting, counting.

Each step, every decoding request may carry a draft of ``k`` tokens (``Drafter``); the target
model computes the request's newest token and the ``k`` draft tokens in the same forward pass as
the rest of the batch (requests with and without drafts together), giving ``k + 1`` logits rows.
``verify`` keeps the longest acceptable prefix of the draft and samples one more token, so a step
yields 1 .. k + 1 tokens; the K/V of rejected draft tokens is rolled back by the scheduler
(``Scheduler.accept_draft`` → ``KVManager.rollback``) before anything reaches the radix tree.

Acceptance rules (the output distribution equals the target's; Leviathan et al. 2023, "Fast
Inference from Transformers via Speculative Decoding", Alg. 1; Chen et al. 2023):

* greedy requests: accept draft token ``x_i`` while it equals the target's argmax; the next token
  is the target's argmax at the first mismatch (or after the last draft token) — the output is
  token-for-token the non-speculative greedy output.
* sampled requests, draft model with distribution ``q``: accept ``x`` with probability
  ``min(1, p(x) / q(x))``; on rejection sample from ``normalise(max(0, p − q))``.
* sampled requests, deterministic drafter (n-gram / suffix: ``q`` is a point mass on ``x``): the
  same rule reduces to accepting with probability ``p(x)`` and, on rejection, sampling from ``p``
  with ``x`` removed and renormalised.

``p`` is the distribution the non-speculative sampler draws from (biases and penalties with the
history at that draft position, temperature, top-k, top-p, min-p: ``sampler.adjust_logits`` +
``sampler.probs_of``; "greedy" is ``sampler.is_greedy``). If all ``k`` are accepted the bonus
token is drawn from row ``k``.

Policy (``SpecDecoder.propose``): ``k`` adapts per request (grows by one after a fully accepted
draft up to ``k_max``, else becomes accepted + 1); a request whose acceptance rate stays below
``PAUSE_BELOW`` pauses drafting for ``PAUSE_STEPS`` steps; and the step's total decode rows
(decodes + draft tokens) are capped at ``max_batch_tokens``, the spare rows spread evenly over
the batch (a draft's first positions are the likeliest accepted) — above it a forward pass is
compute-bound on this hardware and verifying drafts costs more than it saves (the cap is measured
by ``bench/engine_speculative.py``, see its ``knee`` figure). Given the measured step-cost curve
(``cost_curve``: rows → step time), the per-step draft length cap is chosen to maximise expected
tokens per unit of step time (``choose_k_cap``): with per-token acceptance ``a`` and ``k`` draft
tokens a request expects ``1 + a (1 − a^k) / (1 − a)`` tokens (Leviathan et al. 2023, eq. 1), and
the step costs ``cost(rows)``; when no ``k > 0`` beats plain decoding, nothing is drafted.

Seeded sampled requests: verification draws its uniforms from the request's own generator, so a
run is reproducible for the same engine state and batch; as ``k`` depends on the batch (the cap)
and on the draft, the random stream — not the distribution — differs from a non-speculative run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from prefixgate.local_engine.sched.sampler import adjust_logits, check_rows, is_greedy, probs_of
from prefixgate.local_engine.sched.sequence import Sequence
from prefixgate.local_engine.spec.drafters import Draft, Drafter

log = logging.getLogger("local_engine.spec")

PAUSE_BELOW = 0.15   # acceptance rate (EMA) under which a request stops drafting for a while
PAUSE_STEPS = 8
EMA = 0.3
MIN_GAIN = 1.1       # expected tokens per step time must beat plain decoding by 10 % to draft


def verify_greedy(logits: torch.Tensor, draft: list[int]) -> tuple[list[int], int]:
    """``logits [k+1, V]`` of a greedy request → (accepted draft prefix, next token)."""
    target = logits.argmax(dim=-1).tolist()
    m = 0
    while m < len(draft) and draft[m] == target[m]:
        m += 1
    return draft[:m], int(target[m])


def _draw(p: torch.Tensor, gen: torch.Generator) -> int:
    return int(torch.multinomial(p, 1, generator=gen).item())


def verify_sampled(probs: torch.Tensor, draft: Draft,
                   gen: torch.Generator) -> tuple[list[int], int]:
    """``probs [k+1, V]`` (target distributions) → (accepted draft prefix, next token).

    Rules in the module docstring; ``draft.q [k, V]`` None means a deterministic drafter.
    """
    for i, x in enumerate(draft.tokens):
        p = probs[i]
        q = None if draft.q is None else draft.q[i]
        px = float(p[x])
        ratio = px if q is None else min(1.0, px / max(float(q[x]), 1e-20))
        u = float(torch.rand(1, generator=gen, device=p.device).item())
        if u < ratio:
            continue
        if q is None:
            residual = p.clone()
            residual[x] = 0.0
        else:
            residual = (p - q).clamp_min(0.0)
        total = float(residual.sum())
        nxt = _draw(residual / total, gen) if total > 0 else _draw(p, gen)
        return draft.tokens[:i], nxt
    return list(draft.tokens), _draw(probs[len(draft.tokens)], gen)


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a step yields for a request drafting ``k`` tokens accepted i.i.d. with ``alpha``."""
    if k <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(k + 1)
    return 1.0 + alpha * (1 - alpha ** k) / (1 - alpha)


def interpolate(curve: list[tuple[int, float]], rows: int) -> float:
    """Step cost at ``rows`` from measured ``(rows, cost)`` points (sorted), linear between
    points, extended linearly past the last two."""
    if rows <= curve[0][0]:
        return curve[0][1]
    for (r0, c0), (r1, c1) in zip(curve, curve[1:]):
        if rows <= r1:
            return c0 + (c1 - c0) * (rows - r0) / (r1 - r0)
    (r0, c0), (r1, c1) = curve[-2] if len(curve) > 1 else curve[-1], curve[-1]
    slope = (c1 - c0) / (r1 - r0) if r1 != r0 else 0.0
    return c1 + slope * (rows - r1)


def choose_k_cap(alphas: list[float], ks: list[int], curve: list[tuple[int, float]],
                 k_max: int) -> int:
    """The draft-length cap (0..k_max) maximising expected tokens per step time for requests
    with acceptance estimates ``alphas`` and own limits ``ks`` (0 = will not draft)."""
    b = len(alphas)
    best_k, best = 0, b / interpolate(curve, b)
    for cap in range(1, k_max + 1):
        kk = [min(k, cap) for k in ks]
        gain = sum(expected_tokens(a, k) for a, k in zip(alphas, kk))
        rate = gain / interpolate(curve, b + sum(kk))
        if rate > best * MIN_GAIN:  # the estimate is rough: plain decoding is the default
            best_k, best = cap, rate
    return best_k


@dataclass
class SpecMetrics:
    """Monotonic counters, named after vLLM's ``spec_decode`` metrics.

    ``num_drafts``: drafts verified; ``num_draft_tokens``: tokens proposed in them;
    ``num_accepted_tokens``: of those, accepted; ``accepted_per_pos[i]``: drafts whose token at
    position ``i`` was accepted; ``decode_steps`` / ``no_draft_steps``: request-steps in decode,
    and those without a draft.
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    decode_steps: int = 0
    no_draft_steps: int = 0

    @property
    def mean_accepted_len(self) -> float:
        """Tokens per verification step of a drafted request: 1 + accepted / drafts (vLLM's
        mean acceptance length); 0 before the first draft."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed draft tokens (0..1)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    def as_dict(self) -> dict[str, float | int]:
        """Flat figures for ``Engine.stats`` (per-position rates as ``acceptance_pos_<i>``)."""
        out: dict[str, float | int] = {
            "spec_num_drafts": self.num_drafts,
            "spec_num_draft_tokens": self.num_draft_tokens,
            "spec_num_accepted_tokens": self.num_accepted_tokens,
            "spec_mean_accepted_len": self.mean_accepted_len,
            "spec_acceptance_rate": self.acceptance_rate,
            "spec_decode_steps": self.decode_steps,
            "spec_no_draft_steps": self.no_draft_steps,
        }
        for i, n in enumerate(self.accepted_per_pos):
            out[f"spec_accepted_pos_{i}"] = n
        return out


@dataclass
class _ReqState:
    k: int
    ema: float = 0.7  # acceptance estimate before the first draft
    drafts: int = 0
    paused: int = 0


class SpecDecoder:
    """Drafting policy + verification for the engine (one instance, engine thread only)."""

    def __init__(self, drafter: Drafter, k_max: int = 4, max_batch_tokens: int = 16,
                 cost_curve: list[tuple[int, float]] | None = None) -> None:
        if k_max < 1:
            raise ValueError("num_speculative_tokens must be >= 1")
        self.drafter = drafter
        self.k_max = k_max
        self.max_batch_tokens = max_batch_tokens
        self.cost_curve = sorted(cost_curve) if cost_curve else None
        self.metrics = SpecMetrics(accepted_per_pos=[0] * k_max)
        self._state: dict[str, _ReqState] = {}
        self.suffix_indexes: list[Any] = []  # suffix_index.SuffixIndex, for stats()

    def stats(self) -> dict[str, float | int]:
        """``SpecMetrics.as_dict`` + the suffix index's bytes held, namespaces and evictions."""
        out = self.metrics.as_dict()
        if self.suffix_indexes:
            out["spec_suffix_index_bytes"] = sum(i.nbytes for i in self.suffix_indexes)
            out["spec_suffix_namespaces"] = sum(i.num_namespaces for i in self.suffix_indexes)
            out["spec_suffix_evicted_docs"] = sum(i.evicted_docs for i in self.suffix_indexes)
        return out

    def _st(self, seq: Sequence) -> _ReqState:
        st = self._state.get(seq.request_id)
        if st is None:
            st = self._state[seq.request_id] = _ReqState(k=self.k_max)
        return st

    def propose(self, decodes: list[Sequence], budget: int) -> list[Draft | None]:
        """One draft (or None) per decoding request, within ``budget`` extra tokens and the
        compute-bound cap (module docstring)."""
        self.metrics.decode_steps += len(decodes)
        allowance = min(budget, self.max_batch_tokens - len(decodes))
        cap = self.k_max
        if self.cost_curve is not None and allowance > 0:
            states = [self._st(s) for s in decodes]
            ks = [0 if st.paused else st.k for st in states]
            cap = choose_k_cap([st.ema for st in states], ks, self.cost_curve, self.k_max)
        out: list[Draft | None] = []
        for i, seq in enumerate(decodes):
            st = self._st(seq)
            share = allowance // (len(decodes) - i) if allowance >= len(decodes) - i else (
                1 if allowance > 0 else 0)  # spread the spare rows: early positions pay most
            k = min(st.k, cap, share, seq.max_tokens - seq.num_completion - 1)
            if seq.params.logits_processors:  # constrained decoding (tool_mask): the verifier
                k = 0                         # would need the mask at every draft position
            d: Draft | None = None
            if st.paused > 0:
                st.paused -= 1
            elif k >= 1:
                d = self._propose_one(seq, k)
                if d is not None:
                    d = d.truncated(k)
                    allowance -= len(d.tokens)
            if d is None:
                self.metrics.no_draft_steps += 1
            out.append(d)
        return out

    def _propose_one(self, seq: Sequence, k: int) -> Draft | None:
        """The drafter's guess for ``seq``, or None when the drafter fails: a draft is an
        optimisation, so a drafter error costs that request its draft, never the step."""
        try:
            return self.drafter.propose(seq, k)
        except Exception:
            log.exception("drafter %s failed for one request; it decodes without a draft",
                          self.drafter.name)
            self.drafter.release(seq)
            return None

    def verify(self, seq: Sequence, logits: torch.Tensor, draft: Draft) -> tuple[list[int], int]:
        """``logits [k+1, V]`` of ``seq``'s step → (accepted draft tokens, next token); updates the
        request's ``k`` and the metrics. Row ``i`` is adjusted (biases, penalties) with the
        history the non-speculative sampler would see there: ``seq.token_ids + draft[:i]``.
        Raises ``sampler.SamplingError`` for a row without a distribution."""
        p = seq.params
        if p.adjusts_logits:
            logits = torch.stack([adjust_logits(logits[i], p, seq.token_ids + draft.tokens[:i],
                                                seq.num_prompt) for i in range(logits.shape[0])])
        if is_greedy(p):
            check_rows(logits)
            accepted, nxt = verify_greedy(logits, draft.tokens)
        else:
            accepted, nxt = verify_sampled(probs_of(logits, p), draft, seq.generator)
        k, m = len(draft.tokens), len(accepted)
        mt = self.metrics
        mt.num_drafts += 1
        mt.num_draft_tokens += k
        mt.num_accepted_tokens += m
        for i in range(m):
            mt.accepted_per_pos[i] += 1
        seq.spec_drafts += 1
        seq.spec_draft_tokens += k
        seq.spec_accepted_tokens += m
        st = self._st(seq)
        st.k = min(self.k_max, st.k + 1) if m == k else max(1, m + 1)
        trials = m + (1 if m < k else 0)  # Bernoulli trials seen: accepted ones + the rejection
        st.ema = (1 - EMA) * st.ema + EMA * (m / trials)
        st.drafts += 1
        if st.drafts >= 4 and st.ema < PAUSE_BELOW:
            st.paused, st.ema = PAUSE_STEPS, 0.5
        return accepted, nxt

    def release(self, seq: Sequence) -> None:
        """Drop ``seq``'s state (finished or aborted)."""
        self._state.pop(seq.request_id, None)
        self.drafter.release(seq)
