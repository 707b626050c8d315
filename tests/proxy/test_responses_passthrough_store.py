"""A Responses stream passed through to an OpenAI backend is remembered only when it completed
(issue 38 item 2: a stream that failed was still stored, so a later GET was routed for a
response id that never became a response; the stream-break tests checked the error event and
never the store).

The dimension varied: how the upstream's stream ends — ``response.completed`` and
``response.incomplete`` (a response exists: kept), ``response.failed``, an ``error`` event, the
stream ending without a final event, the stream with ``store: false`` — and streamed vs JSON.
Checked on the proxy's own response store (``app.state.responses``).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

import tests.proxy.conftest as proxy_conftest
from tests.proxy.upstream import Script, wait_rows


def _ev(kind: str, **data: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


def _response(rid: str, status: str) -> dict[str, Any]:
    return {"id": rid, "object": "response", "status": status, "output": [],
            "usage": {"input_tokens": 5, "output_tokens": 1, "total_tokens": 6}}


def _pieces(rid: str, ending: str) -> list[bytes]:
    start = [_ev("response.created", response=_response(rid, "in_progress")),
             _ev("response.output_text.delta", delta="Hi")]
    end = {
        "completed": [_ev("response.completed", response=_response(rid, "completed"))],
        "incomplete": [_ev("response.incomplete", response=_response(rid, "incomplete"))],
        "failed": [_ev("response.failed", response={**_response(rid, "failed"),
                                                    "error": {"code": "server_error", "message": "x"}})],
        "error": [_ev("error", code="server_error", message="boom", param=None)],
        "no_final_event": [],
    }[ending]
    return start + end


@pytest.fixture
def passthrough(rig_factory: Any, upstream: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    apps: list[Any] = []
    real = proxy_conftest.build_app

    def capture(*a: Any, **k: Any) -> Any:
        apps.append(real(*a, **k))
        return apps[-1]

    monkeypatch.setattr(proxy_conftest, "build_app", capture)
    rig = rig_factory(backends={"oai": {"kind": "openai", "base_url": upstream[1] + "/v1"}},
                      routes=[{"match": "gpt-*", "backend": "oai"}])
    rig.store = apps[-1].state.responses
    return rig


@pytest.mark.parametrize("ending, kept", [("completed", True), ("incomplete", True),
                                          ("failed", False), ("error", False),
                                          ("no_final_event", False)])
def test_a_streamed_response_is_stored_only_when_it_completed(passthrough: Any, ending: str,
                                                              kept: bool) -> None:
    rid = f"resp_{ending}"
    passthrough.upstream.script = Script(pieces=_pieces(rid, ending))
    r = httpx.post(passthrough.url + "/v1/responses", timeout=10,
                   json={"model": "gpt-x", "input": "hi", "stream": True})
    assert r.status_code == 200
    wait_rows(passthrough.ledger, 1)  # the stream's end was handled (its row follows the store)
    assert (passthrough.store.get(rid) is not None) is kept


def test_a_stream_with_store_false_is_never_stored(passthrough: Any) -> None:
    passthrough.upstream.script = Script(pieces=_pieces("resp_nostore", "completed"))
    httpx.post(passthrough.url + "/v1/responses", timeout=10,
               json={"model": "gpt-x", "input": "hi", "stream": True, "store": False})
    wait_rows(passthrough.ledger, 1)
    assert passthrough.store.get("resp_nostore") is None


@pytest.mark.parametrize("status, kept", [(200, True), (500, False), (400, False)])
def test_a_json_response_is_stored_only_when_the_backend_answered_it(passthrough: Any, status: int,
                                                                    kept: bool) -> None:
    body = _response("resp_json", "completed") if status == 200 else {
        "id": "resp_json", "error": {"message": "bad", "type": "invalid_request_error"}}
    passthrough.upstream.script = Script(body=body, status=status)
    httpx.post(passthrough.url + "/v1/responses", timeout=10, json={"model": "gpt-x", "input": "hi"})
    wait_rows(passthrough.ledger, 1)
    assert (passthrough.store.get("resp_json") is not None) is kept
