"""ToolSchemaDrafter: drafts the schema's text as tokens; exact outputs with it on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from prefixgate.local_engine.sched.api_types import SamplingParams
from prefixgate.local_engine.sched.sequence import Sequence
from prefixgate.local_engine.server.chat import encode_chat
from prefixgate.local_engine.spec.tool_drafter import ToolSchemaDrafter

TOOLS = [{"type": "function", "function": {"name": "get_user_details", "parameters": {
    "type": "object", "properties": {"user_id": {"type": "string"}}, "required": ["user_id"]}}},
         {"type": "function", "function": {"name": "cancel_reservation", "parameters": {
             "type": "object", "properties": {"reservation_id": {"type": "string"}, "reason": {
                 "type": "string", "enum": ["change_of_plan"]}},
             "required": ["reservation_id", "reason"]}}}]
MSGS = [{"role": "user", "content": "Cancel reservation ZFA04Y please, my id is mia_li_3668."}]


def seq(rid: str, prompt: list[int], out: list[int] | None = None) -> Sequence:
    s = Sequence(rid, prompt, SamplingParams(max_tokens=32, temperature=0.0), 32, None,
                 torch.Generator(), None, set(), lambda o: None)  # type: ignore[arg-type]
    s.token_ids += out or []
    return s


@pytest.fixture(scope="module")
def tok(tiny_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_dir))


def test_drafts_the_frame_name_and_keys_as_tokens(tok: Any) -> None:
    d = ToolSchemaDrafter(tok)
    prompt = encode_chat(tok, MSGS, TOOLS)
    out = tok.encode('<tool_call>\n{"name": "cancel', add_special_tokens=False)
    got = d.propose(seq("a", prompt, out), 32)
    assert got is not None
    assert tok.decode(got.tokens) == '_reservation", "arguments": {"reservation_id": '
    short = d.propose(seq("a", prompt, out), 2)
    assert short is not None and short.tokens == got.tokens[:2]
    after = tok.encode('<tool_call>\n{"name": "cancel_reservation", "arguments": {"reservation_id":'
                       ' "ZFA04Y", "reason": ', add_special_tokens=False)
    got = d.propose(seq("b", prompt, after), 32)
    assert got is not None and tok.decode(got.tokens) == '"change_of_plan"'


def test_no_tools_no_draft_and_release_forgets(tok: Any) -> None:
    d = ToolSchemaDrafter(tok)
    plain = encode_chat(tok, MSGS)
    s = seq("a", plain, tok.encode("<tool_call>\n", add_special_tokens=False))
    assert d.propose(s, 8) is None
    with_tools = seq("b", encode_chat(tok, MSGS, TOOLS), tok.encode("<tool", add_special_tokens=False))
    assert d.propose(with_tools, 8) is not None and "b" in d._req
    d.release(with_tools)
    assert "b" not in d._req


def test_tools_drafter_needs_a_tokenizer() -> None:
    from prefixgate.local_engine.sched.api_types import EngineConfig
    from prefixgate.local_engine.spec.factory import build_spec_decoder

    with pytest.raises(ValueError, match="tokenizer"):
        build_spec_decoder(EngineConfig(model_path="x", speculative="tools"), None,  # type: ignore[arg-type]
                           torch.device("cpu"), torch.float32, 10, 100)


def test_greedy_outputs_identical_with_tool_drafts(make_engine: Any) -> None:
    tools = TOOLS
    plain = make_engine()
    spec = make_engine(speculative="ngram+suffix+tools", num_speculative_tokens=6)
    tok = plain.tokenizer
    prefix = tok.encode('<tool_call>\n{"name": "cancel', add_special_tokens=False)  # drafts at once
    prompts = [encode_chat(tok, MSGS, tools) + prefix, encode_chat(tok, MSGS, tools),
               encode_chat(tok, MSGS)]
    params = SamplingParams(max_tokens=24, temperature=0.0)
    assert spec.generate_batch(prompts, params) == plain.generate_batch(prompts, params)
    # random tiny weights leave the frame at once (drafts are checked on SmolLM2: slow test below)


@pytest.mark.slow
def test_real_model_tool_calls_identical_and_drafted_long() -> None:
    from prefixgate.local_engine.engine import Engine, EngineConfig
    from tests.tiny_model import real_model_dir

    base = {"model_path": str(real_model_dir()), "num_kv_slots": 8192, "max_context_len": 2048}
    plain = Engine(EngineConfig(**base))
    spec = Engine(EngineConfig(**base, speculative="ngram+suffix+tools", num_speculative_tokens=6))
    try:
        tok = plain.tokenizer
        frame = tok.encode("<tool_call>\n", add_special_tokens=False)
        asks = ["Cancel reservation ZFA04Y please, my user id is mia_li_3668.",
                "Look up my profile, user id mia_li_3668.", "Cancel my trip 4WQ150, plans changed."]
        prompts = [encode_chat(tok, [{"role": "user", "content": a}], TOOLS) + frame for a in asks]
        params = SamplingParams(max_tokens=40, temperature=0.0)
        assert spec.generate_batch(prompts, params) == plain.generate_batch(prompts, params)
        st = spec.stats()
        assert st["spec_num_drafts"] > 0 and st["spec_mean_accepted_len"] >= 1.5, st  # measured 2.03
    finally:
        plain.shutdown()
        spec.shutdown()
