"""SSE framing (case B11): events reassembled on blank lines whatever the read boundaries."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.proxy.core.sse import EventSplitter, parse_event

# A transcript exercising every framing rule: \n\n, \r\n\r\n, bare \r, comments, multi-line
# data, event: lines, and a JSON payload with escaped newlines inside.
TRANSCRIPT = (
    b': keep-alive comment\n\n'
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n'
    b'event: message\r\ndata: {"id":"c1","choices":[{"index":0,"delta":{"content":"lo\\n"}}]}'
    b'\r\n\r\n'
    b'data: line one\ndata: line two\n\n'
    b'data: {"x":1}\r\rdata: [DONE]\n\n'
)


def split_all(data: bytes, cuts: list[int]) -> list[bytes]:
    s = EventSplitter()
    out: list[bytes] = []
    prev = 0
    for c in sorted(set(cuts)) + [len(data)]:
        out += s.feed(data[prev:c])
        prev = c
    rest = s.flush()
    return out + ([rest] if rest else [])


def test_events_are_cut_at_blank_lines_of_every_line_ending() -> None:
    events = split_all(TRANSCRIPT, [])
    assert b"".join(events) == TRANSCRIPT
    assert len(events) == 6
    parsed = [parse_event(e) for e in events]
    assert parsed[0].data is None  # comment only
    assert parsed[2].event == "message" and parsed[2].data.endswith('"lo\\n"}}]}')
    assert parsed[3].data == "line one\nline two"
    assert parsed[4].data == '{"x":1}'
    assert parsed[5].data == "[DONE]"


def test_partial_json_event_waits_for_its_blank_line() -> None:
    s = EventSplitter()
    assert s.feed(b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"delta":'
                  b'{"content":"Hel') == []
    assert s.feed(b'lo"}}]}\n') == []
    out = s.feed(b"\ndata: [DONE]\n\n")
    assert [parse_event(e).data for e in out] == [
        '{"id":"c1","object":"chat.completion.chunk","choices":[{"delta":{"content":"Hello"}}]}',
        "[DONE]"]


def test_cr_at_read_end_is_held_until_the_next_byte() -> None:
    s = EventSplitter()
    assert s.feed(b"data: a\r\n\r") == []
    assert s.feed(b"\ndata: b\r\n\r\n") == [b"data: a\r\n\r\n", b"data: b\r\n\r\n"]


def test_unterminated_tail_is_returned_by_flush() -> None:
    s = EventSplitter()
    assert s.feed(b"data: a\n\ndata: tail") == [b"data: a\n\n"]
    assert s.flush() == b"data: tail"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(TRANSCRIPT)), max_size=40))
def test_any_split_points_give_the_same_events(cuts: list[int]) -> None:
    assert split_all(TRANSCRIPT, cuts) == split_all(TRANSCRIPT, [])
