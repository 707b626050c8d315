"""Streaming relay: byte-identical, incremental, timed (cases B10, B11), disconnects."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefixgate.proxy.core.sse import EventSplitter, parse_event
from tests.paths import DATA
from tests.proxy.upstream import DONE, Script, chunk, wait_rows

RECORDINGS = sorted((DATA / "sse" / "openai").glob("*.bin"))
BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "Explain recursion"}]}


def stream_through(url: str, body: dict[str, Any] = BODY,
                   headers: dict[str, str] | None = None) -> tuple[httpx.Response, list[tuple[float, bytes]]]:
    """POST through the proxy; return the response and (arrival time, event bytes) pairs."""
    events: list[tuple[float, bytes]] = []
    splitter = EventSplitter()
    with httpx.Client(timeout=30) as c, c.stream("POST", url + "/v1/chat/completions",
                                                 json=body, headers=headers) as r:
        for piece in r.iter_raw():
            now = time.perf_counter()
            events += [(now, e) for e in splitter.feed(piece)]
        tail = splitter.flush()
        if tail:
            events.append((time.perf_counter(), tail))
    return r, events


def events_of(data: bytes) -> list[bytes]:
    s = EventSplitter()
    out = s.feed(data)
    tail = s.flush()
    return out + ([tail] if tail else [])


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.name[:12] for p in RECORDINGS])
def test_openai_recording_arrives_byte_identical_and_incrementally(rig: Any, path: Path) -> None:
    data = path.read_bytes()
    upstream_events = events_of(data)
    rig.upstream.script = Script(pieces=upstream_events, delay_s=0.004)
    r, got = stream_through(rig.url)
    assert r.status_code == 200
    assert b"".join(e for _, e in got) == data
    # the events arrive as the upstream's events, one per event (incremental arrival itself is
    # pinned by causality in test_stream_arrival_causality.py, not by milliseconds here)
    assert [e for _, e in got] == upstream_events


def test_b10_tokens_arrive_paced_with_no_buffering_headers(rig: Any) -> None:
    pieces = [chunk(f" t{i}") for i in range(24)] + [chunk(finish="stop"), DONE]
    rig.upstream.script = Script(pieces=pieces, delay_s=0.025)
    r, got = stream_through(rig.url)
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["cache-control"] == "no-cache"
    assert r.headers["x-accel-buffering"] == "no"
    assert "content-encoding" not in r.headers
    row = wait_rows(rig.ledger, 1)[-1]
    assert row["stream"] == 1 and row["status"] == "ok"
    # lower bounds only (the upstream sleeps 25 ms before each piece; a sleep never ends
    # early): TTFT covers at least the first sleep, TPOT the sleeps between content events
    assert row["ttft_ms"] is not None and row["ttft_ms"] >= 25.0
    assert row["tpot_ms"] >= 25.0 * 0.99
    assert row["total_ms"] >= row["ttft_ms"] + 23 * 25.0 * 0.99
    assert row["output_tokens"] == 24  # counted from deltas: the client asked for no usage


def test_b11_random_read_boundaries_give_identical_transcript(rig: Any) -> None:
    transcript = (b": comment\n\n" + chunk("Hel") + chunk("lo").replace(b"\n\n", b"\r\n\r\n")
                  + b"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[]}\n\n"
                  + chunk(finish="stop") + DONE)
    rng = random.Random(11)
    for _ in range(6):
        cuts = sorted(rng.sample(range(1, len(transcript)), 12))
        pieces = [transcript[a:b] for a, b in zip([0] + cuts, cuts + [len(transcript)])]
        rig.upstream.script = Script(pieces=pieces, delay_s=0.001)
        _, got = stream_through(rig.url)
        assert b"".join(e for _, e in got) == transcript
        assert [parse_event(e).data for _, e in got].count("[DONE]") == 1
        assert got[1][1] == chunk("Hel")  # the partial JSON event arrived whole


def test_stream_usage_and_cached_tokens_reach_the_ledger(rig: Any) -> None:
    usage = {"prompt_tokens": 50, "completion_tokens": 3, "total_tokens": 53,
             "prompt_tokens_details": {"cached_tokens": 32}}
    rig.upstream.script = Script(pieces=[chunk("a"), chunk("b"), chunk("c"),
                                         chunk(finish="stop"), chunk(usage=usage), DONE])
    body = {**BODY, "stream_options": {"include_usage": True}}
    r, _ = stream_through(rig.url, body, headers={"x-prefixgate-rewrite": "off"})
    assert r.headers["x-prefixgate-edits"] == "off"
    row = wait_rows(rig.ledger, 1)[-1]
    assert (row["prompt_tokens"], row["cached_tokens"], row["output_tokens"]) == (50, 32, 3)
    # the client body reached the upstream byte for byte
    assert rig.upstream.seen[-1].json == body


def test_client_disconnect_closes_the_upstream_stream_and_is_recorded(rig: Any) -> None:
    rig.upstream.script = Script(pieces=[chunk(f"x{i}") for i in range(400)], delay_s=0.01)
    with httpx.Client(timeout=30) as c, c.stream("POST", rig.url + "/v1/chat/completions",
                                                 json=BODY) as r:
        it = r.iter_raw()
        next(it)
        next(it)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not (rig.upstream.closed and rig.ledger.rows()):
        time.sleep(0.05)
    assert rig.upstream.closed == 1 and rig.upstream.finished == 0
    row = rig.ledger.rows()[-1]
    assert row["status"] == "client_disconnect"


def test_engine_usage_headers_fill_the_ledger_when_the_stream_has_no_usage(rig: Any) -> None:
    rig.upstream.script = Script(pieces=[chunk("a"), chunk("b"), chunk(finish="stop"), DONE],
                                 headers={"X-Engine-Prompt-Tokens": "120",
                                          "X-Engine-Cached-Tokens": "96",
                                          "X-Engine-TTFT-Ms": "12.5"})
    r, _ = stream_through(rig.url)
    assert r.headers["x-prefixgate-cached-tokens"] == "96"
    assert r.headers["x-engine-ttft-ms"] == "12.5"
    row = wait_rows(rig.ledger, 1)[-1]
    assert (row["prompt_tokens"], row["cached_tokens"], row["output_tokens"]) == (120, 96, 2)
