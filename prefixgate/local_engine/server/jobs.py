"""A validated request -> an engine job: checks, sampling parameters, prompt ids off the loop.

Order, cheapest first, so nothing expensive runs for a request that is refused anyway:

1. Unsupported options (``n``, ``logprobs``, ``response_format``) and the sampling parameters
   (``SamplingParams.validate``, the core's one rule set: a 400 naming the field).
2. In a worker thread (``asyncio.to_thread``), so other streams keep flowing on the event loop:
   the tools' nesting depth (``schema_depth``), chat-template rendering, the size check before
   tokenizing (``tokenize.PromptLimit``: a prompt whose text must exceed the context at the most
   bytes per token is a 400 without being tokenized), tokenizing, and (when the prompt leaves
   room) building a forced tool call's grammar.
3. The exact context check: a prompt that leaves no room for one completion token is a 400;
   ``max_tokens`` is clamped to the room left (absent = all of it).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from prefixgate.local_engine.sched.api_types import InvalidSamplingParam, SamplingParams
from prefixgate.local_engine.server.constrained import tool_call_processor
from prefixgate.local_engine.server.protocol import ApiError, ChatCompletionRequest, CompletionRequest
from prefixgate.local_engine.server.tokenize import (
    PromptLimit,
    chat_prompt_ids,
    completion_prompt_ids,
    context_error,
)
from prefixgate.local_engine.server.tool_mask import resolve_tool_constraint

__all__ = ["Job", "chat_job", "completion_job", "sampling_params"]


@dataclass
class Job:
    """One admitted request: what goes to the engine and how the answer is shaped."""

    kind: str  # "chat" | "completion"
    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool
    parse_tools: bool
    extra_key: bytes | None
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    received: float = field(default_factory=time.perf_counter)
    extra: dict[str, Any] | None = None  # the body's fields outside OpenAI's (kv_transfer_params)
    external_tokens: int = 0  # prompt tokens whose KV a P/D transfer brought (server/pd_handoff.py)
    given_ids: list[int] | None = None  # P/D decode: the prefill side's first token(s)


def _check_common(req: ChatCompletionRequest | CompletionRequest) -> None:
    if req.n is not None and req.n != 1:
        raise ApiError("This engine supports only n=1.", param="n", code="invalid_value")
    if req.logprobs:
        raise ApiError("logprobs are not supported by this engine.", param="logprobs",
                       code="unsupported_parameter")
    fmt = getattr(req, "response_format", None)
    if fmt and fmt.get("type", "text") != "text":
        raise ApiError(f"response_format type '{fmt.get('type')}' is not supported by this "
                       "engine (no constrained decoding); only 'text' is.",
                       param="response_format", code="unsupported_parameter")


def _logit_bias(raw: dict[str, float] | None) -> dict[int, float]:
    """OpenAI's ``logit_bias`` (token ids as decimal strings) -> ``{id: bias}``. A key that is
    not a plain decimal integer (``"-1"``, ``" 5"``, ``"1_0"``, ``"٥"``) is a 400: ``int()``
    would accept some of those and bias a token nobody named."""
    out: dict[int, float] = {}
    for key, bias in (raw or {}).items():
        if not (key.isascii() and key.isdigit()):
            raise ApiError(f"Invalid key in 'logit_bias': {key[:40]!r} is not a token id.",
                           param="logit_bias", code="invalid_value")
        out[int(key)] = bias
    return out


def sampling_params(req: ChatCompletionRequest | CompletionRequest, vocab_size: int) -> SamplingParams:
    """Request fields -> validated ``SamplingParams`` (``max_tokens`` is the client's ask, or 1
    as a placeholder until the prompt's length is known: ``_fit``). ``top_k`` 0 or -1 is off
    (vLLM's), below -1 a 400. ApiError(400, ``invalid_value``, param = the field) for any value
    outside what the sampler computes finite results for."""
    wanted = req.requested_max_tokens()
    params = SamplingParams(
        max_tokens=1 if wanted is None else wanted,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=-1 if req.top_k in (None, 0) else req.top_k,
        min_p=0.0 if req.min_p is None else req.min_p,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        logit_bias=_logit_bias(req.logit_bias),
        seed=req.seed,
        stop=req.stop_list(),
        stop_token_ids=list(req.stop_token_ids or []),
        ignore_eos=req.ignore_eos,
        priority=req.priority,
    )
    try:
        params.validate(vocab_size)
    except InvalidSamplingParam as exc:
        raise ApiError(f"Invalid value for '{exc.param}': {exc}.", param=exc.param,
                       code="invalid_value") from None
    return params


def _fit(params: SamplingParams, req: ChatCompletionRequest | CompletionRequest,
         prompt_len: int, max_context: int, param: str) -> None:
    """Clamp ``params.max_tokens`` to the room the prompt leaves; no room is a 400."""
    room = max_context - prompt_len
    if room < 1:
        raise context_error(max_context, prompt_len, param)
    wanted = req.requested_max_tokens()
    params.max_tokens = room if wanted is None else min(wanted, room)


def _salt(req: ChatCompletionRequest | CompletionRequest) -> bytes | None:
    return req.cache_salt.encode() if req.cache_salt else None


async def chat_job(engine: Any, limit: PromptLimit, req: ChatCompletionRequest) -> Job:
    """The job of a chat request (module docstring's order); ApiError(400) on any refusal."""
    _check_common(req)
    params = sampling_params(req, engine.vocab_size)
    constraint = resolve_tool_constraint(req.tools, req.tool_choice)

    def work() -> tuple[list[int], Any]:
        ids = chat_prompt_ids(engine.tokenizer, req.messages, req.tools, limit=limit)
        if len(ids) >= engine.max_context_len:  # no room: refused before compiling a grammar
            raise context_error(engine.max_context_len, len(ids), "messages")
        proc = None
        if constraint is not None:  # tool_choice binds: calls masked at decode time
            proc = tool_call_processor(engine.tokenizer, req.tools or [], constraint)
        return ids, proc

    prompt_ids, proc = await asyncio.to_thread(work)
    _fit(params, req, len(prompt_ids), engine.max_context_len, "messages")
    if proc is not None:
        params.logits_processors = [proc]
    return Job(
        kind="chat",
        prompt_ids=prompt_ids,
        params=params,
        stream=bool(req.stream),
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        parse_tools=bool(req.tools) and req.tool_choice != "none",
        extra_key=_salt(req),
        extra=req.model_extra,
    )


async def completion_job(engine: Any, limit: PromptLimit, req: CompletionRequest) -> Job:
    """The job of a completion request (module docstring's order); ApiError(400) on refusal."""
    _check_common(req)
    if req.echo or req.suffix:
        raise ApiError("echo and suffix are not supported by this engine.",
                       param="echo" if req.echo else "suffix", code="unsupported_parameter")
    params = sampling_params(req, engine.vocab_size)
    prompt_ids = await asyncio.to_thread(completion_prompt_ids, engine.tokenizer, req.prompt,
                                         limit)
    _fit(params, req, len(prompt_ids), engine.max_context_len, "prompt")
    return Job(
        kind="completion",
        prompt_ids=prompt_ids,
        params=params,
        stream=bool(req.stream),
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        parse_tools=False,
        extra_key=_salt(req),
        extra=req.model_extra,
    )
