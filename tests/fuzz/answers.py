"""What the fuzz upstream answers: a text reply, or — when the request offers a ``get_*`` tool —
a call of that tool whose arguments hold numbers whose exact text must reach the client
(:data:`ANSWER_NUMBERS`: an integer beyond 64 bits and ``1.10``), in the backend's API, as JSON
or SSE.
"""

from __future__ import annotations

import json
from typing import Any

ANSWER_NUMBERS = ("123456789012345678901234567890", "1.10")
ARGS_JSON = '{"order_id":' + ANSWER_NUMBERS[0] + ',"amount":' + ANSWER_NUMBERS[1] + "}"
_ARGS = '"__ARGS__"'  # placeholder swapped for ARGS_JSON as raw JSON (numbers keep their text)


def answer_tool(body: Any) -> str | None:
    """The tool the upstream calls in its answer: the first ``get_*`` tool the request (either
    API) offers, or None (a text answer). Only ``get_*`` tools are called, so about half of the
    tool-bearing bodies get a text answer and their request checks stay reachable while a
    bridge still fails on the tool-call answer."""
    tools = body.get("tools") if isinstance(body, dict) else None
    for t in tools if isinstance(tools, list) else []:
        fn = t.get("function") if isinstance(t, dict) and isinstance(t.get("function"), dict) else t
        name = fn.get("name") if isinstance(fn, dict) else None
        if type(name) is str and name.startswith("get_"):  # type(): not a number kept as text
            return name
    return None


def _sse_data(objs: list[dict[str, Any]]) -> bytes:
    return b"".join(b"data: " + json.dumps(o).replace(_ARGS, ARGS_JSON).encode() + b"\n\n" for o in objs)


def openai_answer(stream: bool, tool: str | None) -> tuple[bytes, str]:
    """A Chat Completions answer (``chat.completion`` or chunks ending ``[DONE]``)."""
    usage = {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}
    call = {"id": "call_up", "type": "function", "function": {"name": tool, "arguments": ARGS_JSON}}
    if not stream:
        msg: dict[str, Any] = {"role": "assistant", "content": "ok"}
        if tool:
            msg = {"role": "assistant", "content": None, "tool_calls": [call]}
        return json.dumps({"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
                           "choices": [{"index": 0, "message": msg,
                                        "finish_reason": "tool_calls" if tool else "stop"}],
                           "usage": usage}).encode(), "application/json"
    if tool:
        deltas = [{"role": "assistant", "tool_calls": [{"index": 0, "id": "call_up", "type": "function",
                                                        "function": {"name": tool, "arguments": ""}}]},
                  {"tool_calls": [{"index": 0, "function": {"arguments": ARGS_JSON}}]}]
    else:
        deltas = [{"role": "assistant", "content": "o"}, {"content": "k"}]
    chunks = [{"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks[-1]["choices"][0]["finish_reason"] = "tool_calls" if tool else "stop"
    chunks.append({"choices": [], "usage": usage})
    head = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    return _sse_data([{**head, **c} for c in chunks]) + b"data: [DONE]\n\n", "text/event-stream"


def anthropic_answer(stream: bool, tool: str | None) -> tuple[bytes, str]:
    """A Messages answer (``message`` or events ending ``message_stop``)."""
    usage = {"input_tokens": 9, "output_tokens": 2, "cache_read_input_tokens": 0,
             "cache_creation_input_tokens": 0}
    block: dict[str, Any] = {"type": "text", "text": "ok"}
    if tool:
        block = {"type": "tool_use", "id": "toolu_up", "name": tool, "input": "__ARGS__"}
    stop = "tool_use" if tool else "end_turn"
    if not stream:
        return json.dumps({"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                           "content": [block], "stop_reason": stop, "stop_sequence": None,
                           "usage": usage}).replace(_ARGS, ARGS_JSON).encode(), "application/json"
    start = {**block, "input": {}} if tool else {"type": "text", "text": ""}
    delta = ({"type": "input_json_delta", "partial_json": ARGS_JSON} if tool
             else {"type": "text_delta", "text": "ok"})
    events = [
        {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                                              "model": "m", "content": [], "stop_reason": None,
                                              "stop_sequence": None, "usage": usage}},
        {"type": "content_block_start", "index": 0, "content_block": start},
        {"type": "content_block_delta", "index": 0, "delta": delta},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
         "usage": {"output_tokens": 2}},
        {"type": "message_stop"},
    ]
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events), \
        "text/event-stream"
