"""Span reuse in the engine (tiny random Llama): the logits it produces are those of a manual
forward over the stale K/V it claims to reuse; shifted keys are re-rotated exactly; prompt
log-probs and the full-recompute switch."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from prefixgate.local_engine.engine import SamplingParams
from prefixgate.local_engine.kv.pool import KVPool
from prefixgate.local_engine.kv.span_match import SpanBounds
from prefixgate.local_engine.model.attention import AttnMeta, prefill_group
from prefixgate.local_engine.model.llama import apply_rope, rope_inv_freq, rope_tables
from prefixgate.local_engine.sched.span_reuse import SpanReuse

X = list(range(2000, 2030))       # shared prefix
Y = list(range(3000, 3040))       # re-aligned run after the changed span
S1, S2 = [500, 501, 502], [600, 601, 602]
Z = [700, 701, 702, 703]          # the new request's own tail
ANY = {"span_reuse_values_only": False}  # these spans are words: the content gate would refuse


def run(eng: Any, ids: list[int], **kw: Any) -> list[Any]:
    async def go() -> list[Any]:
        params = SamplingParams(temperature=0.0, ignore_eos=True, **{"max_tokens": 1, **kw})
        return [o async for o in eng.generate(ids, params)]
    return asyncio.run(go())


def manual_rows(model: Any, a: list[int], b_span: list[int], b_tail: list[int],
                reuse_from: int, reuse_len: int) -> torch.Tensor:
    """Log-softmax rows of ``b_tail`` computed by hand: ``a`` prefilled in a fresh pool; the
    changed span ``b_span`` at ``a``'s span positions (reading ``a``'s prefix); ``a``'s K/V of
    ``[reuse_from, +reuse_len)`` reused as is (stale: computed with ``a``'s span in view);
    the tail after them, reading all of it."""
    args = model.args
    pool = KVPool(args.num_layers, 512, args.num_kv_heads, args.head_dim, torch.float32,
                  torch.device("cpu"))
    cos, sin = rope_tables(args, 512, torch.float32, torch.device("cpu"))
    gqa = args.num_heads // args.num_kv_heads

    def fwd(ids: list[int], pos0: int, key_slots: list[int], out_slots: list[int]) -> torch.Tensor:
        pos = torch.arange(pos0, pos0 + len(ids))
        grp = prefill_group(0, pos0, len(ids), torch.tensor(key_slots + out_slots), gqa,
                            torch.device("cpu"))
        meta = AttnMeta(cos=cos[pos].unsqueeze(1), sin=sin[pos].unsqueeze(1),
                        out_slots=torch.tensor(out_slots), groups=[grp], gqa=gqa)
        return model(torch.tensor(ids), meta, pool, torch.arange(len(ids)))

    a_slots = list(range(len(a)))
    fwd(a, 0, [], a_slots)
    j = reuse_from - len(b_span)
    span_slots = list(range(300, 300 + len(b_span)))
    fwd(b_span, j, a_slots[:j], span_slots)
    keys = a_slots[:j] + span_slots + a_slots[reuse_from:reuse_from + reuse_len]
    tail_slots = list(range(400, 400 + len(b_tail)))
    return torch.log_softmax(fwd(b_tail, reuse_from + reuse_len, keys, tail_slots), dim=-1)


def test_equal_length_span_gives_the_logits_of_a_forward_over_the_stale_kv(make_engine: Any) -> None:
    eng = make_engine(chunk_size=512, **ANY)
    a, b = X + S1 + Y + [9], X + S2 + Y + Z
    run(eng, a)
    out = run(eng, b, prompt_logprobs=True)
    assert out[-1].span_reused_tokens == len(Y) and out[-1].cached_tokens == len(X) + len(Y)
    pl = out[0].prompt_logprobs
    assert pl.positions == list(range(30, 33)) + list(range(73, 77))  # the span, then Z
    assert pl.row(40) is None and pl.row(5) is None  # reused / prefix positions: no row
    got = torch.stack([pl.row(p) for p in range(73, 77)])
    want = manual_rows(eng.model, a, S2, Z, len(X) + len(S1), len(Y))
    assert torch.allclose(got, want, atol=1e-4)
    exact = run(eng, b, prompt_logprobs=True, no_prefix_cache=True)[0].prompt_logprobs
    assert exact.positions == list(range(len(b)))
    full = torch.stack([exact.row(p) for p in range(73, 77)])
    assert (full - got).abs().max() > 1e-3  # the stale K/V is really what was read


def test_shifted_keys_are_re_rotated_to_their_new_positions(make_engine: Any) -> None:
    """Layer-0 keys depend on the token and its position only: the copied keys of a run moved
    by d must equal the keys a full prefill computes at the new positions."""
    span, plain = make_engine(**ANY), make_engine(span_reuse=False)
    a, b = X + S1 + Y + [9], X + [600, 601, 602, 603, 604] + Y + Z  # shift +2
    reused = []
    for eng in (span, plain):
        run(eng, a)
        reused.append(run(eng, b)[-1].span_reused_tokens)
    assert reused == [len(Y), 0]
    slots = {}
    for name, eng in (("span", span), ("plain", plain)):
        m = eng.cache.match_prefix(b)
        slots[name] = torch.tensor(m.slots[35:75])  # Y at its new positions
    k_span = span.pool.k[0][slots["span"]]
    k_plain = plain.pool.k[0][slots["plain"]]
    assert torch.allclose(k_span, k_plain, atol=1e-5)
    a_y = torch.tensor(span.cache.match_prefix(a).slots[33:73])
    assert not torch.allclose(span.pool.k[0][a_y], k_plain, atol=1e-3)  # unrotated: wrong
    assert torch.equal(span.pool.v[0][a_y], span.pool.v[0][slots["span"]])  # values copied as is


def test_rope_shift_composes_with_the_models_rope(tiny_dir: Any) -> None:
    from transformers import AutoConfig

    from prefixgate.local_engine.model.llama import ModelArgs

    args = ModelArgs.from_hf_config(AutoConfig.from_pretrained(tiny_dir))
    cos, sin = rope_tables(args, 1024, torch.float32, torch.device("cpu"))
    reuse = SpanReuse(SpanBounds(), rope_inv_freq(args))
    k = torch.randn(6, args.num_kv_heads, args.head_dim)
    p = torch.tensor([3, 5, 100, 300, 700, 900])
    for d in (1, 7, -3, 120):
        at_p = apply_rope(k, cos[p].unsqueeze(1), sin[p].unsqueeze(1))
        rc, rs = reuse.rope_shift([d] * 6, torch.device("cpu"))
        moved = apply_rope(at_p, rc, rs)
        fresh = apply_rope(k, cos[p + d].unsqueeze(1), sin[p + d].unsqueeze(1))
        assert torch.allclose(moved, fresh, atol=2e-4), d


def test_no_prefix_cache_computes_and_decodes_on_its_own_kv(make_engine: Any) -> None:
    eng, fresh = make_engine(chunk_size=64, **ANY), make_engine(enable_prefix_cache=False, chunk_size=64)
    base = list(range(1000, 1200))
    a = base[:50] + [5, 6, 7] + base[50:] + [9]
    b = base[:50] + [8, 6, 3, 3] + base[50:] + [10, 11]
    run(eng, a)
    assert run(eng, b)[-1].span_reused_tokens == 150  # the tree now holds b's approximate K/V
    out = run(eng, b, max_tokens=8, no_prefix_cache=True)
    assert out[-1].cached_tokens == 0 and out[-1].span_reused_tokens == 0
    want = run(fresh, b, max_tokens=8)  # decoding on the tree's K/V instead changes the answer
    assert [t for o in out for t in o.new_token_ids] == [t for o in want for t in o.new_token_ids]


def test_prompt_logprobs_start_limits_the_rows(make_engine: Any) -> None:
    eng = make_engine(enable_prefix_cache=False)
    out = run(eng, X + Z, prompt_logprobs=True, prompt_logprobs_start=31)
    pl = out[0].prompt_logprobs
    assert pl.positions == [31, 32, 33] and pl.start == 31 and tuple(pl.rows.shape) == (3, eng.vocab_size)
    assert torch.allclose(pl.rows.exp().sum(-1), torch.ones(3), atol=1e-4)
    assert pl.rows[-1].argmax().item() == out[0].new_token_ids[0]  # the last row is the sample's
    assert run(eng, X + Z)[0].prompt_logprobs is None


def test_span_reuse_off_is_the_prefix_match(make_engine: Any) -> None:
    on, off = make_engine(**ANY), make_engine(span_reuse=False)
    a, b = X + S1 + Y + [9], X + S2 + Y + Z
    for eng in (on, off):
        run(eng, a)
    assert run(off, b)[-1].cached_tokens == len(X)
    assert off.stats()["span_reused_tokens_total"] == 0
    assert run(on, b)[-1].cached_tokens == len(X) + len(Y)
    assert on.pool.used_slots == off.pool.used_slots  # the copy owns slots like a prefill


@pytest.mark.parametrize("bad", [-1, 1.5])
def test_prompt_logprobs_start_is_validated(bad: Any) -> None:
    from prefixgate.local_engine.sched.api_types import InvalidSamplingParam

    with pytest.raises(InvalidSamplingParam):
        SamplingParams(prompt_logprobs_start=bad).validate()


def test_the_content_gate_reuses_across_changed_digits_not_changed_words(make_engine: Any) -> None:
    eng = make_engine()
    tok = eng.tokenizer
    policy = tok(" Always ask for the reservation id before you cancel anything." * 4)["input_ids"]

    def prompt(line: str) -> list[int]:
        return tok(line)["input_ids"] + policy + [9]

    run(eng, prompt("Current time: 2024-05-15 15:00:07"))
    digits = run(eng, prompt("Current time: 2024-05-15 15:01:39"))[-1]
    words = run(eng, prompt("Current mood: rather pleasant today"))[-1]
    assert digits.span_reused_tokens == len(policy) and words.span_reused_tokens == 0


def test_span_reuse_with_speculative_decoding_and_pages_answers_as_without(make_engine: Any) -> None:
    plain = make_engine(page_size=4, chunk_size=16, **ANY)
    spec = make_engine(page_size=4, chunk_size=16, speculative="ngram+suffix", **ANY)
    a, b = X + S1 + Y + [9], X + S2 + Y + Z
    outs = []
    for eng in (plain, spec):
        run(eng, a, max_tokens=4)
        out = run(eng, b, max_tokens=12)
        outs.append(([t for o in out for t in o.new_token_ids], out[-1].span_reused_tokens))
        eng.cache.check()
    assert outs[0] == outs[1] and outs[0][1] > 0


def test_prompt_logprobs_of_a_full_cache_hit_is_its_last_position(make_engine: Any) -> None:
    eng = make_engine()
    ids = X + Z
    run(eng, ids, max_tokens=3)
    out = run(eng, ids, prompt_logprobs=True)  # all but the last token cached: a decode-like step
    assert out[-1].cached_tokens == len(ids) - 1
    pl = out[0].prompt_logprobs
    assert pl.positions == [len(ids) - 1] and pl.rows[0].argmax().item() == out[0].new_token_ids[0]
