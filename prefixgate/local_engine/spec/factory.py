"""Builds the engine's ``SpecDecoder`` from ``EngineConfig`` (or None with speculation off).

``speculative`` names drafters joined by ``+`` (``ngram``, ``suffix``, ``draft``, ``tools``:
tool-call JSON from the request's tool schemas, ``tool_drafter``); several are
chained (``drafters.ChainDrafter``: the longest proposal wins). ``suffix`` subscribes its index
to the KV manager's tree insertions, bounded by ``spec_suffix_max_bytes`` /
``spec_suffix_max_namespaces``.
"""

from __future__ import annotations

from typing import Any

import torch

from prefixgate.local_engine.sched.api_types import EngineConfig
from prefixgate.local_engine.sched.kv_manager import KVManager
from prefixgate.local_engine.spec.decode import SpecDecoder
from prefixgate.local_engine.spec.drafters import (
    ChainDrafter,
    Drafter,
    NgramDrafter,
    SuffixDrafter,
    SuffixIndex,
)

METHODS = ("ngram", "suffix", "draft", "tools")


def build_spec_decoder(cfg: EngineConfig, kv: KVManager, device: torch.device,
                       dtype: torch.dtype, vocab: int, max_context_len: int,
                       tokenizer: Any = None) -> SpecDecoder | None:
    """The decoder for ``cfg.speculative`` (None when off). ``tokenizer``: the model's (for
    ``tools``).

    Raises ``ValueError`` for an unknown method, ``draft`` without ``draft_model_path``, a
    draft model whose vocabulary differs from the target's, or ``tools`` without a tokenizer.
    """
    if not cfg.speculative:
        return None
    drafters: list[Drafter] = []
    indexes: list[SuffixIndex] = []
    for name in cfg.speculative.split("+"):
        if name == "ngram":
            drafters.append(NgramDrafter())
        elif name == "suffix":
            index = SuffixIndex(max_bytes=cfg.spec_suffix_max_bytes,
                                max_namespaces=cfg.spec_suffix_max_namespaces)
            kv.on_insert.append(index.add)
            drafters.append(SuffixDrafter(index))
            indexes.append(index)
        elif name == "draft":
            if not cfg.draft_model_path:
                raise ValueError("speculative 'draft' needs draft_model_path")
            from prefixgate.local_engine.spec.draft_model import DraftModelDrafter

            drafters.append(DraftModelDrafter(cfg.draft_model_path, device, dtype,
                                              max_context_len, vocab, cfg.max_running))
        elif name == "tools":
            if tokenizer is None:
                raise ValueError("speculative 'tools' needs the model's tokenizer")
            from prefixgate.local_engine.spec.tool_drafter import ToolSchemaDrafter

            drafters.append(ToolSchemaDrafter(tokenizer))
        else:
            raise ValueError(f"unknown speculative method {name!r} (one of {list(METHODS)})")
    drafter: Drafter = drafters[0] if len(drafters) == 1 else ChainDrafter(drafters)
    dec = SpecDecoder(drafter, cfg.num_speculative_tokens, cfg.spec_max_batch_tokens,
                      cfg.spec_cost_curve)
    dec.suffix_indexes = indexes
    return dec
