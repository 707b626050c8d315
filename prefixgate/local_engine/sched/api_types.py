"""The engine facade's data contract: configuration, sampling parameters, outputs, errors.

These are what the HTTP server and the benchmarks build and read; ``engine.Engine`` consumes them.
"""

from __future__ import annotations

import bisect
import math
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
    speculative: None (off), ``ngram``, ``suffix``, ``tools`` (tool-call JSON from the request's
    tool schemas), several joined by ``+`` (``ngram+suffix+tools``), or ``draft`` (needs
    ``draft_model_path``, a model sharing the tokenizer). num_speculative_tokens: most draft
    tokens per request and step (k). spec_max_batch_tokens: decode rows + draft tokens per step
    above which drafting stops (compute-bound; measured by ``bench/engine_speculative.py``).
    spec_cost_curve: measured ``(rows, step ms)`` points; with it each step's draft length is
    chosen by expected tokens per step time (``spec.decode.choose_k_cap``).
    spec_suffix_max_bytes / spec_suffix_max_namespaces: the ``suffix`` drafter's index holds at
    most this many bytes (measured: ``spec.suffix_index.SuffixIndex.nbytes``, ~0.5 KB a token) and
    this many ``cache_salt`` namespaces, least recently used evicted first.
    quantization: None (weights in ``dtype``) or ``int8`` (weight-only, per-channel scales).
    quant_fp32_layers / quant_fp32_head: with int8, this many decoder layers (the measured most
    sensitive ones for a measured model shape, else from the ends inwards:
    ``model.quant.sensitivity.kept_layers``) and the LM head stay in full precision (6 chosen by
    ``bench/int8_keep_sweep.py``: greedy agreement with fp32, docs/policy_guide.md).
    quant_outlier_channels: with int8, per product this many input channels (largest on a fixed
    calibration prefill) run in fp32 (``model.quant.int8.Int8Linear``); 0: none.
    packed_linear: fp32 on CPU, run linear layers through oneDNN with pre-packed weights
    (``model.quant.cpu_linear``; skinny products such as speculative verification are ~2x cheaper).
    kv_events_endpoint: a ZMQ endpoint (``tcp://*:5557``) to publish KV events on, in vLLM's
    schema (``kv/events.py``, ``kv/publisher.py``); None (default): off.
    kv_events_replay: the replay socket's endpoint (None: none); kv_events_block_size: tokens
    per published block; kv_events_hash / kv_events_seed: the block hash (``sha256`` or
    ``sha256_cbor``, ``kv/block_hash.py``) and its seed.
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
    spec_suffix_max_bytes: int = 64 << 20
    spec_suffix_max_namespaces: int = 256
    draft_model_path: str | None = None
    quantization: str | None = None
    quant_fp32_layers: int = 6
    quant_fp32_head: bool = True
    quant_outlier_channels: int = 24
    packed_linear: bool = True
    kv_events_endpoint: str | None = None
    kv_events_replay: str | None = None
    kv_events_block_size: int = 16
    kv_events_hash: str = "sha256"
    kv_events_seed: str = ""
    span_reuse: bool = True
    span_reuse_max_spans: int = 4
    span_reuse_max_span_tokens: int = 48
    span_reuse_min_anchor_tokens: int = 16
    span_reuse_values_only: bool = True


SEED_RANGE = (-(1 << 63), 1 << 64)  # what ``torch.Generator.manual_seed`` takes: [lo, hi)
LOGIT_BIAS_RANGE = 100.0  # OpenAI's logit_bias values are in [-100, 100]
PENALTY_RANGE = 2.0       # OpenAI's presence / frequency penalties are in [-2, 2]
TEMPERATURE_MAX = 2.0     # OpenAI's and vLLM's upper bound
# repetition_penalty: vLLM takes any finite r > 0, but logits are fp32 and r is cast to it: below
# ~1.4e-45 it becomes 0 and above ~3.4e38 inf, and -inf * 0 or 0 * inf is NaN. 1e-6..1e6 keeps r
# and 1/r far inside fp32's normal range.
REPETITION_RANGE = (1e-6, 1e6)


class InvalidSamplingParam(ValueError):
    """A sampling parameter outside the range the sampler computes finite results for;
    ``param`` names the field (the HTTP side answers a 400 naming it)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _finite_in(v: object, lo: float, hi: float) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) \
        and lo <= v <= hi


@dataclass
class SamplingParams:
    """Per-request decoding settings (OpenAI semantics, vLLM's extensions).

    temperature in [0, 2]; 0 is greedy, and so is any temperature below
    ``sampler.TEMPERATURE_FLOOR`` (0.01: vLLM raises such values to 0.01, whose draws differ
    from greedy only on near-ties; dividing by 1e-40 overflows fp32). top_k -1 → off. top_p:
    nucleus mass in (0, 1]. min_p: drop tokens whose probability is below ``min_p`` × the top
    token's, [0, 1]. presence_penalty / frequency_penalty: OpenAI's, over the completion so
    far, [-2, 2]. repetition_penalty: vLLM's / CTRL's, over prompt + completion, in
    ``REPETITION_RANGE`` (1 = off). logit_bias: token id → bias added to its logit, [-100, 100]
    (OpenAI). seed: a per-request ``torch.Generator`` seed in ``SEED_RANGE`` (same seed + same
    prompt → same tokens, whatever else is in the batch). stop: strings that end the completion
    and are not emitted. stop_token_ids: token ids that end it (EOS too unless ``ignore_eos``).
    max_tokens: completion cap, clipped to what fits the context. logits_processors:
    per-sequence ``(completion_ids, logits [V]) -> logits [V]`` callables applied in order
    before sampling (e.g. ``server.constrained.GrammarProcessor``); stateful, so one set per
    request. prompt_logprobs: return the log-softmax rows of the prompt positions this request
    computed (``RequestOutput.prompt_logprobs``; for teacher-forced comparisons, in-process
    only); prompt_logprobs_start: only positions from this one on (saves the LM head and the
    memory of a ``[n, vocab]`` row block for the rest). no_prefix_cache: match nothing in the
    prefix cache and decode on its own K/V only (the whole prompt is prefilled: the exact
    reference of a cache hit or a span reuse); its K/V still enters the cache at the end.
    priority: vLLM's request priority, a lower value served first; 0 (the default) is a client's,
    a positive value background work (the proxy's meaning-guard trials), which the scheduler
    admits and prefills only while no priority-0 request waits or runs.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logits_processors: list[Callable[[list[int], Any], Any]] = field(default_factory=list)
    prompt_logprobs: bool = False
    prompt_logprobs_start: int = 0
    no_prefix_cache: bool = False
    priority: int = 0

    @property
    def adjusts_logits(self) -> bool:
        """True when a bias or penalty changes the logits before temperature / filtering."""
        return bool(self.logit_bias) or self.presence_penalty != 0 or \
            self.frequency_penalty != 0 or self.repetition_penalty != 1

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise ``InvalidSamplingParam`` (a ``ValueError`` naming the field) unless every value
        is one the sampler computes finite results for (ranges in the class docstring;
        ``vocab_size``, when given, bounds the ``logit_bias`` token ids)."""
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise InvalidSamplingParam("max_tokens", "max_tokens must be an integer >= 1")
        if not _finite_in(self.temperature, 0.0, TEMPERATURE_MAX):
            raise InvalidSamplingParam("temperature", "temperature must be in [0, 2]")
        if not _finite_in(self.top_p, 0.0, 1.0) or self.top_p == 0:
            raise InvalidSamplingParam("top_p", "top_p must be in (0, 1]")
        if not _is_int(self.top_k) or self.top_k == 0 or self.top_k < -1:
            raise InvalidSamplingParam("top_k", "top_k must be -1 (off) or an integer >= 1")
        if not _finite_in(self.min_p, 0.0, 1.0):
            raise InvalidSamplingParam("min_p", "min_p must be in [0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            if not _finite_in(getattr(self, name), -PENALTY_RANGE, PENALTY_RANGE):
                raise InvalidSamplingParam(name, f"{name} must be in [-2, 2]")
        if not _finite_in(self.repetition_penalty, *REPETITION_RANGE):
            raise InvalidSamplingParam("repetition_penalty",
                                       "repetition_penalty must be in [1e-6, 1e6] (1 = off)")
        if self.seed is not None and not (_is_int(self.seed)
                                          and SEED_RANGE[0] <= self.seed < SEED_RANGE[1]):
            raise InvalidSamplingParam("seed", "seed must be an integer in [-2**63, 2**64)")
        if not _is_int(self.prompt_logprobs_start) or self.prompt_logprobs_start < 0:
            raise InvalidSamplingParam("prompt_logprobs_start",
                                       "prompt_logprobs_start must be an integer >= 0")
        if not _is_int(self.priority) or self.priority < 0:
            raise InvalidSamplingParam("priority", "priority must be an integer >= 0 "
                                       "(0: a client's, above 0: background)")
        hi = vocab_size if vocab_size is not None else math.inf
        for tok, bias in self.logit_bias.items():
            if not _is_int(tok) or not 0 <= tok < hi:
                raise InvalidSamplingParam("logit_bias", f"logit_bias key {tok!r} is not a token id "
                                           f"of this model's vocabulary [0, {hi})")
            if not _finite_in(bias, -LOGIT_BIAS_RANGE, LOGIT_BIAS_RANGE):
                raise InvalidSamplingParam("logit_bias",
                                           f"logit_bias value for token {tok} must be in [-100, 100]")


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
    span_reused_tokens: prompt tokens whose K/V was taken from the cache ACROSS a changed span
    (span reuse; also counted in ``cached_tokens``, which stays "prompt tokens not prefilled").
    prompt_logprobs: with ``SamplingParams.prompt_logprobs``, on the first output after the
    prompt's prefill (None on the others).
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
    span_reused_tokens: int = 0
    prompt_logprobs: PromptLogprobs | None = None


@dataclass
class PromptLogprobs:
    """Log-softmax rows of the prompt positions a request computed (prefilled).

    ``rows [n, vocab]`` float32 (a torch tensor): row ``i`` is log p(next token | prompt up to
    and including position ``positions[i]``), i.e. it predicts token ``positions[i] + 1`` (the
    last prompt position predicts the first completion token). Positions whose K/V came from
    the cache (prefix match, span reuse) have no row: ``row(p)`` is None for them.
    ``positions`` ascending; ``start`` is the first.
    """

    positions: list[int]
    rows: Any

    @property
    def start(self) -> int:
        """The first computed position."""
        return self.positions[0]

    def row(self, pos: int) -> Any:
        """The ``[vocab]`` row of prompt position ``pos``, or None when it was not computed."""
        i = bisect.bisect_left(self.positions, pos)
        if i < len(self.positions) and self.positions[i] == pos:
            return self.rows[i]
        return None


class PromptTooLong(ValueError):
    """The prompt leaves no room for a completion token within ``max_context_len``."""
