"""Parse Hermes-style tool calls out of generated text into OpenAI ``tool_calls``.

The model is prompted (see ``chat.py``) to call a tool by emitting::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Rules (as vLLM's ``hermes`` tool parser): every complete ``<tool_call>..</tool_call>`` block
whose body is a JSON object with a string ``name`` becomes one OpenAI tool call
``{"id": "call_<24 hex>", "type": "function", "function": {"name", "arguments": <JSON string>}}``;
text outside the blocks stays ``content`` (null when only whitespace). A block whose body does
not parse, or an unterminated block (generation hit ``max_tokens``), stays plain text — nothing
the model wrote is dropped.

Streaming: ``ToolCallStream`` passes text through as soon as it cannot be the start of a
``<tool_call>`` tag, and buffers only from a possible tag start to the closing tag.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CLOSE_TAG", "OPEN_TAG", "ParsedOutput", "ToolCallStream", "parse_tool_calls"]

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"


def _new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _parse_block(body: str) -> dict[str, Any] | None:
    """One block body -> OpenAI tool call dict, or None when it is not a valid call."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):  # the model wrote ~1000+ nested brackets: not a call
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return {
        "id": _new_call_id(),
        "type": "function",
        "function": {"name": obj["name"], "arguments": arguments},
    }


@dataclass
class ParsedOutput:
    """Generated text split into ``content`` (None when empty) and OpenAI ``tool_calls``."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


def parse_tool_calls(text: str) -> ParsedOutput:
    """Split complete generated ``text`` into content and tool calls (rules: module doc)."""
    content: list[str] = []
    calls: list[dict[str, Any]] = []
    pos = 0
    while True:
        start = text.find(OPEN_TAG, pos)
        if start < 0:
            break
        end = text.find(CLOSE_TAG, start + len(OPEN_TAG))
        if end < 0:
            break
        call = _parse_block(text[start + len(OPEN_TAG) : end])
        if call is None:
            content.append(text[pos : end + len(CLOSE_TAG)])
        else:
            content.append(text[pos:start])
            calls.append(call)
        pos = end + len(CLOSE_TAG)
    content.append(text[pos:])
    joined = "".join(content)
    if calls:
        joined = joined.strip()
    return ParsedOutput(content=joined or None, tool_calls=calls)


def _partial_tag_suffix(text: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``OPEN_TAG``."""
    for n in range(min(len(OPEN_TAG) - 1, len(text)), 0, -1):
        if OPEN_TAG.startswith(text[-n:]):
            return n
    return 0


class ToolCallStream:
    """Incremental tool-call parser for streamed text deltas.

    ``feed(delta)`` and ``finish()`` return a list of events, each either
    ``("text", str)`` — content to send now — or ``("tool_call", (index, dict))`` — one
    complete OpenAI tool call and its 0-based position among this stream's calls.

    Text is held back only while it may be (part of) a ``<tool_call>`` block, and trailing
    whitespace is held until non-whitespace text follows it: whitespace that only separates
    tool calls or ends the answer is dropped once a call was made, as ``parse_tool_calls``
    strips it (a stream without calls gets every character).
    """

    def __init__(self) -> None:
        self._buf = ""
        self._in_call = False
        self._held_ws = ""
        self.num_calls = 0

    def _text(self, text: str, events: list[tuple[str, Any]]) -> None:
        core = text.rstrip()
        if core:
            events.append(("text", self._held_ws + core))
            self._held_ws = ""
        self._held_ws += text[len(core):]

    def feed(self, delta: str) -> list[tuple[str, Any]]:
        """Consume the next text delta; return the events it completes."""
        self._buf += delta
        events: list[tuple[str, Any]] = []
        while True:
            if not self._in_call:
                start = self._buf.find(OPEN_TAG)
                if start < 0:
                    cut = len(self._buf) - _partial_tag_suffix(self._buf)
                    text, self._buf = self._buf[:cut], self._buf[cut:]
                    self._text(text, events)
                    return events
                self._text(self._buf[:start], events)
                self._buf = self._buf[start:]
                self._in_call = True
            end = self._buf.find(CLOSE_TAG)
            if end < 0:
                return events
            block = self._buf[: end + len(CLOSE_TAG)]
            self._buf = self._buf[end + len(CLOSE_TAG) :]
            self._in_call = False
            call = _parse_block(block[len(OPEN_TAG) : -len(CLOSE_TAG)])
            if call is None:
                self._text(block, events)
            else:
                events.append(("tool_call", (self.num_calls, call)))
                self.num_calls += 1

    def finish(self) -> list[tuple[str, Any]]:
        """End of generation: flush held-back text (an unterminated block stays text; held
        whitespace is kept only when no call was made)."""
        events: list[tuple[str, Any]] = []
        self._text(self._buf, events)
        self._buf, self._in_call = "", False
        if self._held_ws and not self.num_calls:
            events.append(("text", self._held_ws))
        self._held_ws = ""
        return events
