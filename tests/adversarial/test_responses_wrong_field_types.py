"""``POST /v1/responses`` with a wrong JSON type (or an out-of-range number) in any field the
bridge reads: a 400 in OpenAI's shape naming the field, nothing sent upstream, exactly one ledger
row — never a 500 (a number where a string belongs used to crash the bridge) nor a 502 blaming
the upstream (a ``max_output_tokens`` too large to encode)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.proxy.upstream import Script, completion, wait_rows

MSG = {"type": "message", "role": "user"}
BAD_INPUT = [
    [{"role": "assistant", "content": [{"type": "output_text", "text": 5}]}],
    [{**MSG, "content": [{"type": "input_text", "text": {"x": 1}}]}],
    [{**MSG, "content": [{"type": "refusal", "refusal": []}]}],
    [{**MSG, "content": [{"type": "input_image", "image_url": "http://i/x.png", "detail": 5}]}],
    [{"type": "function_call", "call_id": 5, "name": "f", "arguments": "{}"}],
    [{"type": "function_call", "call_id": "c", "name": 5, "arguments": "{}"}],
    [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}],
    [{"type": "function_call_output", "call_id": 5, "output": "x"}],
    [{"type": "function_call_output", "call_id": "c",
      "output": [{"type": "input_text", "text": 5}]}],
    [5], None, 5,
]
BAD_FIELDS = [("max_output_tokens", v) for v in (-1, 0, "8", 1.5, True, 10**30, 2**31)] + [
    ("stream", "yes"), ("store", 1), ("previous_response_id", 5), ("model", 5)]


def _check(rig: Any, body: dict[str, Any]) -> None:
    before = len(rig.upstream.seen)
    r = httpx.post(rig.url + "/v1/responses", json=body, timeout=10)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and "Traceback" not in r.text
    assert len(rig.upstream.seen) == before


@pytest.mark.parametrize("model", ["m1", "claude-x"], ids=["chat-backend", "anthropic-backend"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("inp", BAD_INPUT, ids=[f"input{i}" for i in range(len(BAD_INPUT))])
def test_wrong_type_inside_input_items_is_a_400(rig: Any, model: str, stream: bool,
                                                inp: Any) -> None:
    _check(rig, {"model": model, "input": inp, "stream": stream})
    rows = wait_rows(rig.ledger, 1)
    assert len(rows) == 1 and rows[0]["http_status"] == 400


@pytest.mark.parametrize("field,value", BAD_FIELDS, ids=[f"{f}={v!r}"[:30] for f, v in BAD_FIELDS])
def test_wrong_type_or_range_of_a_top_level_field_is_a_400(rig: Any, field: str,
                                                           value: Any) -> None:
    _check(rig, {"model": "m1", "input": "hi", field: value})
    assert [r["http_status"] for r in wait_rows(rig.ledger, 1)] == [400]


def test_the_largest_allowed_cap_still_goes_through(rig: Any) -> None:
    rig.upstream.script = Script(body=completion("ok"))
    r = httpx.post(rig.url + "/v1/responses",
                   json={"model": "m1", "input": "hi", "max_output_tokens": 2**31 - 1}, timeout=10)
    assert r.status_code == 200 and r.json()["max_output_tokens"] == 2**31 - 1
