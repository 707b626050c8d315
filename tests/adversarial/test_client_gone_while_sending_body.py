"""A client that promises a body (``Content-Length``) and goes away before sending all of it is
recorded as a client disconnect (ledger status ``client_disconnect``, 499, as every client gone), not as a proxy bug
(no ``InternalError`` row, no traceback logged); nothing reaches the upstream."""

from __future__ import annotations

import logging
import socket
import time
from typing import Any
from urllib.parse import urlsplit

import pytest


def test_client_gone_mid_body_is_a_client_disconnect_not_an_internal_error(
        hostile: Any, caplog: pytest.LogCaptureFixture) -> None:
    u = urlsplit(hostile.url)
    partial = b'{"model": "m", "messages": [{"role": "user", "content": "'
    with socket.create_connection((u.hostname, u.port), timeout=5) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n" + partial)
        time.sleep(0.2)
    deadline = time.monotonic() + 10
    while not hostile.ledger.rows() and time.monotonic() < deadline:
        time.sleep(0.02)
    row = hostile.ledger.rows()[-1]
    assert (row["status"], row["http_status"]) == ("client_disconnect", 499)
    assert not [r for r in caplog.records
                if r.levelno >= logging.ERROR and r.name.startswith("prefixgate")]
