"""The engine server reports span reuse in ``usage.prompt_tokens_details`` (stream and not)."""

from __future__ import annotations

import json

import httpx

CHAT = "/v1/chat/completions"
POLICY = " ".join(f"Rule {i}: answer politely about flight {i}." for i in range(12))


def body(clock: str, question: str) -> dict[str, object]:
    return {"messages": [{"role": "system", "content": f"Current time: {clock}. {POLICY}"},
                         {"role": "user", "content": question}], "max_tokens": 2}


def test_usage_carries_span_reused_tokens_stream_and_not(base_url: str) -> None:
    first = httpx.post(base_url + CHAT, json=body("10:31:05", "Status of my booking?")).json()
    details = first["usage"]["prompt_tokens_details"]
    assert details["span_reused_tokens"] == 0 and set(details) == {"cached_tokens", "span_reused_tokens"}
    second = httpx.post(base_url + CHAT, json=body("10:32:17", "Status of my booking?")).json()
    d2 = second["usage"]["prompt_tokens_details"]
    assert d2["span_reused_tokens"] > 40 and d2["cached_tokens"] >= d2["span_reused_tokens"]
    with httpx.stream("POST", base_url + CHAT, json={
            **body("10:33:59", "Status of my booking?"), "stream": True,
            "stream_options": {"include_usage": True}}) as resp:
        events = resp.read().decode().split("\n\n")
    usage = json.loads([e for e in events if '"usage":{' in e][-1][6:])["usage"]
    assert usage["prompt_tokens_details"]["span_reused_tokens"] > 40


def test_metrics_count_span_reused_tokens(base_url: str) -> None:
    httpx.post(base_url + CHAT, json=body("11:00:00", "Baggage allowance?"))
    got = httpx.post(base_url + CHAT, json=body("11:04:41", "Baggage allowance?")).json()
    reused = got["usage"]["prompt_tokens_details"]["span_reused_tokens"]
    text = httpx.get(base_url + "/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("engine_span_reused_tokens_total "))
    assert reused > 0 and float(line.split()[1]) >= reused
