"""Our forward's greedy tokens equal transformers' own ``generate`` (tiny models, SmolLM2)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from prefixgate.local_engine.sched.api_types import SamplingParams
from tests.tiny_model import make_tiny_model_dir, real_model_dir

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def hf_greedy(model_dir: Path, prompt: list[int], n: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n,
                      do_sample=False, pad_token_id=0)
    return [int(t) for t in out[0, len(prompt):]]


def save_tiny(cls_name: str, cfg_kw: dict[str, Any], dst: Path) -> Path:
    """Save a tiny random model of another architecture with the SmolLM2 tokenizer."""
    import transformers

    tok_src = make_tiny_model_dir(dst.parent / "tok_src")
    cfg_cls = getattr(transformers, cls_name.replace("ForCausalLM", "Config"))
    cfg = cfg_cls(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                  initializer_range=0.2, **cfg_kw)
    torch.manual_seed(7)
    getattr(transformers, cls_name)(cfg).save_pretrained(dst)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_src / name, dst / name)
    return dst


def test_tiny_llama_greedy_matches_transformers(tiny_dir: Path, make_engine: Any) -> None:
    eng = make_engine()
    prompt = eng.tokenizer.encode("The quick brown fox jumps over the lazy dog.")
    ours = eng.generate_batch([prompt], GREEDY)[0]
    assert ours == hf_greedy(tiny_dir, prompt, GREEDY.max_tokens)
    assert len(set(ours)) > 5  # the tiny model does not just repeat a token


@pytest.mark.parametrize("arch,cfg_kw", [
    ("LlamaForCausalLM", {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    ("Qwen2ForCausalLM", {"tie_word_embeddings": False}),
    ("MistralForCausalLM", {"sliding_window": None}),
])
def test_other_architectures_match_transformers(arch: str, cfg_kw: dict[str, Any],
                                                 tmp_path: Path, make_engine: Any) -> None:
    d = save_tiny(arch, cfg_kw, tmp_path / arch)
    eng = make_engine(model_path=d)
    # a prompt longer than original_max_position_embeddings exercises the llama3 scaling
    prompt = eng.tokenizer.encode("Radix trees share prefixes. " * 12)
    assert len(prompt) > 64
    ours = eng.generate_batch([prompt], GREEDY)[0]
    assert ours == hf_greedy(d, prompt, GREEDY.max_tokens)


@pytest.mark.slow
def test_smollm2_greedy_64_tokens_match_transformers(make_engine: Any) -> None:
    d = real_model_dir()
    eng = make_engine(model_path=d, num_kv_slots=2048, max_context_len=2048)
    msgs = [{"role": "user", "content": "Name three uses of a radix tree."}]
    prompt = list(eng.tokenizer.apply_chat_template(msgs, add_generation_prompt=True,
                                                     return_dict=False))
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    ours = eng.generate_batch([prompt], params)[0]
    assert ours == hf_greedy(d, prompt, 64)


def test_llama3_rope_frequencies_match_transformers() -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from prefixgate.local_engine.model.llama import ModelArgs, rope_inv_freq

    cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    args = ModelArgs.from_hf_config(cfg)
    assert args.rope_scaling is not None and args.rope_scaling["rope_type"] == "llama3"
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg)
    ours = rope_inv_freq(args)
    torch.testing.assert_close(ours, theirs.float())
    plain = rope_inv_freq(ModelArgs(**{**args.__dict__, "rope_scaling": None}))
    assert not torch.allclose(ours, plain)  # the scaling changed the low frequencies
