"""Backends' own usage and timing fields reach the client unchanged, and the ledger reads them
(issue 19, item 6): llama.cpp ``timings``, vLLM / SGLang ``usage.prompt_tokens_details`` and
SGLang's ``sglext`` / ``metadata``, through the identity bridge, non-streamed and streamed.

The upstream here sends exact bytes (``Script(pieces=...)``), so "unchanged" means byte for
byte, numbers' text included (``41.250`` stays ``41.250``).
"""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest

from prefixgate.proxy.core.engine_timings import EngineTimings, with_body_times
from prefixgate.proxy.core.sse import parse_event
from prefixgate.proxy.core.usage import OpenAIStreamWatcher, Usage, engine_usage, usage_from_answer
from tests.proxy.test_relay_stream import stream_through
from tests.proxy.upstream import DONE, Script, wait_rows

TIMINGS = (b'{"cache_n":1530,"prompt_n":66,"prompt_ms":41.250,"prompt_per_token_ms":0.625,'
           b'"prompt_per_second":1600.0,"predicted_n":2,"predicted_ms":18.5,'
           b'"predicted_per_token_ms":9.25,"predicted_per_second":108.1}')
LLAMACPP = (b'{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant",'
            b'"content":"hi"}}],"created":1,"model":"m","system_fingerprint":"b6000-x",'
            b'"object":"chat.completion","usage":{"completion_tokens":2,"prompt_tokens":1596,'
            b'"total_tokens":1598},"id":"chatcmpl-x","timings":' + TIMINGS + b'}')
"""An older llama.cpp server's answer: no ``prompt_tokens_details``, the cache in ``timings``."""
VLLM = (b'{"id":"chatcmpl-v","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
        b'"message":{"role":"assistant","content":"hi","refusal":null,"tool_calls":[],'
        b'"reasoning_content":null},"logprobs":null,"finish_reason":"stop","stop_reason":null}],'
        b'"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":1596,'
        b'"total_tokens":1598,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":1584}},'
        b'"prompt_logprobs":null,"kv_transfer_params":null}')
SGLANG = (b'{"id":"s","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
          b'"message":{"role":"assistant","content":"hi","reasoning_content":null,"tool_calls":null},'
          b'"logprobs":null,"finish_reason":"stop","matched_stop":2}],"usage":{"prompt_tokens":1596,'
          b'"total_tokens":1598,"completion_tokens":2,"prompt_tokens_details":null,'
          b'"reasoning_tokens":0},"metadata":{"weight_version":"default"},'
          b'"sglext":{"cached_tokens_details":{"device":1500,"host":84}}}')
"""SGLang with ``return_cached_tokens_details``: the count in ``sglext`` only."""

# backend -> (answer bytes, expected ledger (prompt, cached, prefill_ms, decode_ms))
ANSWERS: dict[str, tuple[bytes, tuple[Any, ...]]] = {
    "llama.cpp": (LLAMACPP, (1596, 1530, 41.25, 18.5)),
    "vllm": (VLLM, (1596, 1584, None, None)),
    "sglang": (SGLANG, (1596, 1584, None, None)),
}
ASK = {"model": "m", "messages": [{"role": "user", "content": "x"}]}


def ledger_figures(row: dict[str, Any]) -> tuple[Any, ...]:
    return row["prompt_tokens"], row["cached_tokens"], row["prefill_ms"], row["decode_ms"]


@pytest.mark.parametrize("backend", sorted(ANSWERS))
def test_a_non_streamed_answer_reaches_the_client_byte_identical_and_is_read(
        rig: Any, backend: str) -> None:
    raw, expected = ANSWERS[backend]
    rig.upstream.script = Script(pieces=[raw], media_type="application/json")
    r = httpx.post(rig.url + "/v1/chat/completions", json=ASK, timeout=30)
    assert r.status_code == 200 and r.content == raw
    assert ledger_figures(wait_rows(rig.ledger, 1)[0]) == expected


def sse(obj: bytes) -> bytes:
    return b"data: " + obj + b"\n\n"


def delta(text: str, extra: bytes = b"") -> bytes:
    return sse(b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
               b'[{"index":0,"delta":{"content":"' + text.encode() + b'"},"finish_reason":null}]'
               + extra + b'}')


STREAMS: dict[str, tuple[list[bytes], tuple[Any, ...]]] = {
    # llama.cpp: the final chunk carries timings, no usage chunk unless include_usage was asked
    "llama.cpp": ([delta("h"), delta("i"), sse(
        b'{"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"created":1,"id":"c",'
        b'"model":"m","object":"chat.completion.chunk","timings":' + TIMINGS + b'}'), DONE],
        (1596, 1530, 41.25, 18.5)),
    # vLLM with continuous_usage_stats: usage on every chunk, the last one complete
    "vllm": ([delta("h", b',"usage":{"prompt_tokens":1596,"total_tokens":1597,"completion_tokens":1}'),
              delta("i", b',"usage":{"prompt_tokens":1596,"total_tokens":1598,"completion_tokens":2}'),
              sse(b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
                  b'"usage":{"prompt_tokens":1596,"total_tokens":1598,"completion_tokens":2,'
                  b'"prompt_tokens_details":{"cached_tokens":1584}}}'), DONE],
             (1596, 1584, None, None)),
    "sglang": ([delta("h"), delta("i"), sse(
        b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
        b'"usage":{"prompt_tokens":1596,"total_tokens":1598,"completion_tokens":2,'
        b'"prompt_tokens_details":{"cached_tokens":1584},"reasoning_tokens":0}}'), DONE],
        (1596, 1584, None, None)),
}


@pytest.mark.parametrize("backend", sorted(STREAMS))
def test_a_stream_reaches_the_client_byte_identical_and_is_read(rig: Any, backend: str) -> None:
    pieces, expected = STREAMS[backend]
    rig.upstream.script = Script(pieces=pieces)
    r, got = stream_through(rig.url, {**ASK, "stream": True})
    assert r.status_code == 200 and b"".join(e for _, e in got) == b"".join(pieces)
    assert ledger_figures(wait_rows(rig.ledger, 1)[0]) == expected


def test_an_anthropic_client_over_llamacpp_sees_and_records_the_engines_cache(rig: Any) -> None:
    rig.upstream.script = Script(pieces=[LLAMACPP], media_type="application/json")
    ask = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
    r = httpx.post(rig.url + "/v1/messages", timeout=30, json=ask)
    usage = r.json()["usage"]
    assert (usage["input_tokens"], usage["cache_read_input_tokens"]) == (66, 1530)
    assert ledger_figures(wait_rows(rig.ledger, 1)[0]) == (1596, 1530, 41.25, 18.5)
    # streamed: the timings chunk comes before llama.cpp's usage chunk (include_usage, which
    # the bridge asks for), and that usage chunk has no prompt_tokens_details
    rig.upstream.script = Script(pieces=[*STREAMS["llama.cpp"][0][:3], sse(
        b'{"choices":[],"created":1,"id":"c","model":"m","object":"chat.completion.chunk",'
        b'"usage":{"completion_tokens":2,"prompt_tokens":1596,"total_tokens":1598}}'), DONE])
    with httpx.stream("POST", rig.url + "/v1/messages", json={**ask, "stream": True}, timeout=30) as s:
        body = s.read()
    delta_event = next(e for e in body.split(b"\n\n") if b"message_delta" in e)
    assert b'"cache_read_input_tokens":1530' in delta_event and b'"input_tokens":66' in delta_event
    assert ledger_figures(wait_rows(rig.ledger, 2)[1]) == (1596, 1530, 41.25, 18.5)


def test_engine_headers_win_over_the_body_and_the_body_fills_what_they_leave() -> None:
    both = with_body_times(EngineTimings(prefill_ms=10.0), prefill_ms=41.25, decode_ms=18.5)
    assert (both.prefill_ms, both.decode_ms) == (10.0, 18.5)
    assert with_body_times(EngineTimings(), None, None) == EngineTimings()


def test_the_usage_object_wins_over_timings_where_both_report() -> None:
    answer = {"usage": {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 90}},
              "timings": {"cache_n": 80, "prompt_n": 15, "prompt_ms": 3.5}}
    assert usage_from_answer(answer, "openai") == Usage(100, 90, None, None, 3.5, None)
    assert usage_from_answer({"timings": answer["timings"]}, "openai") == Usage(95, 80, None, None, 3.5)


@pytest.mark.parametrize("bad", [True, -1, "12", None, [3], math.nan, math.inf])
def test_malformed_engine_numbers_read_as_not_reported(bad: Any) -> None:
    u = engine_usage({"timings": {"cache_n": bad, "prompt_n": bad, "prompt_ms": bad,
                                  "predicted_ms": bad},
                      "sglext": {"cached_tokens_details": {"device": bad}}})
    assert u == Usage()


def test_a_zero_cache_is_reported_as_zero_not_absent() -> None:
    u = engine_usage({"timings": {"cache_n": 0, "prompt_n": 1596, "prompt_ms": 900.0}})
    assert (u.prompt_tokens, u.cached_tokens, u.prefill_ms) == (1596, 0, 900.0)


def test_the_stream_watcher_keeps_the_newest_timings() -> None:
    w = OpenAIStreamWatcher()
    for t in (b'{"cache_n":10,"prompt_n":5,"prompt_ms":2.0,"predicted_ms":1.0}',
              b'{"cache_n":10,"prompt_n":5,"prompt_ms":2.0,"predicted_ms":7.5}'):
        w.observe(parse_event(sse(b'{"choices":[],"timings":' + t + b'}')))
    assert (w.usage.cached_tokens, w.usage.prompt_tokens, w.usage.decode_ms) == (10, 15, 7.5)


def test_a_responses_client_over_llamacpp_sees_and_records_the_engines_cache(rig: Any) -> None:
    rig.upstream.script = Script(pieces=[LLAMACPP], media_type="application/json")
    r = httpx.post(rig.url + "/v1/responses", json={"model": "m", "input": "x"}, timeout=30)
    usage = r.json()["usage"]
    assert (usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]) == (1596, 1530)
    rig.upstream.script = Script(pieces=[*STREAMS["llama.cpp"][0][:3], sse(
        b'{"choices":[],"created":1,"id":"c","model":"m","object":"chat.completion.chunk",'
        b'"usage":{"completion_tokens":2,"prompt_tokens":1596,"total_tokens":1598}}'), DONE])
    with httpx.stream("POST", rig.url + "/v1/responses", timeout=30,
                      json={"model": "m", "input": "x", "stream": True}) as s:
        body = s.read()
    done = next(e for e in body.split(b"\n\n") if b"response.completed" in e)
    assert b'"cached_tokens":1530' in done
    rows = wait_rows(rig.ledger, 2)
    assert [ledger_figures(r) for r in rows] == [(1596, 1530, 41.25, 18.5)] * 2


def test_filled_usage_keeps_every_key_and_fills_only_what_is_missing() -> None:
    from prefixgate.proxy.core.usage import filled_usage

    eng = Usage(prompt_tokens=95, cached_tokens=80)
    u = {"prompt_tokens": 100, "completion_tokens_details": {"reasoning_tokens": 3},
         "prompt_tokens_details": {"audio_tokens": 0}}
    assert filled_usage(u, eng) == {**u, "prompt_tokens_details": {"audio_tokens": 0, "cached_tokens": 80}}
    full = {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 90}}
    assert filled_usage(full, eng) == full and filled_usage(None, Usage()) == {}
