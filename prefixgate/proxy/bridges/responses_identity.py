"""The Responses identity bridge: a Responses client on a backend that serves ``/responses`` itself.

The body goes as the client sent it, except what the rewriter's passes can map back onto a
Responses body: they run on a Chat view (:meth:`ResponsesIdentity.pass_body`: ``instructions`` as
the system message, the function tools, at most 1,024 characters of the input's text as the user
turn, so the passes see whether the prompt can be cached at all) and its ``tools`` (canonical
order and schema key order) and ``prompt_cache_key`` / ``prompt_cache_retention`` (and, on a
route asking for cache diagnostics, ``prompt_cache_options``) are written back; input items go
as the client sent them. The answer is relayed untouched; its usage is read in the Responses
shape (:func:`responses_usage`, :class:`ResponsesWatcher`), and the relay's own closing error
becomes a Responses ``error`` event (:meth:`ResponsesIdentity.end_mapper`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from prefixgate.proxy.bridges.base import Bridge, Rewritten
from prefixgate.proxy.core import exactjson
from prefixgate.proxy.core.diagnostics import openai_diagnosis
from prefixgate.proxy.core.sse import EventMapper, SSEEvent
from prefixgate.proxy.core.usage import StreamWatcher, Usage

#: ``keep(response_id)``: remember which backend holds a response (the endpoint's store).
KeepPointer = Callable[[str], None]


def responses_usage(u: Any) -> Usage:
    """A Responses ``usage`` object -> :class:`~prefixgate.proxy.core.usage.Usage`
    (``input_tokens_details.span_reused_tokens``: our engine's, issue 33)."""
    u = u if isinstance(u, dict) else {}
    def num(v: Any) -> int | None:
        return v if isinstance(v, int) and not isinstance(v, bool) else None
    details = u.get("input_tokens_details")
    details = details if isinstance(details, dict) else {}
    return Usage(prompt_tokens=num(u.get("input_tokens")),
                 cached_tokens=num(details.get("cached_tokens")),
                 output_tokens=num(u.get("output_tokens")),
                 span_reused_tokens=num(details.get("span_reused_tokens")))


VIEW_INPUT_CHARS = 1024
"""Characters of the input's text the pass view's user turn carries: enough for the passes to
see whether the prompt can reach OpenAI's 1,024-token caching minimum (the ``prompt_cache_key``
is added only then); the input itself is never rewritten."""


def _input_excerpt(value: Any) -> str:
    """At most :data:`VIEW_INPUT_CHARS` of a Responses ``input``'s text (a string, or the text of
    its items' ``content`` / ``output`` / ``arguments``); ``"."`` when it has none."""
    if isinstance(value, str):
        return value[:VIEW_INPUT_CHARS] or "."
    parts: list[str] = []
    seen = 0
    for item in value if isinstance(value, list) else ():
        if seen >= VIEW_INPUT_CHARS:
            break
        if not isinstance(item, dict):
            continue
        texts = [item.get(k) for k in ("content", "output", "arguments")]
        for t in texts:
            if isinstance(t, list):
                t = " ".join(str(c.get("text", "")) for c in t if isinstance(c, dict))
            if isinstance(t, str) and t:
                parts.append(t[:VIEW_INPUT_CHARS - seen])
                seen += len(parts[-1])
    return " ".join(parts)[:VIEW_INPUT_CHARS] or "."


class ResponsesWatcher:
    """:class:`~prefixgate.proxy.core.usage.StreamWatcher` of a Responses stream: content events,
    the terminal event (``response.completed`` / ``incomplete``; its usage) and errors."""

    def __init__(self) -> None:
        self.usage, self.deltas, self.done, self.errors = Usage(), 0, 0, 0
        self.response_id = ""
        self.last_seq = -1  # the highest sequence_number seen

    def observe(self, ev: SSEEvent) -> bool:
        """True for an event carrying output (text, arguments, reasoning)."""
        try:
            obj = orjson.loads(ev.data or "null")
        except orjson.JSONDecodeError:
            return False
        kind = obj.get("type", ev.event) if isinstance(obj, dict) else ev.event
        seq = obj.get("sequence_number") if isinstance(obj, dict) else None
        if isinstance(seq, int) and not isinstance(seq, bool):
            self.last_seq = max(self.last_seq, seq)
        if kind in ("response.completed", "response.incomplete"):
            self.done += 1
            response = obj.get("response") or {}
            self.usage.merge(responses_usage(response.get("usage")))
            self.usage.diagnosed(openai_diagnosis(response))
        elif kind in ("response.failed", "error"):
            self.errors += 1
        elif kind == "response.created":
            self.response_id = str((obj.get("response") or {}).get("id", ""))
        if isinstance(kind, str) and kind.endswith(".delta"):
            self.deltas += 1
            return True
        return False


class ResponsesIdentity(Bridge):
    """Responses client -> a backend's own ``/responses`` (module docstring). ``keep``: called
    with the id of a response the backend stored (None: ``store: false``)."""

    def __init__(self, keep: KeepPointer | None = None) -> None:
        super().__init__("responses", "responses", "/responses")
        self.pass_api = "openai"
        self.keep = keep

    def pass_body(self, body: dict[str, Any]) -> dict[str, Any] | None:
        tools = body.get("tools")
        if not (isinstance(tools, list) or body.get("instructions")):
            return None
        view: dict[str, Any] = {"model": body["model"], "messages": [
            {"role": "system", "content": str(body.get("instructions") or "")},
            {"role": "user", "content": _input_excerpt(body.get("input"))}]}
        fn_tools = [t for t in tools or [] if isinstance(t, dict) and t.get("type") == "function"]
        if fn_tools and len(fn_tools) == len(tools or []):
            view["tools"] = [{"type": "function", "function": {k: v for k, v in t.items()
                                                               if k != "type"}} for t in fn_tools]
        return view

    def encode(self, body: dict[str, Any], raw: bytes, rewritten: Rewritten | None,
               model: str | None, max_depth: int) -> bytes:
        out = dict(body)
        if rewritten is not None:
            if isinstance(body.get("tools"), list) and rewritten.body.get("tools") is not None:
                out["tools"] = [{"type": "function", **t["function"]} for t in rewritten.body["tools"]]
            for key in ("prompt_cache_key", "prompt_cache_retention", "prompt_cache_options"):
                if key in rewritten.body and key not in body:
                    out[key] = rewritten.body[key]
        if model is not None:
            out["model"] = model
        return raw if out == body else exactjson.dumps(out)

    def stream(self, model: str, body: dict[str, Any]) -> tuple[StreamWatcher, EventMapper | None]:
        return ResponsesWatcher(), None

    def end_mapper(self, watcher: StreamWatcher) -> EventMapper | None:
        """The relay's own closing error (Chat-shaped ``data: {"error": {...}}``) as a Responses
        ``error`` event (``type``, ``code``, ``message``, ``param``, ``sequence_number``
        following the upstream's last)."""
        def end(raw: bytes, ev: SSEEvent) -> list[bytes]:
            err = orjson.loads(ev.data or "{}").get("error") or {}
            obj = {"type": "error", "code": err.get("code"), "message": err.get("message", ""),
                   "param": err.get("param"),
                   "sequence_number": getattr(watcher, "last_seq", -1) + 1}
            return [b"event: error\ndata: " + orjson.dumps(obj) + b"\n\n"]
        return end

    def loads(self, content: bytes) -> Any:
        return exactjson.loads(content)

    def answer(self, answer: dict[str, Any], content: bytes, model: str) -> tuple[bytes, Usage]:
        if self.keep is not None and isinstance(answer.get("id"), str):
            self.keep(answer["id"])
        return content, responses_usage(answer.get("usage")).diagnosed(openai_diagnosis(answer))

    def stream_done(self, watcher: StreamWatcher, status: str) -> None:
        """A stream ended with ``status``: a completed one's response id is kept."""
        rid = getattr(watcher, "response_id", "")
        if status == "ok" and rid and self.keep is not None:
            self.keep(rid)
