"""SSE assembly of chat answers: tool calls in streams and bodies, OpenAI chunk schema."""

from __future__ import annotations

import json
from typing import Any

from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.completion import Completion

from prefixgate.local_engine.server.chunks import (
    DONE,
    ChatChunks,
    ChatStreamWriter,
    CompletionChunks,
    CompletionStreamWriter,
    chat_message,
)

USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
         "prompt_tokens_details": {"cached_tokens": 8}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def _decode(events: list[bytes]) -> list[dict[str, Any]]:
    assert events[-1] == DONE
    out = []
    for e in events[:-1]:
        assert e.startswith(b"data: ") and e.endswith(b"\n\n")
        out.append(json.loads(e[6:]))
    return out


def _run(writer: ChatStreamWriter, deltas: list[str], reason: str) -> list[dict[str, Any]]:
    events = writer.start()
    for d in deltas:
        events += writer.feed(d)
    return _decode(events + writer.close(reason, USAGE))


def test_streamed_tool_call_becomes_a_tool_calls_delta_and_finish_reason() -> None:
    writer = ChatStreamWriter(ChatChunks("r1", 123, "m", include_usage=True), parse_tools=True)
    text = "I'll check. " + CALL
    chunks = _run(writer, [text[i:i + 7] for i in range(0, len(text), 7)], "stop")
    parsed = [ChatCompletionChunk.model_validate(c) for c in chunks]  # OpenAI's own schema
    content = "".join(p.choices[0].delta.content or "" for p in parsed if p.choices)
    assert content == "I'll check."  # as the non-stream content: whitespace before a call dropped
    calls = [tc for p in parsed if p.choices for tc in (p.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].index == 0
    assert calls[0].function and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments or "") == {"city": "Paris"}
    finishes = [p.choices[0].finish_reason for p in parsed if p.choices and p.choices[0].finish_reason]
    assert finishes == ["tool_calls"]
    assert parsed[-1].choices == [] and parsed[-1].usage is not None
    assert parsed[-1].usage.prompt_tokens_details.cached_tokens == 8  # type: ignore[union-attr]
    assert {p.id for p in parsed} == {"chatcmpl-r1"}


def test_without_tools_text_streams_verbatim_and_finish_reason_is_kept() -> None:
    writer = ChatStreamWriter(ChatChunks("r2", 1, "m"), parse_tools=False)
    chunks = _run(writer, ["a <tool_call>", "x", ""], "length")
    assert all("usage" not in c for c in chunks)  # include_usage off: no usage key at all
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == "a <tool_call>x"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_two_calls_get_indices_0_and_1() -> None:
    writer = ChatStreamWriter(ChatChunks("r3", 1, "m"), parse_tools=True)
    chunks = _run(writer, [CALL + "\n" + CALL.replace("get_weather", "get_time")], "stop")
    calls = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert [(tc["index"], tc["function"]["name"]) for tc in calls] == [(0, "get_weather"), (1, "get_time")]


def test_non_stream_message_with_tool_call_validates_as_chat_completion() -> None:
    message, reason = chat_message("Sure.\n" + CALL, "stop", parse_tools=True)
    body = ChatChunks("r4", 5, "m").full(message, reason, USAGE)
    resp = ChatCompletion.model_validate(body)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Sure."
    assert choice.message.tool_calls and choice.message.tool_calls[0].function.name == "get_weather"  # type: ignore[union-attr]


def test_non_stream_without_calls_keeps_text_and_reason() -> None:
    assert chat_message("plain", "length", parse_tools=True) == (
        {"role": "assistant", "content": "plain", "refusal": None, "annotations": []}, "length")


def test_completion_stream_validates_as_completion() -> None:
    writer = CompletionStreamWriter(CompletionChunks("r5", 1, "m", include_usage=True))
    events = writer.start() + writer.feed("Hello") + writer.feed("") + writer.close("stop", USAGE)
    chunks = _decode(events)
    for c in chunks:  # the SDK's type insists on a finish_reason: OpenAI streams send null
        if not c["choices"] or c["choices"][0]["finish_reason"]:
            Completion.model_validate(c)
    assert [c["choices"][0]["text"] for c in chunks if c["choices"]] == ["Hello", ""]
    assert chunks[-1]["usage"]["total_tokens"] == 15
