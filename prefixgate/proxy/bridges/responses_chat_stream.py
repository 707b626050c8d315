"""Chat Completions stream chunks -> Responses API stream events, one upstream event at a time.

The event sequence is the Responses API's (OpenAI reference, "Streaming events"; Open Responses
spec), every event with a strictly increasing ``sequence_number``::

    response.created, response.in_progress                      (first upstream chunk)
    response.output_item.added (message), response.content_part.added (output_text)
    response.output_text.delta ...                               (each content delta)
    response.output_item.added (function_call)                   (each new tool call)
    response.function_call_arguments.delta ...
    response.output_text.done, response.content_part.done, response.output_item.done
    response.function_call_arguments.done, response.output_item.done
    (a backend's ``reasoning_content``: one ``reasoning`` item, added at its first delta and
    done with its whole text at the end; no reasoning delta events)
    response.completed | response.incomplete (cap reached)       (on ``data: [DONE]``)

An upstream in-stream error (``data: {"error": ...}``) becomes ``response.failed``. When the
stream ends well, ``on_done(response)`` receives the final ``response`` object (the response
store keeps its items for ``previous_response_id``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from prefixgate.proxy.bridges.responses_chat_items import (
    call_item,
    new_id,
    output_text,
    reasoning_item,
    response_object,
    text_item,
    usage_object,
)
from prefixgate.proxy.core import exactjson
from prefixgate.proxy.core.sse import SSEEvent
from prefixgate.proxy.core.usage import Usage, engine_usage, filled_usage


@dataclass
class _Call:
    item_id: str
    index: int          # output_index
    call_id: str
    name: str
    arguments: str = ""


@dataclass
class _Text:
    item_id: str
    index: int
    text: str = ""


@dataclass
class ResponsesStream:
    """The mapper of one streamed response (see module docstring); :meth:`map` is a
    :data:`prefixgate.proxy.core.sse.EventMapper`."""

    body: dict[str, Any]
    resp_id: str
    on_done: Callable[[dict[str, Any]], None] | None = None
    created_at: int = field(default_factory=lambda: int(time.time()))
    seq: int = 0
    started: bool = False
    finished: bool = False
    text: _Text | None = None
    thought: _Text | None = None  # reasoning_content deltas (one reasoning item, no deltas out)
    calls: dict[int, _Call] = field(default_factory=dict)  # chat tool_call index -> call
    items: int = 0
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    last_usage: Any = None  # the last usage chunk's object
    engine: Usage = field(default_factory=Usage)  # the engine's own fields, newest non-null

    def _ev(self, kind: str, **data: Any) -> bytes:
        obj = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + exactjson.dumps(obj) + b"\n\n"

    def _response(self, status: str, output: list[dict[str, Any]] | None = None,
                  usage: dict[str, Any] | None = None) -> dict[str, Any]:
        return response_object(self.body, self.resp_id, self.created_at, output or [], usage,
                               status)

    def _start(self) -> list[bytes]:
        self.started = True
        r = self._response("in_progress")
        return [self._ev("response.created", response=r),
                self._ev("response.in_progress", response=r)]

    def _open_text(self) -> list[bytes]:
        self.text = _Text(new_id("msg"), self.items)
        self.items += 1
        item = {**text_item(self.text.item_id, "", "in_progress"), "content": []}
        return [self._ev("response.output_item.added", output_index=self.text.index, item=item),
                self._ev("response.content_part.added", item_id=self.text.item_id,
                         output_index=self.text.index, content_index=0, part=output_text(""))]

    def _thought_delta(self, delta: str) -> list[bytes]:
        out: list[bytes] = []
        if self.thought is None:
            self.thought = _Text(new_id("rs"), self.items)
            self.items += 1
            out.append(self._ev("response.output_item.added", output_index=self.thought.index,
                                item=reasoning_item(self.thought.item_id, "", "in_progress")))
        self.thought.text += delta
        return out

    def _text_delta(self, delta: str) -> list[bytes]:
        out = [] if self.text is not None else self._open_text()
        assert self.text is not None
        self.text.text += delta
        out.append(self._ev("response.output_text.delta", item_id=self.text.item_id,
                            output_index=self.text.index, content_index=0, delta=delta,
                            logprobs=[]))
        return out

    def _call_delta(self, tc: dict[str, Any]) -> list[bytes]:
        i = tc.get("index", 0)
        fn = tc.get("function") or {}
        out: list[bytes] = []
        call = self.calls.get(i)
        if call is None:
            call = self.calls[i] = _Call(new_id("fc"), self.items, tc.get("id") or new_id("call"),
                                         fn.get("name") or "")
            self.items += 1
            out.append(self._ev("response.output_item.added", output_index=call.index,
                                item=call_item(call.item_id, call.call_id, call.name, "",
                                               "in_progress")))
        if fn.get("arguments"):
            call.arguments += fn["arguments"]
            out.append(self._ev("response.function_call_arguments.delta", item_id=call.item_id,
                                output_index=call.index, delta=fn["arguments"]))
        return out

    def _finish(self) -> list[bytes]:
        self.finished = True
        out = [] if self.started else self._start()
        done: list[tuple[int, dict[str, Any]]] = []
        if self.thought is not None:
            item = reasoning_item(self.thought.item_id, self.thought.text)
            out.append(self._ev("response.output_item.done", output_index=self.thought.index,
                                item=item))
            done.append((self.thought.index, item))
        if self.text is not None:
            t = self.text
            item = text_item(t.item_id, t.text)
            out += [self._ev("response.output_text.done", item_id=t.item_id, output_index=t.index,
                             content_index=0, text=t.text, logprobs=[]),
                    self._ev("response.content_part.done", item_id=t.item_id,
                             output_index=t.index, content_index=0, part=output_text(t.text)),
                    self._ev("response.output_item.done", output_index=t.index, item=item)]
            done.append((t.index, item))
        for c in self.calls.values():
            item = call_item(c.item_id, c.call_id, c.name, c.arguments or "{}")
            out += [self._ev("response.function_call_arguments.done", item_id=c.item_id,
                             output_index=c.index, arguments=item["arguments"], name=c.name),
                    self._ev("response.output_item.done", output_index=c.index, item=item)]
            done.append((c.index, item))
        status = "incomplete" if self.finish_reason == "length" else "completed"
        final = self._response(status, [it for _, it in sorted(done, key=lambda d: d[0])],
                               self.usage or usage_object({}))
        out.append(self._ev(f"response.{status}", response=final))
        if self.on_done is not None:
            self.on_done(final)
        return out

    def _failed(self, err: Any) -> list[bytes]:
        self.finished = True
        out = [] if self.started else self._start()
        message = err.get("message") if isinstance(err, dict) else err
        r = self._response("failed")
        r["error"] = {"code": "server_error", "message": str(message or "upstream error")[:2000]}
        return out + [self._ev("response.failed", response=r)]

    def map(self, raw: bytes, ev: SSEEvent) -> list[bytes]:
        """Responses events for one Chat Completions stream event (see module docstring)."""
        if ev.data is None or self.finished:
            return []
        if ev.data.strip() == "[DONE]":
            return self._finish()
        try:
            chunk = orjson.loads(ev.data)
        except orjson.JSONDecodeError:
            return []
        if not isinstance(chunk, dict):
            return []
        if "error" in chunk and not chunk.get("choices"):
            return self._failed(chunk["error"])
        out = [] if self.started else self._start()
        if chunk.get("usage") or chunk.get("timings") or chunk.get("sglext"):
            self.last_usage = chunk.get("usage") or self.last_usage
            self.engine.merge(engine_usage(chunk))  # llama.cpp / SGLang counts fill the gaps
            self.usage = usage_object(filled_usage(self.last_usage, self.engine))
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(thought, str) and thought:
                out += self._thought_delta(thought)
            for text in (delta.get("content"), delta.get("refusal")):
                if text:
                    out += self._text_delta(text)
            for tc in delta.get("tool_calls") or []:
                out += self._call_delta(tc)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return out
