"""What the engine reads from a model directory besides the weights: the tokenizer, the
end-of-sequence token ids (the tokenizer's and ``generation_config.json``'s) and the dtype names
its config accepts."""

from __future__ import annotations

from typing import Any

import torch

from prefixgate.local_engine.model.llama import split_model_path

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def dtype_named(name: str | None, default: torch.dtype) -> torch.dtype:
    """The torch dtype called ``name`` (a key of :data:`DTYPES`), ``default`` for None.
    Raises ValueError naming the accepted names for any other name."""
    if name is None:
        return default
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r} (one of {sorted(DTYPES)})")
    return DTYPES[name]


def load_tokenizer(model_path: str) -> Any:
    """The Hugging Face tokenizer of ``model_path`` (a directory, or ``dir/file.gguf``)."""
    from transformers import AutoTokenizer

    d, gguf = split_model_path(model_path)
    return AutoTokenizer.from_pretrained(d, gguf_file=gguf) if gguf else AutoTokenizer.from_pretrained(d)


def eos_ids(model_path: str, tokenizer: Any) -> set[int]:
    """The token ids that end a sequence: the tokenizer's EOS and every id in the directory's
    ``generation_config.json`` (absent or unreadable: the tokenizer's alone)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    try:
        from transformers import GenerationConfig

        d, _ = split_model_path(model_path)
        eos = GenerationConfig.from_pretrained(d).eos_token_id
        ids.update([eos] if isinstance(eos, int) else list(eos or []))
    except (OSError, ValueError):
        pass
    return ids
