"""A bridged ``/v1/responses`` stream whose upstream (Chat or Anthropic wire) breaks off, goes
silent past its timeout, or ends without its final event: every event the client gets is a
Responses event (``type`` set), the last one ``response.failed`` (status ``failed``, the error
named) — not a Chat-shaped ``data: {"error": ...}`` a Responses client cannot read; one
ledger row (``upstream_error``); the half answer is not stored. A passthrough Responses stream
(OpenAI backend) ending early ends in a Responses ``error`` event the same way."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.proxy.upstream import Script, chunk, wait_rows


def _events(text: str) -> list[dict[str, Any]]:
    out = []
    for block in text.split("\n\n"):
        data = [ln[6:] for ln in block.split("\n") if ln.startswith("data: ")]
        if data:
            out.append(json.loads("\n".join(data)))
    return out


def _check(url: str, model: str, ledger: Any) -> None:
    with httpx.stream("POST", url + "/v1/responses", timeout=15,
                      json={"model": model, "input": "hi", "stream": True}) as r:
        text = r.read().decode()
    events = _events(text)
    assert events and all(isinstance(e.get("type"), str) for e in events), text[-500:]
    last = events[-1]
    assert last["type"] == "response.failed" and last["response"]["status"] == "failed"
    assert last["response"]["error"]["message"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    rows = wait_rows(ledger, 1)
    assert [(row["status"], row["endpoint"]) for row in rows] == [("upstream_error",
                                                                   "/v1/responses")]
    rid = last["response"]["id"]
    assert httpx.get(f"{url}/v1/responses/{rid}", timeout=10).status_code == 404


@pytest.mark.parametrize("model", ["cut-stream", "claude-cut-stream", "hang-stream",
                                   "claude-hang-stream"])
def test_upstream_breaking_or_hanging_mid_stream_ends_in_response_failed(
        hostile: Any, model: str) -> None:
    _check(hostile.url, model, hostile.ledger)


@pytest.mark.parametrize("pieces", [[chunk("a")], [], [chunk("a"), b"data: {trunc"]],
                         ids=["no-done", "empty", "truncated-last-event"])
def test_upstream_ending_without_its_final_event_ends_in_response_failed(
        rig: Any, pieces: list[bytes]) -> None:
    rig.upstream.script = Script(pieces=pieces)
    _check(rig.url, "m1", rig.ledger)


def _created(seq: int) -> bytes:
    obj = {"type": "response.created", "sequence_number": seq,
           "response": {"id": "resp_up9", "object": "response", "status": "in_progress"}}
    return b"event: response.created\ndata: " + json.dumps(obj).encode() + b"\n\n"


@pytest.mark.parametrize("pieces", [[_created(0)], [_created(0), b"data: {trunc"], []],
                         ids=["no-completed", "truncated-last-event", "empty"])
def test_passthrough_responses_stream_ending_early_ends_in_a_responses_error_event(
        rig_factory: Any, upstream: Any, pieces: list[bytes]) -> None:
    rig = rig_factory(backends={"oai": {"kind": "openai", "base_url": upstream[1] + "/v1"}},
                      routes=[{"match": "gpt-*", "backend": "oai"}])
    rig.upstream.script = Script(pieces=pieces)
    with httpx.stream("POST", rig.url + "/v1/responses", timeout=15,
                      json={"model": "gpt-x", "input": "hi", "stream": True}) as r:
        text = r.read().decode()
    events = _events(text)
    assert all(isinstance(e.get("type"), str) for e in events), text
    last = events[-1]
    assert last["type"] == "error" and last["message"] and last["code"] == "upstream_unavailable"
    assert last["sequence_number"] == len(events) - 1
    assert "event: error\n" in text
    assert [row["status"] for row in wait_rows(rig.ledger, 1)] == ["upstream_error"]
