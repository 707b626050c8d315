"""A request's state inside the engine (nano-vllm's ``Sequence``).

Token bookkeeping: ``token_ids = prompt + completion``. ``slots[i]`` is the KV slot of token ``i``
for ``i < num_computed`` (those tokens' K/V are in the pool). The first ``num_tree_tokens`` slots
belong to the radix tree (locked through ``handle``); the rest were allocated for this request.
The request needs ``len(token_ids) - num_computed`` tokens computed before it can sample
again: 1 in decode, more in (chunked) prefill or after being retracted and re-admitted. During a
speculative step ``slots`` also covers the draft tokens being verified (``kv_manager`` regions).
With span reuse, ``filled`` lists token ranges ahead of ``num_computed`` whose K/V was copied
into their slots at admission: prefill chunks stop at the next one and ``skip_filled`` moves
``num_computed`` over it, so only the gaps (changed spans, the tail) are computed.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable

import torch

from prefixgate.local_engine.kv.radix_cache import CacheHandle
from prefixgate.local_engine.sched.api_types import PromptLogprobs, RequestOutput, SamplingParams
from prefixgate.local_engine.sched.detokenizer import IncrementalDetokenizer

_arrival = itertools.count()


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """One request: prompt, completion so far, its slots, its lock on the radix tree, its sink.

    ``sink(output)`` is called (on the engine thread) with each ``RequestOutput``, or with the
    exception that failed the step.
    """

    def __init__(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                 max_tokens: int, extra_key: bytes | None, generator: torch.Generator,
                 detok: IncrementalDetokenizer, stop_ids: set[int],
                 sink: Callable[[RequestOutput | BaseException], None]) -> None:
        self.request_id = request_id
        self.arrival = next(_arrival)
        self.token_ids: list[int] = list(prompt_ids)
        self.num_prompt = len(prompt_ids)
        self.params = params
        self.max_tokens = max_tokens
        self.extra_key = extra_key
        self.generator = generator
        self.detok = detok
        self.stop_ids = stop_ids
        self.sink = sink
        self.status = Status.WAITING
        self.slots: list[int] = []
        self.num_computed = 0
        self.num_tree_tokens = 0
        self.handle: CacheHandle | None = None
        self.row: int | None = None  # ReqToTokenTable row while running
        self.cached_tokens: int | None = None  # prompt tokens served by the cache (first admission)
        self.first_admission = False
        self.finish_reason: str | None = None
        self.pending_ids: list[int] = []
        self.prompt_cached = False  # prompt KV inserted into the radix tree (after its prefill)
        self.aborted = False
        self.scheduled_at: float | None = None  # perf_counter s of its first forward step
        self.spec_drafts = 0           # speculative decoding: drafts verified for this request,
        self.spec_draft_tokens = 0     # tokens proposed in them,
        self.spec_accepted_tokens = 0  # and of those, accepted
        self.filled: list[tuple[int, int]] = []  # [start, end) ranges copied ahead (span reuse)
        self.span_reused_tokens = 0  # prompt tokens reused across a changed span (first admission)
        self.prompt_logprob_parts: dict[int, torch.Tensor] = {}  # chunk start -> [n, V] rows
        self.prompt_logprobs_sent = False

    @property
    def num_completion(self) -> int:
        """Tokens generated so far (excludes the prompt)."""
        return len(self.token_ids) - self.num_prompt

    @property
    def num_uncomputed(self) -> int:
        """Tokens to run through the model before the next token can be sampled."""
        return len(self.token_ids) - self.num_computed

    @property
    def prefill_start(self) -> int:
        """Token where the next prefill chunk starts: the end of the allocated slots (as before
        span reuse), or ``num_computed`` while copied ranges lie ahead (their slots exist)."""
        return self.num_computed if self.filled else len(self.slots)

    def chunk_limit(self) -> int:
        """Tokens computable from ``num_computed`` before the next ``filled`` range (all the
        uncomputed ones when there is none)."""
        end = self.filled[0][0] if self.filled else len(self.token_ids)
        return end - self.num_computed

    def skip_filled(self) -> None:
        """Count every ``filled`` range that starts at or before ``num_computed`` as computed."""
        while self.filled and self.filled[0][0] <= self.num_computed:
            self.num_computed = max(self.num_computed, self.filled.pop(0)[1])

    def take_prompt_logprobs(self) -> PromptLogprobs | None:
        """The prompt's log-prob rows once its prefill is done (``params.prompt_logprobs``),
        once; None before, after, or when not asked for."""
        parts = self.prompt_logprob_parts
        if self.prompt_logprobs_sent or not parts or max(
                start + rows.shape[0] for start, rows in parts.items()) < self.num_prompt:
            return None  # the row of the last prompt position comes with the prompt's end
        self.prompt_logprobs_sent = True
        parts = sorted(self.prompt_logprob_parts.items())
        self.prompt_logprob_parts = {}
        positions = [p for start, rows in parts for p in range(start, start + rows.shape[0])]
        return PromptLogprobs(positions=positions, rows=torch.cat([r for _, r in parts]))

    def output(self, text: str) -> RequestOutput:
        """Build the output for what was produced since the last one and clear it."""
        out = RequestOutput(
            request_id=self.request_id,
            new_token_ids=self.pending_ids,
            text_delta=text,
            finished=self.status is Status.FINISHED,
            finish_reason=self.finish_reason,
            prompt_tokens=self.num_prompt,
            cached_tokens=self.cached_tokens or 0,
            completion_tokens=self.num_completion,
            scheduled_at=self.scheduled_at,
            spec_drafts=self.spec_drafts,
            spec_draft_tokens=self.spec_draft_tokens,
            spec_accepted_tokens=self.spec_accepted_tokens,
            span_reused_tokens=self.span_reused_tokens,
            prompt_logprobs=self.take_prompt_logprobs(),
        )
        self.pending_ids = []
        return out
