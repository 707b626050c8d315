"""Test helpers: a tiny random-weight Llama checkpoint and the real SmolLM2 directory.

``make_tiny_model_dir(dst)`` writes a 2-layer Llama (hidden 64, 4 heads, 2 KV heads, tied
embeddings, vocab of the SmolLM2 tokenizer = 49152) with fixed-seed random weights as an HF
safetensors directory, plus the SmolLM2 tokenizer files, so engine / server tests load a real
tokenizer and a real (if meaningless) model in well under a second.

``real_model_dir()`` returns the converted SmolLM2-135M-Instruct directory
(``$PREFIXGATE_MODEL_DIR``, default ``~/.cache/prefixgate/models/SmolLM2-135M-Instruct``) or
skips the calling test when it is absent.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

DEFAULT_MODEL_DIR = Path("~/.cache/prefixgate/models/SmolLM2-135M-Instruct").expanduser()
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "generation_config.json",
)
TINY_SEED = 1234


def model_dir() -> Path:
    """The SmolLM2 directory named by ``$PREFIXGATE_MODEL_DIR`` (may not exist)."""
    return Path(os.environ.get("PREFIXGATE_MODEL_DIR", str(DEFAULT_MODEL_DIR))).expanduser()


def real_model_dir() -> Path:
    """Return the converted SmolLM2-135M-Instruct directory, or ``pytest.skip`` if absent."""
    d = model_dir()
    if not (d / "config.json").exists() or not (d / "tokenizer.json").exists():
        pytest.skip(f"SmolLM2 model not found in {d} (run `make model`)")
    return d


def make_tiny_model_dir(
    dst: Path,
    *,
    num_hidden_layers: int = 2,
    hidden_size: int = 64,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 2048,
    tie_word_embeddings: bool = True,
    extra_config: dict[str, object] | None = None,
) -> Path:
    """Write a tiny random-weight Llama + the SmolLM2 tokenizer into ``dst``; return ``dst``.

    Weights are drawn with a fixed seed (``TINY_SEED``), so two calls give identical models.
    The tokenizer files are copied from ``model_dir()``; the test is skipped if it is absent.
    ``extra_config`` adds LlamaConfig fields (e.g. ``rope_parameters`` for llama3 scaling).
    Idempotent: an existing ``dst/config.json`` is reused.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    src = real_model_dir()
    dst = Path(dst)
    if (dst / "config.json").exists() and (dst / "model.safetensors").exists():
        return dst
    dst.mkdir(parents=True, exist_ok=True)
    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        initializer_range=0.2,  # wide enough that greedy decoding does not loop on one token
        **(extra_config or {}),
    )
    torch.manual_seed(TINY_SEED)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(dst)
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    return dst
