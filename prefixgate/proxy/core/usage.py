"""Read token usage and content-bearing deltas from upstream answers (cases B07, B08).

:class:`Usage` is the proxy's one view of a request's tokens::

    prompt_tokens       all input tokens (uncached + cache reads + cache writes)
    cached_tokens       input tokens served from the prefix cache (OpenAI
                        ``prompt_tokens_details.cached_tokens``, Anthropic
                        ``cache_read_input_tokens``)
    cache_write_tokens  Anthropic ``cache_creation_input_tokens`` (None when the API has none)
    output_tokens       completion tokens
    prefill_ms          the engine's own prompt-processing time, ms (llama.cpp
                        ``timings.prompt_ms``); None when the answer's body has none
    decode_ms           the engine's own generation time, ms (llama.cpp ``timings.predicted_ms``)
    miss_reason         the provider's own cache-miss reason (Anthropic ``diagnostics``, OpenAI
                        Responses ``prompt_cache_diagnostics``; :mod:`prefixgate.proxy.core.
                        diagnostics`), ``missed_tokens`` / ``reusable_tokens`` its counts
    span_reused_tokens  prompt tokens whose KV our engine reused across a changed span (a clock,
                        an id) after the prefix match stopped (issue 33); counted in
                        ``cached_tokens`` too. Our engine's
                        ``prompt_tokens_details.span_reused_tokens`` or its
                        ``X-Engine-Span-Reused-Tokens`` header; None from every other backend

A field the upstream did not report stays None; a reported 0 stays 0.

Each engine's own fields (issue 19, item 6; :func:`engine_usage`), read where the answer's
``usage`` lacks them — ``usage`` wins where both report:

- llama.cpp server (``tools/server``, ``result_timings::to_json``): a top-level ``timings``
  object in the non-streamed answer and in the final stream chunk (every chunk with
  ``timings_per_token``): ``cache_n`` (prompt tokens reused from the slot's cache),
  ``prompt_n`` (prompt tokens evaluated), ``prompt_ms`` (their processing time: prefill),
  ``predicted_n`` / ``predicted_ms`` (generation). ``prompt_tokens = cache_n + prompt_n``. Newer
  builds also report ``usage.prompt_tokens_details.cached_tokens`` (the same count).
- SGLang: ``usage.prompt_tokens_details.cached_tokens`` with ``--enable-cache-report`` (absent,
  not 0, when nothing was cached); with ``return_cached_tokens_details`` also
  ``sglext.cached_tokens_details`` ``{device, host, storage}`` (their sum is the cached count).
- vLLM: ``usage.prompt_tokens_details.cached_tokens`` with ``--enable-prompt-tokens-details``.
- ours (``prefixgate.local_engine``): the usage fields (with ``prompt_tokens_details``
  ``{"cached_tokens", "span_reused_tokens"}``), and ``X-Engine-*`` response headers
  (:func:`usage_from_headers`; times in :mod:`prefixgate.proxy.core.engine_timings`).

The proxy only reads these: the client gets the answer's bytes as the backend sent them.

Stream watchers see each complete SSE event once, say whether it carried content (text, tool-call
arguments, reasoning, refusal — what TTFT and TPOT are timed on) and keep the usage, the number
of final events (``done``: OpenAI ``data: [DONE]``, Anthropic ``message_stop``) and the number of
the upstream's own error events (``errors``: OpenAI ``data: {"error": ...}`` without choices,
Anthropic ``type: "error"``) — what the relay needs to say how the stream ended. Anthropic
reports input and cache counts in ``message_start`` and cumulative counts in ``message_delta``;
the watcher merges them taking the newest non-null value (B07).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Protocol

import orjson

from prefixgate.proxy.core.diagnostics import Diagnosis, anthropic_diagnosis
from prefixgate.proxy.core.sse import SSEEvent

_OPENAI_CONTENT_KEYS = ("content", "reasoning_content", "reasoning", "refusal")


@dataclass
class Usage:
    """Token counts of one request (see module docstring); None = not reported."""

    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None
    output_tokens: int | None = None
    prefill_ms: float | None = None
    decode_ms: float | None = None
    span_reused_tokens: int | None = None
    miss_reason: str | None = None
    missed_tokens: int | None = None
    reusable_tokens: int | None = None

    def diagnosed(self, d: Diagnosis | None) -> Usage:
        """This usage with a provider's diagnosis merged in (itself when ``d`` is None)."""
        if d is not None:
            self.merge(Usage(miss_reason=d.reason, missed_tokens=d.missed_tokens,
                             reusable_tokens=d.reusable_tokens))
        return self

    def merge(self, newer: Usage) -> None:
        """Take every non-None field of ``newer`` (newest non-null wins)."""
        for f in fields(self):
            v = getattr(newer, f.name)
            if v is not None:
                setattr(self, f.name, v)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _count(v: Any) -> int | None:
    """A token count an engine reported: a non-negative int (llama.cpp writes -1 for "not
    measured")."""
    n = _int(v)
    return n if n is not None and n >= 0 else None


def _ms(v: Any) -> float | None:
    """A duration an engine reported: a finite non-negative number of milliseconds."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) and v >= 0 else None


def engine_usage(answer: dict[str, Any]) -> Usage:
    """The engines' own fields of an OpenAI-shaped answer or stream chunk (module docstring):
    llama.cpp ``timings`` and SGLang ``sglext.cached_tokens_details``; empty Usage when it has
    neither."""
    out = Usage()
    t = answer.get("timings")
    if isinstance(t, dict):
        cache_n, prompt_n = _count(t.get("cache_n")), _count(t.get("prompt_n"))
        out.cached_tokens = cache_n
        out.prompt_tokens = None if cache_n is None or prompt_n is None else cache_n + prompt_n
        out.prefill_ms, out.decode_ms = _ms(t.get("prompt_ms")), _ms(t.get("predicted_ms"))
    ext = answer.get("sglext")
    details = ext.get("cached_tokens_details") if isinstance(ext, dict) else None
    if isinstance(details, dict) and out.cached_tokens is None:
        parts = [_count(details.get(k)) for k in ("device", "host", "storage")]
        if any(p is not None for p in parts):
            out.cached_tokens = sum(p or 0 for p in parts)
    return out


def filled_usage(usage: Any, engine: Usage) -> dict[str, Any]:
    """An OpenAI ``usage`` object (a copy; ``{}`` when not an object) whose missing
    ``prompt_tokens`` / ``prompt_tokens_details.cached_tokens`` are taken from the engine's own
    fields (:func:`engine_usage`): what a bridge maps, so the client sees the counts the ledger
    records. Every other key is kept as it is."""
    out = dict(usage) if isinstance(usage, dict) else {}
    if engine.prompt_tokens is not None and _int(out.get("prompt_tokens")) is None:
        out["prompt_tokens"] = engine.prompt_tokens
    details = out.get("prompt_tokens_details")
    details = details if isinstance(details, dict) else {}
    if engine.cached_tokens is not None and _int(details.get("cached_tokens")) is None:
        out["prompt_tokens_details"] = {**details, "cached_tokens": engine.cached_tokens}
    return out


def openai_answer_usage(answer: dict[str, Any]) -> Usage:
    """Usage of an OpenAI-shaped answer or chunk: its ``usage`` (:func:`openai_usage`), gaps
    filled from the engine's own fields (:func:`engine_usage`)."""
    out = engine_usage(answer)
    out.merge(openai_usage(answer.get("usage")))
    return out


def openai_usage(u: Any) -> Usage:
    """``{"prompt_tokens", "completion_tokens", "prompt_tokens_details": {"cached_tokens",
    "span_reused_tokens"}}`` -> Usage (``span_reused_tokens``: our engine's, issue 33). Anything
    not a dict gives an empty Usage."""
    if not isinstance(u, dict):
        return Usage()
    details = u.get("prompt_tokens_details")
    details = details if isinstance(details, dict) else {}
    return Usage(_int(u.get("prompt_tokens")), _int(details.get("cached_tokens")), None,
                 _int(u.get("completion_tokens")),
                 span_reused_tokens=_count(details.get("span_reused_tokens")))


def anthropic_usage(u: Any) -> Usage:
    """``{"input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
    "output_tokens"}`` -> Usage with ``prompt_tokens = input + read + write`` (B07)."""
    if not isinstance(u, dict):
        return Usage()
    inp = _int(u.get("input_tokens"))
    read = _int(u.get("cache_read_input_tokens"))
    write = _int(u.get("cache_creation_input_tokens"))
    prompt = None if inp is None else inp + (read or 0) + (write or 0)
    return Usage(prompt, read, write, _int(u.get("output_tokens")))


def _loads(data: str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


class StreamWatcher(Protocol):
    """Sees each complete event once (:class:`OpenAIStreamWatcher`, :class:`AnthropicStreamWatcher`)."""

    usage: Usage
    deltas: int
    done: int  # final events seen (OpenAI ``[DONE]``, Anthropic ``message_stop``)
    errors: int  # the upstream's own error events

    def observe(self, ev: SSEEvent) -> bool:
        """Return True when the event carried content."""
        ...


class OpenAIStreamWatcher:
    """Watches Chat Completions chunks: ``observe(event) -> True`` when the chunk carried
    content. ``deltas`` counts content-bearing chunks, ``done`` counts ``[DONE]`` events,
    ``errors`` the upstream's error chunks (``{"error": ...}`` without ``choices``: vLLM, SGLang,
    OpenAI mid-stream failures)."""

    def __init__(self) -> None:
        self.usage = Usage()
        self.deltas = 0
        self.done = 0
        self.errors = 0
        self.model: str | None = None  # the model the backend answered with (first seen)

    def observe(self, ev: SSEEvent) -> bool:
        """Update usage / counters from one event; return whether it carried content."""
        if ev.data is None:
            return False
        if ev.data.strip() == "[DONE]":
            self.done += 1
            return False
        chunk = _loads(ev.data)
        if not isinstance(chunk, dict):
            return False
        if "error" in chunk and not chunk.get("choices"):
            self.errors += 1
            return False
        if chunk.get("usage") or chunk.get("timings") or chunk.get("sglext"):
            self.usage.merge(openai_answer_usage(chunk))
        if self.model is None and isinstance(chunk.get("model"), str):
            self.model = chunk["model"][:200]
        content = False
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                continue
            if any(delta.get(k) for k in _OPENAI_CONTENT_KEYS) or delta.get("tool_calls"):
                content = True
        self.deltas += content
        return content


class AnthropicStreamWatcher:
    """Watches Messages stream events (``message_start``, ``content_block_delta``,
    ``message_delta``, ...): content = a text / input_json / thinking delta; ``done`` counts
    ``message_stop``, ``errors`` the upstream's ``error`` events (``overloaded_error``, ...)."""

    def __init__(self) -> None:
        self.usage = Usage()
        self.deltas = 0
        self.done = 0
        self.errors = 0
        self.model: str | None = None  # the model the backend answered with (first seen)
        self.message_id = ""  # message_start's id (the next request's diagnostics baseline)

    def observe(self, ev: SSEEvent) -> bool:
        """Update usage / counters from one event; return whether it carried content."""
        if ev.data is None:
            return False
        obj = _loads(ev.data)
        if not isinstance(obj, dict):
            return False
        kind = obj.get("type", ev.event)
        if kind == "message_start" and isinstance(obj.get("message"), dict):
            self.usage.merge(anthropic_usage(obj["message"].get("usage")))
            self.usage.diagnosed(anthropic_diagnosis(obj["message"]))
            model = obj["message"].get("model")
            self.model = model[:200] if isinstance(model, str) else self.model
            mid = obj["message"].get("id")
            self.message_id = mid if isinstance(mid, str) else self.message_id
        elif kind == "message_delta":
            u = obj.get("usage")
            if isinstance(u, dict):  # cumulative; without input_tokens the start's sum stays
                self.usage.merge(anthropic_usage(u))
        elif kind == "message_stop":
            self.done += 1
        elif kind == "error":
            self.errors += 1
        elif kind == "content_block_delta":
            d = obj.get("delta") or {}
            if any(d.get(k) for k in ("text", "partial_json", "thinking")):
                self.deltas += 1
                return True
        return False


# Headers an OpenAI-compatible engine may send before the body (our local engine does, on streams
# too, since its response starts once the first token exists): prompt and cached tokens.
ENGINE_PROMPT_HEADER = "x-engine-prompt-tokens"
ENGINE_CACHED_HEADER = "x-engine-cached-tokens"
ENGINE_SPAN_REUSED_HEADER = "x-engine-span-reused-tokens"


def usage_from_headers(headers: Any) -> Usage:
    """Prompt / cached / span-reused tokens from ``X-Engine-Prompt-Tokens`` /
    ``X-Engine-Cached-Tokens`` / ``X-Engine-Span-Reused-Tokens`` response headers (a field
    stays None when its header is absent, not 1-18 ASCII digits; never raises:
    ``"\u00b2".isdigit()`` is True but ``int("\u00b2")`` fails, and ``int`` refuses more than
    4,300 digits). A stream's usage chunk, when the client asked for one, later overrides
    these."""

    def num(name: str) -> int | None:
        v = headers.get(name)
        ok = isinstance(v, str) and 0 < len(v) <= 18 and v.isascii() and v.isdecimal()
        return int(v) if ok else None

    return Usage(num(ENGINE_PROMPT_HEADER), num(ENGINE_CACHED_HEADER),
                 span_reused_tokens=num(ENGINE_SPAN_REUSED_HEADER))


def usage_from_body(body: bytes, api: str) -> Usage:
    """Usage of a non-streamed answer body (either API); empty Usage when unreadable."""
    obj = _loads(body.decode("utf-8", errors="replace")) if body else None
    return usage_from_answer(obj, api)


def usage_from_answer(answer: Any, api: str) -> Usage:
    """Usage of an already parsed non-streamed answer (either API); empty Usage when it is not
    an object."""
    if not isinstance(answer, dict):
        return Usage()
    if api == "anthropic":
        return anthropic_usage(answer.get("usage")).diagnosed(anthropic_diagnosis(answer))
    return openai_answer_usage(answer)
