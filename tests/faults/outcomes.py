"""What a client and the ledger should see for each fault of :mod:`tests.faults.fault_server`.

``WAYS``: the four ways a request can cross the proxy (client API -> backend API), as
(path, model prefix). :func:`expected` gives an :class:`Outcome` per fault and mode;
:func:`check_answer` asserts a client-visible answer against it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

WAYS = {
    "openai": ("/v1/chat/completions", ""),
    "openai->anthropic": ("/v1/chat/completions", "claude-"),
    "anthropic": ("/v1/messages", "claude-"),
    "anthropic->openai": ("/v1/messages", ""),
}


@dataclass(frozen=True)
class Outcome:
    """``status``: HTTP status the client gets (and the ledger's ``http_status``); ``ledger``:
    the ledger's ``status``; ``error_event``: a stream's last event is one error event in the
    client's API shape."""

    status: int
    ledger: str
    error_event: bool = False


OK = Outcome(200, "ok")
_COMMON = {
    "ok": OK, "drip": OK, "one-byte": OK, "bad-usage-hdr": OK,
    "reset-before": Outcome(502, "UpstreamUnavailable"),
    "status-429": Outcome(429, "upstream_error"),
    "status-500": Outcome(500, "upstream_error"),
    "status-529": Outcome(529, "upstream_error"),
    "stall-before": Outcome(504, "UpstreamTimeout"),
}
STREAM = {**_COMMON, "garbage": OK,
          "reset-after": Outcome(200, "upstream_error", True),
          "stall-after": Outcome(200, "upstream_error", True),
          "truncated": Outcome(200, "upstream_error", True),
          "upstream-error": Outcome(200, "upstream_error", True)}
# a JSON answer cut after its headers is a 502 the proxy built: the client never saw the 200
NON_STREAM = {**_COMMON, "reset-after": Outcome(502, "upstream_error")}


def expected(fault: str, stream: bool) -> Outcome:
    """The outcome of ``fault`` (KeyError for a fault/mode pair the tables do not cover)."""
    return (STREAM if stream else NON_STREAM)[fault]


def events(text: str) -> list[str]:
    """The non-empty SSE events of a stream body."""
    return [e for e in text.replace("\r\n", "\n").split("\n\n") if e.strip()]


def is_error_event(event: str, path: str) -> bool:
    """Whether ``event`` is an error event in the shape of ``path``'s API (Anthropic
    ``event: error`` + ``{"type": "error"}``, OpenAI ``data: {"error": {...}}``)."""
    data = "".join(ln[5:].strip() for ln in event.splitlines() if ln.startswith("data:"))
    try:
        obj: Any = json.loads(data)
    except ValueError:
        return False
    if path == "/v1/messages":
        return event.startswith("event: error") and isinstance(obj, dict) and (
            obj.get("type") == "error")
    return isinstance(obj, dict) and isinstance(obj.get("error"), dict)


def check_answer(status: int, headers: Any, text: str, path: str, stream: bool,
                 want: Outcome) -> None:
    """Assert one answer the client got against ``want``."""
    assert status == want.status, text[:300]
    if status >= 400:
        obj = json.loads(text)
        assert (obj["type"] == "error") if path == "/v1/messages" else ("error" in obj), obj
        if status == 429:
            assert headers.get("retry-after") == "7"
        return
    if not stream:
        obj = json.loads(text)
        assert ("content" in obj) if path == "/v1/messages" else ("choices" in obj), obj
        return
    evs = events(text)
    errors = [e for e in evs if is_error_event(e, path)]
    if want.error_event:
        assert len(errors) == 1 and is_error_event(evs[-1], path), evs[-3:]
    else:
        assert not errors, errors
        final = "message_stop" if path == "/v1/messages" else "[DONE]"
        assert final in evs[-1], evs[-2:]
