"""Raw HTTP behaviour: error shapes, SSE framing and headers, metrics, abort on disconnect."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

CHAT = "/v1/chat/completions"


def _error(resp: httpx.Response) -> dict[str, Any]:
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


def test_health(base_url: str) -> None:
    assert httpx.get(base_url + "/health").json() == {"status": "ok"}


def test_invalid_json_is_openai_400(base_url: str) -> None:
    resp = httpx.post(base_url + CHAT, content=b'{"messages": [', headers={"content-type": "application/json"})
    assert resp.status_code == 400
    assert _error(resp)["code"] == "invalid_json"


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "temperature"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
    ({}, "messages"),
    ([1, 2], None),
])
def test_wrong_types_are_openai_400_not_422(base_url: str, body: Any, param: str | None) -> None:
    resp = httpx.post(base_url + CHAT, json=body)
    assert resp.status_code == 400
    err = _error(resp)
    assert err["type"] == "invalid_request_error" and err["param"] == param


def test_unknown_fields_are_tolerated(base_url: str) -> None:
    body = {"model": "x", "messages": [{"role": "user", "content": "hi", "weird": 1}],
            "max_tokens": 1, "parallel_tool_calls": False, "metadata": {"a": "b"}}
    assert httpx.post(base_url + CHAT, json=body).status_code == 200


def test_unknown_route_and_wrong_method_are_openai_shaped(base_url: str) -> None:
    resp = httpx.post(base_url + "/v1/nope", json={})
    assert resp.status_code == 404 and _error(resp)["code"] == "not_found"
    resp = httpx.get(base_url + CHAT)
    assert resp.status_code == 405 and _error(resp)["code"] == "method_not_allowed"


def test_sse_framing_and_no_buffering_headers(base_url: str) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True,
            "temperature": 0}
    with httpx.stream("POST", base_url + CHAT, json=body) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["cache-control"] == "no-cache"
        assert resp.headers["x-accel-buffering"] == "no"
        raw = resp.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    assert raw.count("data: [DONE]") == 1
    payloads = [json.loads(e[len("data: "):]) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert payloads[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(p["object"] == "chat.completion.chunk" for p in payloads)


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exposed")


def _aborts(base_url: str) -> float:
    text = httpx.get(base_url + "/metrics").text
    name = 'engine_requests_total{finish_reason="abort"}'
    return _metric(text, name) if name in text else 0.0


def test_metrics_expose_engine_gauges_after_requests(base_url: str) -> None:
    body = {"messages": [{"role": "system", "content": "Metrics test system prompt. " * 6},
                         {"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
    for _ in range(2):
        assert httpx.post(base_url + CHAT, json=body).status_code == 200
    text = httpx.get(base_url + "/metrics").text
    assert _metric(text, "engine_kv_slots_total") > 0
    assert 0 <= _metric(text, "engine_kv_pool_usage_ratio") <= 1
    assert _metric(text, "engine_num_running_requests") == 0
    assert _metric(text, "engine_num_waiting_requests") == 0
    assert _metric(text, "engine_cache_hit_tokens_total") > 0
    assert _metric(text, "engine_prompt_tokens_total") > _metric(text, "engine_cache_hit_tokens_total")
    assert _metric(text, "engine_time_to_first_token_seconds_count") >= 2
    assert _metric(text, "engine_time_per_output_token_seconds_count") >= 1
    assert _metric(text, "engine_generation_tokens_total") >= 2
    for name in ("engine_prefill_tokens_per_second", "engine_decode_tokens_per_second"):
        assert _metric(text, name) >= 0


def test_client_disconnect_mid_stream_aborts_and_frees_slots(base_url: str, engine: Any) -> None:
    body = {"messages": [{"role": "user", "content": "Write a very long story."}],
            "max_tokens": 400, "stream": True, "ignore_eos": True, "temperature": 0}
    before = engine.stats()
    with httpx.stream("POST", base_url + CHAT, json=body) as resp:
        lines = resp.iter_lines()
        got = [next(lines) for _ in range(6)]  # a few events, then hang up
        assert any(line.startswith("data: ") for line in got)
        assert engine.stats()["num_running"] == 1
    deadline = time.monotonic() + 10
    while engine.stats()["num_running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    after = engine.stats()
    assert after["num_running"] == 0 and after["num_waiting"] == 0
    # the aborted request holds no slots any more: whatever is still used belongs to the tree
    in_flight = after["kv_slots_used"] - after["kv_slots_cached"]
    assert in_flight == before["kv_slots_used"] - before["kv_slots_cached"] == 0
    text = httpx.get(base_url + "/metrics").text
    assert _metric(text, 'engine_requests_total{finish_reason="abort"}') >= 1


def test_status_line_is_logged_while_busy(engine: Any, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from prefixgate.local_engine.server import build_app
    from tests.servers import serve_app

    body = {"messages": [{"role": "user", "content": "busy"}], "max_tokens": 150,
            "ignore_eos": True}
    with (caplog.at_level(logging.INFO, logger="local_engine.server"),
          serve_app(build_app(engine, log_stats_interval_s=0.02)) as url):
        assert httpx.post(url + CHAT, json=body, timeout=60).status_code == 200
        time.sleep(0.1)
    lines = [r.getMessage() for r in caplog.records if "#running-req" in r.getMessage()]
    assert any(line.startswith("#running-req: 1,") for line in lines)


def test_client_gone_during_non_stream_request_aborts_it(base_url: str, engine: Any) -> None:
    aborts_before = _aborts(base_url)
    body = {"messages": [{"role": "user", "content": "Another long story."}],
            "max_tokens": 450, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(base_url + CHAT, json=body, timeout=0.3)
    deadline = time.monotonic() + 10
    while _aborts(base_url) == aborts_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _aborts(base_url) == aborts_before + 1
    assert engine.stats()["num_running"] == 0


def test_engine_headers_report_ttft_and_cached_tokens(base_url: str) -> None:
    body = {"messages": [{"role": "system", "content": "Header test prompt. " * 5},
                         {"role": "user", "content": "hi"}], "max_tokens": 2}
    first = httpx.post(base_url + CHAT, json=body)
    with httpx.stream("POST", base_url + CHAT, json={**body, "stream": True,
                      "stream_options": {"include_usage": True}}) as resp:
        headers = resp.headers
        events = resp.read().decode().split("\n\n")
    usage = json.loads([e for e in events if '"usage":{' in e][-1][6:])["usage"]
    assert float(first.headers["x-engine-ttft-ms"]) > 0
    # non-streamed: decode time first -> last token (0.0 when both came in one step); a stream,
    # whose headers leave with the first token, has none
    assert float(first.headers["x-engine-decode-ms"]) >= 0
    assert "x-engine-decode-ms" not in headers
    first_cached = first.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert int(first.headers["x-engine-cached-tokens"]) == first_cached
    assert int(headers["x-engine-prompt-tokens"]) == usage["prompt_tokens"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert int(headers["x-engine-cached-tokens"]) == cached > 0


def test_stream_is_not_buffered(base_url: str, engine: Any) -> None:
    """Case B10: events leave as tokens are made, not all at once at the end. Causality, not
    milliseconds: the first content event reaches the client while the engine still has the
    request in its running batch (a buffered stream arrives only after it finished)."""
    body = {"messages": [{"role": "user", "content": "Tell me more"}], "max_tokens": 400,
            "ignore_eos": True, "stream": True}
    running_at_first_token: int | None = None
    with httpx.stream("POST", base_url + CHAT, json=body) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {") and '"content":"' in line:
                running_at_first_token = int(engine.stats()["num_running"])
                break
    assert running_at_first_token is not None and running_at_first_token >= 1


def test_engine_headers_split_ttft_into_queue_and_prefill(base_url: str) -> None:
    """X-Engine-Queue-Ms (arrival -> first scheduled) + X-Engine-Prefill-Ms (first scheduled ->
    first token) make X-Engine-TTFT-Ms, on a JSON answer and on a stream's headers."""
    body = {"messages": [{"role": "system", "content": "Queue split prompt. " * 8},
                         {"role": "user", "content": "hi"}], "max_tokens": 2}
    plain = httpx.post(base_url + CHAT, json=body).headers
    with httpx.stream("POST", base_url + CHAT, json={**body, "stream": True}) as resp:
        streamed = resp.headers
        resp.read()
    for h in (plain, streamed):
        queue, prefill = float(h["x-engine-queue-ms"]), float(h["x-engine-prefill-ms"])
        assert queue >= 0 and prefill > 0  # a forward step ran between them
        assert abs(queue + prefill - float(h["x-engine-ttft-ms"])) <= 0.15  # 0.1 ms rounding
