"""Hermes ``<tool_call>`` text -> OpenAI ``tool_calls`` (non-stream and streaming parser)."""

from __future__ import annotations

import json
import random

import pytest

from prefixgate.local_engine.server.tool_calls import ToolCallStream, parse_tool_calls

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'


def test_single_call_becomes_tool_calls_with_json_string_arguments() -> None:
    out = parse_tool_calls(CALL)
    assert out.content is None
    assert len(out.tool_calls) == 1
    call = out.tool_calls[0]
    assert call["type"] == "function"
    assert call["id"].startswith("call_") and len(call["id"]) > 10
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "days": 2}


def test_text_around_calls_is_content_and_two_calls_keep_order() -> None:
    second = CALL.replace("get_weather", "get_time")
    out = parse_tool_calls(f"Let me check.\n{CALL}\n{second}\n")
    assert out.content == "Let me check."
    assert [c["function"]["name"] for c in out.tool_calls] == ["get_weather", "get_time"]
    assert out.tool_calls[0]["id"] != out.tool_calls[1]["id"]


def test_string_arguments_are_passed_through() -> None:
    out = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert out.tool_calls[0]["function"]["arguments"] == '{"a": 1}'


def test_invalid_json_block_stays_text() -> None:
    text = "<tool_call>{name: oops}</tool_call> done"
    out = parse_tool_calls(text)
    assert out.tool_calls == []
    assert out.content == text


def test_unterminated_block_stays_text() -> None:
    text = 'ok <tool_call>{"name": "f", "argu'
    out = parse_tool_calls(text)
    assert out.tool_calls == [] and out.content == text


def test_plain_text_untouched() -> None:
    assert parse_tool_calls("  Hello <b>there</b>  ").content == "  Hello <b>there</b>  "


def _stream_all(text: str, cuts: list[int]) -> list[tuple[str, object]]:
    stream = ToolCallStream()
    events: list[tuple[str, object]] = []
    prev = 0
    for cut in [*cuts, len(text)]:
        events += stream.feed(text[prev:cut])
        prev = cut
    return events + stream.finish()


def test_stream_passes_text_early_and_holds_only_a_possible_tag() -> None:
    stream = ToolCallStream()
    assert stream.feed("Hello wor") == [("text", "Hello wor")]
    assert stream.feed("ld<tool") == [("text", "ld")]  # "<tool" may start a tag: held
    assert stream.feed("s are fun") == [("text", "<tools are fun")]


def test_stream_without_calls_keeps_every_whitespace() -> None:
    stream = ToolCallStream()
    events = stream.feed("  a \n") + stream.feed(" b ") + stream.finish()
    assert "".join(v for _, v in events) == "  a \n b "


def test_stream_emits_call_once_closed_with_index() -> None:
    stream = ToolCallStream()
    assert stream.feed("Sure. " + CALL[:20]) == [("text", "Sure.")]
    assert stream.feed(CALL[20:-3]) == []
    events = stream.feed(CALL[-3:] + " bye")
    assert events[0][0] == "tool_call"
    index, call = events[0][1]  # type: ignore[misc]
    assert index == 0 and call["function"]["name"] == "get_weather"
    assert events[1:] == [("text", "  bye")]  # the space held before the call, as non-stream
    assert stream.num_calls == 1


SPLIT_CASES = [
    f"A <tool> x {CALL} mid <tool_call>bad</tool_call>{CALL.replace('get_weather', 'g2')} end <tool_",
    f"Let me look that up.\n{CALL}\n{CALL.replace('get_weather', 'g2')}\n",
    f"{CALL}",
    f"First:\n{CALL}\n\nThen more text.  ",
    "No calls here, just text with trailing space  \n",
]


@pytest.mark.parametrize("text", SPLIT_CASES)
def test_stream_matches_non_stream_for_random_splits(text: str) -> None:
    expected = parse_tool_calls(text)
    rng = random.Random(7)
    for _ in range(150):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, 12)))
        events = _stream_all(text, cuts)
        streamed_text = "".join(v for k, v in events if k == "text")  # type: ignore[misc]
        names = [v[1]["function"]["name"] for k, v in events if k == "tool_call"]  # type: ignore[index]
        assert names == [c["function"]["name"] for c in expected.tool_calls]
        assert (streamed_text or None) == expected.content
