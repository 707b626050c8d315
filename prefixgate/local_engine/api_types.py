"""The engine facade's data contract: configuration, sampling parameters, outputs, errors.

These are what the HTTP server and the benchmarks build and read; ``engine.Engine`` consumes them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class EngineConfig:
    """How to build an ``Engine``.

    model_path: HF safetensors directory, or a ``.gguf`` file (loaded through transformers).
    device: ``cpu`` or ``cuda[:i]``. dtype: compute dtype name (``float32``, ``bfloat16``,
    ``float16``); None → float32 on cpu, bfloat16 on cuda. kv_dtype: KV storage dtype, None → dtype.
    num_kv_slots / kv_memory_gb: KV pool size in token slots or GiB (slots win; neither →
    enough for ``max_running`` full contexts, capped at 2 GiB on cpu).
    page_size: slots per KV page (radix matches are page-aligned).
    max_num_batched_tokens: token budget of one forward step (prefill chunks + decodes).
    chunk_size: largest prefill chunk of one request per step (chunked prefill).
    max_running: most requests in the running batch.
    enable_prefix_cache: reuse KV of cached prefixes through the radix tree.
    model_name: name reported by ``/v1/models`` (default: the directory name).
    max_context_len: cap on prompt + completion tokens (default: the model's
    ``max_position_embeddings``, further capped by the pool size).
    speculative: None (off), ``ngram``, ``suffix``, ``ngram+suffix`` or ``draft`` (needs
    ``draft_model_path``, a model sharing the tokenizer). num_speculative_tokens: most draft
    tokens per request and step (k). spec_max_batch_tokens: decode rows + draft tokens per step
    above which drafting stops (compute-bound; measured by ``bench/engine_speculative.py``).
    spec_cost_curve: measured ``(rows, step ms)`` points; with it each step's draft length is
    chosen by expected tokens per step time (``spec_decode.choose_k_cap``).
    quantization: None (weights in ``dtype``) or ``int8`` (weight-only, per-channel scales).
    packed_linear: fp32 on CPU, run linear layers through oneDNN with pre-packed weights
    (``cpu_linear``; skinny products such as speculative verification are ~2x cheaper).
    """

    model_path: str
    device: str = "cpu"
    dtype: str | None = None
    kv_dtype: str | None = None
    num_kv_slots: int | None = None
    kv_memory_gb: float | None = None
    page_size: int = 1
    max_num_batched_tokens: int = 2048
    chunk_size: int = 512
    max_running: int = 64
    enable_prefix_cache: bool = True
    model_name: str | None = None
    max_context_len: int | None = None
    speculative: str | None = None
    num_speculative_tokens: int = 4
    spec_max_batch_tokens: int = 16
    spec_cost_curve: list[tuple[int, float]] | None = None
    draft_model_path: str | None = None
    quantization: str | None = None
    packed_linear: bool = True


@dataclass
class SamplingParams:
    """Per-request decoding settings (OpenAI semantics).

    temperature 0 → greedy. top_k -1 → off. seed: a per-request ``torch.Generator`` seed
    (same seed + same prompt → same tokens, whatever else is in the batch). stop: strings that end
    the completion and are not emitted. stop_token_ids: token ids that end it (EOS too unless
    ``ignore_eos``). max_tokens: completion cap, clipped to what fits the context.
    logits_processors: per-sequence ``(completion_ids, logits [V]) -> logits [V]`` callables
    applied in order before sampling (e.g. ``server.constrained.GrammarProcessor``); stateful, so one
    set per request.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logits_processors: list[Callable[[list[int], Any], Any]] = field(default_factory=list)

    def validate(self) -> None:
        """Raise ``ValueError`` for out-of-range values."""
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError("top_k must be -1 (off) or >= 1")


@dataclass
class RequestOutput:
    """One streamed increment of a request (one per decode step that produced output).

    new_token_ids: tokens sampled since the last output (stop tokens included).
    text_delta: their text (held back while it might begin a stop string; stop text never
    emitted). finish_reason: ``stop`` (EOS / stop id / stop string), ``length`` (max_tokens or
    context full), ``abort``, or None while running. prompt_tokens / cached_tokens (prompt tokens
    whose KV came from the prefix cache) / completion_tokens: running usage counts.
    scheduled_at: ``time.perf_counter()`` when the request first joined a forward step (the end
    of its queueing), None before.
    spec_drafts / spec_draft_tokens / spec_accepted_tokens: speculative decoding so far (drafts
    verified, tokens proposed, tokens accepted; 0 with speculation off).
    """

    request_id: str
    new_token_ids: list[int]
    text_delta: str
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    scheduled_at: float | None = None
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0


class PromptTooLong(ValueError):
    """The prompt leaves no room for a completion token within ``max_context_len``."""
