"""A request's life around the send: what is checked before it, what a client that leaves
before the upstream's headers causes, and what is recorded (issue 8, classes 1, 6 and 7)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from prefixgate.proxy.observe.insight import Insight
from prefixgate.proxy.pipeline import send as send_step
from tests.faults.conftest import STALL_S, FaultRig, body_for
from tests.faults.fault_server import FaultServer, serve_faults
from tests.faults.outcomes import events, is_error_event
from tests.faults.test_fault_classes import wait_idle
from tests.proxy.upstream import wait_rows
from tests.servers import serve_app


@pytest.mark.parametrize("value", [5, "yes", [1], True])
@pytest.mark.parametrize("model", ["claude-ok", "ok"])
def test_stream_options_not_an_object_is_a_400_naming_the_param(faults: FaultRig, model: str,
                                                                value: object) -> None:
    """Bridged (``claude-``) this used to raise after the send: a 500, the upstream response
    never closed, no ledger row. Now it is refused before anything goes upstream."""
    path = "/v1/chat/completions"
    r = httpx.post(faults.url + path, timeout=30,
                   json=body_for(path, model, True, stream_options=value))
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "stream_options"
    (row,) = wait_rows(faults.ledger, 1)
    assert (row["status"], row["http_status"]) == ("InvalidRequest", 400)
    assert faults.upstream.requests == 0
    assert wait_idle(faults) == (0, 0)


@pytest.mark.parametrize("path,model", [("/v1/chat/completions", "patient/delay-headers"),
                                        ("/v1/chat/completions", "claude-patient/delay-headers"),
                                        ("/v1/messages", "claude-patient/delay-headers"),
                                        ("/v1/messages", "patient/delay-headers")])
@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("faults", ["default", "serve"], indirect=True)  # serve: the lost future
def test_client_gone_before_upstream_headers_cancels_the_upstream_request(
        faults: FaultRig, path: str, model: str, stream: bool) -> None:
    """The client hangs up once the upstream has its request, while the upstream holds its
    headers back (30 s): the proxy notices the client's disconnect, abandons the upstream
    request (the upstream sees the hang-up long before it would have answered), and records
    ``client_disconnect``, 499."""
    u = urlsplit(faults.url)
    raw = json.dumps(body_for(path, model, stream)).encode()
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
        assert _wait(lambda: faults.upstream.requests == 1)
    (row,) = wait_rows(faults.ledger, 1)
    assert (row["status"], row["http_status"]) == ("client_disconnect", 499)
    assert _wait(lambda: faults.upstream.cancelled == 1)
    assert faults.upstream.finished == 0
    assert wait_idle(faults) == (0, 0)


@pytest.mark.parametrize("faults", ["serve"], indirect=True)
def test_on_prefixgates_server_the_connections_lost_future_says_the_client_left(
        faults: FaultRig, monkeypatch: pytest.MonkeyPatch) -> None:
    """On ``prefixgate serve``'s stack the send waits on the connection's "lost" future (no task
    reading ``http.disconnect``, issue 25): with the message-reading watcher made deaf, the
    hang-up is still noticed, the upstream request abandoned and the row a 499."""
    async def deaf(request: Any) -> None:
        await asyncio.sleep(STALL_S)
    monkeypatch.setattr(send_step, "_disconnect_message", deaf)
    u = urlsplit(faults.url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        # a first request answered on the connection: its send's wait must leave the
        # connection's future as it was (shielded), for the next request's
        s.sendall(_post(body_for("/v1/chat/completions", "ok", False)))
        assert _response_status(s) == 200
        s.sendall(_post(body_for("/v1/chat/completions", "patient/delay-headers", False)))
        assert _wait(lambda: faults.upstream.requests == 2)
    rows = wait_rows(faults.ledger, 2)
    assert [(r["status"], r["http_status"]) for r in rows] == [("ok", 200),
                                                               ("client_disconnect", 499)]
    assert _wait(lambda: faults.upstream.cancelled == 1)


def _post(body: dict[str, Any]) -> bytes:
    raw = json.dumps(body).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
            b"application/json\r\nContent-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw)


def _response_status(s: socket.socket) -> int:
    """Read one Content-Length framed response off ``s``; its status."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    while len(rest) < length:
        rest += s.recv(65536)
    return int(head.split(b" ")[1])


def _wait(pred: Any, deadline_s: float = 10.0) -> bool:
    """Poll ``pred`` until true or the deadline (against hanging, not a timing assertion)."""
    end = time.monotonic() + deadline_s
    while not pred() and time.monotonic() < end:
        time.sleep(0.01)
    return bool(pred())


def test_client_gone_mid_stream_is_recorded_with_the_status_it_got(faults: FaultRig) -> None:
    """A client that read the 200 and some events, then left: ``client_disconnect`` with the
    200 it did get, and the upstream stream is closed."""
    path = "/v1/chat/completions"
    with httpx.stream("POST", faults.url + path, timeout=30,
                      json=body_for(path, "patient/stall-after", True)) as r:
        assert r.status_code == 200
        next(r.iter_raw())
    (row,) = wait_rows(faults.ledger, 1)
    assert (row["status"], row["http_status"]) == ("client_disconnect", 200)
    assert wait_idle(faults) == (0, 0)


def test_passthrough_stream_without_final_event_ends_with_an_error_event(faults: FaultRig) -> None:
    """The relayed events arrive as sent; the missing ``[DONE]`` is reported as an error event
    and the row says ``upstream_error`` (it used to say ok)."""
    path = "/v1/chat/completions"
    r = httpx.post(faults.url + path, json=body_for(path, "truncated", True), timeout=30)
    evs = events(r.text)
    assert is_error_event(evs[-1], path) and '"content":"hel"' in evs[0]
    assert wait_rows(faults.ledger, 1)[0]["status"] == "upstream_error"


def test_upstream_error_event_is_relayed_once_and_recorded_as_an_error(faults: FaultRig) -> None:
    """An upstream's own mid-stream error event (Anthropic ``overloaded_error``) reaches the
    client as the only error event — no second one from the proxy — and the row is an error."""
    path = "/v1/messages"
    r = httpx.post(faults.url + path, json=body_for(path, "claude-upstream-error", True),
                   timeout=30)
    evs = events(r.text)
    assert [e for e in evs if is_error_event(e, path)] == [evs[-1]]
    assert "overloaded_error" in evs[-1]
    assert wait_rows(faults.ledger, 1)[0]["status"] == "upstream_error"


def test_usage_header_that_is_not_a_number_is_ignored(faults: FaultRig) -> None:
    """``x-engine-cached-tokens: ²`` passes ``str.isdigit`` but not ``int``: it used to raise
    after the send (500, response left open, no row). Now the header is ignored."""
    path = "/v1/chat/completions"
    r = httpx.post(faults.url + path, json=body_for(path, "bad-usage-hdr", True), timeout=30)
    assert r.status_code == 200 and "[DONE]" in r.text
    (row,) = wait_rows(faults.ledger, 1)
    assert (row["status"], row["cached_tokens"]) == ("ok", None)
    assert wait_idle(faults) == (0, 0)


@pytest.mark.parametrize("stream", [True, False])
def test_after_answer_analysis_failure_still_writes_the_row(tmp_path: Any, stream: bool,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """The break / counterfactual analysis raising after the answer used to lose the row (a
    stream's end never recorded; a JSON answer turned into a 500). The answer stands and the row
    is written with what is known."""
    monkeypatch.setattr(Insight, "observe", _raise)
    up = FaultServer()
    with serve_faults(up) as up_url:
        policy = parse_policy({
            "backends": {"oa": {"kind": "openai_compat", "base_url": up_url + "/v1"}},
            "routes": [{"match": "*", "backend": "oa"}],
            "ledger": {"path": str(tmp_path / "l.sqlite")}})
        ledger = Ledger(policy.ledger.path)
        with serve_app(build_app(policy, ledger=ledger, rewrite_fn=None, analyze=True)) as url:
            path = "/v1/chat/completions"
            r = httpx.post(url + path, json=body_for(path, "ok", stream), timeout=30)
            assert r.status_code == 200
            (row,) = wait_rows(ledger, 1)
    assert (row["status"], row["http_status"], row["prompt_tokens"]) == (
        "ok", 200, None if stream else 5)


def _raise(*_: Any, **__: Any) -> Any:
    raise RuntimeError("analysis failed")


@pytest.mark.parametrize("path,model", [("/v1/chat/completions", "huge-error"),
                                        ("/v1/messages", "claude-huge-error")])
def test_huge_upstream_error_body_is_cut_and_answered_in_callers_shape(
        faults: FaultRig, path: str, model: str) -> None:
    """A 4 MiB error body is read up to 1 MiB only: the client gets the upstream's status and a
    short error in its API shape quoting the start, not megabytes."""
    r = httpx.post(faults.url + path, json=body_for(path, model, False), timeout=30)
    assert r.status_code == 500 and len(r.content) < 4096
    obj = r.json()
    assert (obj["type"] == "error") if path == "/v1/messages" else ("error" in obj)
    (row,) = wait_rows(faults.ledger, 1)
    assert (row["status"], row["http_status"]) == ("upstream_error", 500)
    assert wait_idle(faults) == (0, 0)
