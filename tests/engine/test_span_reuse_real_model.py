"""Span reuse on SmolLM2-135M-Instruct: a consecutive request whose clock and request id changed
(the id tokenizes to a different length: shifted keys) answers as a full recompute does."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from prefixgate.local_engine.engine import Engine, EngineConfig, SamplingParams
from prefixgate.local_engine.server.chat import encode_chat
from tests.tiny_model import real_model_dir

POLICY = ("You are an airline agent. Follow the policy. Cancel a reservation only when the user "
          "confirms. Check the membership level before offering compensation. Basic economy "
          "tickets cannot be modified. Always ask for the reservation id and the user id. ") * 6


def messages(clock: str, rid: str, turns: int) -> list[dict[str, str]]:
    """The conversation up to its ``turns``-th user message (1 or 2)."""
    out = [{"role": "system", "content": f"Current time: {clock}\nRequest ID: {rid}\n{POLICY}"},
           {"role": "user", "content": "Hi, I want to cancel my trip. My user id is mia_li_3668."}]
    if turns > 1:
        out += [{"role": "assistant", "content": "Sure. What is the reservation id?"},
                {"role": "user", "content": "It is NO6JO3. Can I get my money back?"}]
    return out


def collect(eng: Engine, ids: list[int], **kw: Any) -> list[Any]:
    async def go() -> list[Any]:
        params = SamplingParams(temperature=0.0, **{"max_tokens": 24, **kw})
        return [o async for o in eng.generate(ids, params)]
    return asyncio.run(go())


@pytest.mark.slow
def test_clock_and_id_changed_request_answers_like_a_full_recompute() -> None:
    d = str(real_model_dir())
    on = Engine(EngineConfig(model_path=d, num_kv_slots=8192, max_context_len=2048))
    off = Engine(EngineConfig(model_path=d, num_kv_slots=8192, max_context_len=2048,
                              span_reuse=False))
    try:
        tok = on.tokenizer
        first = encode_chat(tok, messages("2024-05-15 15:00:07 EST", "req_3f9a", 1), None)
        second = encode_chat(tok, messages("2024-05-15 15:01:39 EST", "req_7be21c0d94", 2), None)
        prefix = next(i for i, (x, y) in enumerate(zip(first, second)) if x != y)
        for eng in (on, off):
            collect(eng, first)
        got, want = collect(on, second), collect(off, second)
        assert [t for o in got for t in o.new_token_ids] == [t for o in want for t in o.new_token_ids]
        reused = got[-1].span_reused_tokens
        old_rest = len(first) - prefix  # the first request's tokens after the divergence
        assert old_rest - 40 < reused < old_rest  # all of them but the changed clock and id
        assert got[-1].cached_tokens == prefix + reused
        assert want[-1].cached_tokens == prefix and want[-1].span_reused_tokens == 0
        answer = [t for o in want for t in o.new_token_ids]
        start = len(second) - 1
        rows = {}
        assert on.reset_prefix_cache()  # the tree as before the second request: its first only
        collect(on, first)
        for name, eng, kw in (("span", on, {}), ("exact", off, {"no_prefix_cache": True})):
            out = collect(eng, second + answer, max_tokens=1, prompt_logprobs=True,
                          prompt_logprobs_start=start, **kw)
            pl = out[0].prompt_logprobs
            assert (out[-1].span_reused_tokens > 0) == (name == "span")
            rows[name] = torch.stack([pl.row(p) for p in range(start, start + len(answer))])
        p, q = rows["exact"], rows["span"]
        kl = (p.exp() * (p - q)).sum(-1)
        # measured 1.05e-4 mean, 7.5e-4 max (the id's length changed: shifted, re-rotated keys)
        assert float(kl.mean()) < 5e-4 and float(kl.max()) < 5e-3
        assert torch.equal(q.argmax(-1), torch.tensor(answer))
    finally:
        on.shutdown()
        off.shutdown()
