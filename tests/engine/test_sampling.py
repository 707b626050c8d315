"""Sampling: seeds, top-k/top-p, stop strings / stop ids / EOS / max_tokens finish reasons."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from prefixgate.local_engine.sched.api_types import RequestOutput, SamplingParams
from prefixgate.local_engine.sched.detokenizer import IncrementalDetokenizer
from prefixgate.local_engine.sched.sampler import filter_logits, make_generator, sample

PROMPT = list(range(700, 712))


def collect(eng: Any, prompt: list[int], params: SamplingParams) -> list[RequestOutput]:
    async def run() -> list[RequestOutput]:
        return [o async for o in eng.generate(prompt, params)]
    return asyncio.run(run())


def test_seeded_sampling_is_reproducible_and_batch_independent(tiny_engine: Any) -> None:
    p = SamplingParams(max_tokens=16, temperature=1.0, seed=42, ignore_eos=True)
    a = tiny_engine.generate_batch([PROMPT], p)[0]
    b = tiny_engine.generate_batch([PROMPT], p)[0]
    other = SamplingParams(max_tokens=16, temperature=1.0, seed=7, ignore_eos=True)
    in_batch = tiny_engine.generate_batch([list(range(5, 30)), PROMPT, PROMPT], [p, p, other])
    assert a == b == in_batch[1]
    assert in_batch[2] != a  # another seed, another draw


def test_unseeded_sampling_varies(tiny_engine: Any) -> None:
    p = SamplingParams(max_tokens=16, temperature=1.5, ignore_eos=True)
    outs = {tuple(tiny_engine.generate_batch([PROMPT], p)[0]) for _ in range(3)}
    assert len(outs) > 1


def test_top_k_1_equals_greedy(tiny_engine: Any) -> None:
    greedy = tiny_engine.generate_batch(
        [PROMPT], SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))[0]
    topk1 = tiny_engine.generate_batch(
        [PROMPT], SamplingParams(max_tokens=10, temperature=0.8, top_k=1, seed=3, ignore_eos=True))[0]
    assert topk1 == greedy


def test_filter_logits_top_k_and_top_p() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert torch.isinf(filter_logits(logits, 2, 1.0)[2:]).all()
    kept = ~torch.isinf(filter_logits(logits, -1, 0.75))
    assert kept.tolist() == [True, True, False, False]  # 0.5 < 0.75 <= 0.8
    assert (~torch.isinf(filter_logits(logits, -1, 0.01))).sum() == 1  # always one token
    draws = {sample(logits[None].repeat(1, 1), [SamplingParams(top_p=0.75)],
                    [make_generator(s, torch.device("cpu"))])[0] for s in range(40)}
    assert draws == {0, 1}


def test_max_tokens_finish_length(tiny_engine: Any) -> None:
    outs = collect(tiny_engine, PROMPT, SamplingParams(max_tokens=5, temperature=0.0,
                                                       ignore_eos=True))
    assert [o.finished for o in outs] == [False] * 4 + [True]
    last = outs[-1]
    assert last.finish_reason == "length" and last.completion_tokens == 5
    assert last.prompt_tokens == len(PROMPT)
    assert sum(len(o.new_token_ids) for o in outs) == 5


def test_stop_token_id_finishes_with_stop(tiny_engine: Any) -> None:
    free = tiny_engine.generate_batch([PROMPT], SamplingParams(max_tokens=8, temperature=0.0,
                                                              ignore_eos=True))[0]
    stop_id = free[3]
    outs = collect(tiny_engine, PROMPT, SamplingParams(max_tokens=8, temperature=0.0,
                                                       stop_token_ids=[stop_id], ignore_eos=True))
    ids = [t for o in outs for t in o.new_token_ids]
    assert ids == free[: free.index(stop_id) + 1]
    assert outs[-1].finish_reason == "stop"


def test_eos_stops_unless_ignored(tiny_engine: Any) -> None:
    free = tiny_engine.generate_batch([PROMPT], SamplingParams(max_tokens=8, temperature=0.0,
                                                              ignore_eos=True))[0]
    saved = set(tiny_engine.eos_ids)
    tiny_engine.eos_ids = {free[2]}  # pretend the third greedy token is EOS
    try:
        stopped = collect(tiny_engine, PROMPT, SamplingParams(max_tokens=8, temperature=0.0))
        ignored = tiny_engine.generate_batch(
            [PROMPT], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))[0]
    finally:
        tiny_engine.eos_ids = saved
    assert stopped[-1].finish_reason == "stop"
    assert [t for o in stopped for t in o.new_token_ids] == free[: free.index(free[2]) + 1]
    assert ignored == free


def test_stop_string_cuts_text_and_is_not_emitted(tiny_engine: Any) -> None:
    tok = tiny_engine.tokenizer
    free = collect(tiny_engine, PROMPT, SamplingParams(max_tokens=12, temperature=0.0,
                                                       ignore_eos=True))
    text = "".join(o.text_delta for o in free)
    assert text == tok.decode([t for o in free for t in o.new_token_ids])
    stop = text[len(text) // 2:len(text) // 2 + 3]
    cut = text.find(stop)  # the first occurrence ends the completion
    assert stop.strip() and cut > 0
    outs = collect(tiny_engine, PROMPT, SamplingParams(max_tokens=12, temperature=0.0,
                                                       stop=[stop, "never-there"],
                                                       ignore_eos=True))
    assert "".join(o.text_delta for o in outs) == text[:cut]
    assert outs[-1].finish_reason == "stop"
    assert outs[-1].completion_tokens < 12


class CharTokenizer:
    """One token per character: id = ord(char)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)


@pytest.mark.parametrize("stream,stop,expected", [
    ("hello world", ["wor"], "hello "),
    ("hello world", ["xyz"], "hello world"),
    ("abcabd", ["abd"], "abc"),
    ("say STOP now", ["ST", "STOP"], "say "),
])
def test_detokenizer_holds_back_possible_stop_prefix(stream: str, stop: list[str],
                                                     expected: str) -> None:
    d = IncrementalDetokenizer(CharTokenizer(), [ord("x")], stop)
    emitted = ""
    for ch in stream:
        hit = d.add(ord(ch))
        emitted += d.take(final=hit)
        assert not any(s in emitted for s in stop)
        if hit:
            break
    emitted += d.take(final=True)
    assert emitted == expected


def test_detokenizer_waits_for_complete_utf8(tiny_engine: Any) -> None:
    tok = tiny_engine.tokenizer
    ids = tok.encode("café 🙂 done")
    d = IncrementalDetokenizer(tok, [], [])
    text = ""
    for t in ids:
        d.add(t)
        delta = d.take()
        assert "\ufffd" not in delta
        text += delta
    text += d.take(final=True)
    assert text == "café 🙂 done"
