"""An upstream's error is recorded with what kind of error it was (issue 22, item 7): a
context-length error was recorded only as "upstream 400". The kind is the body's ``code`` or
``type`` word, never its message (which may quote the prompt)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from prefixgate.proxy.core.errors import upstream_error_kind
from tests.proxy.upstream import Script, wait_rows

SECRET = "the-users-prompt-text"


@pytest.mark.parametrize("body, kind", [
    ({"error": {"message": f"too long: {SECRET}", "type": "invalid_request_error",
                "code": "context_length_exceeded"}}, "context_length_exceeded"),
    ({"type": "error", "error": {"type": "overloaded_error", "message": SECRET}}, "overloaded_error"),
    ({"error": {"message": SECRET, "type": "BadRequestError", "code": 400}}, "BadRequestError"),
    ({"error": {"message": SECRET, "code": "has spaces: " + SECRET}}, ""),
    ({"detail": SECRET}, ""), ([1, 2], ""),
])
def test_the_kind_is_the_bodys_code_or_type_word(body: Any, kind: str) -> None:
    import json

    assert upstream_error_kind(json.dumps(body).encode()) == kind
    assert upstream_error_kind(b"<html>502</html>") == ""


def test_a_context_length_error_is_recorded_by_its_code(rig: Any) -> None:
    rig.upstream.script = Script(status=400, body={"error": {
        "message": f"maximum context length is 8192 tokens: {SECRET}",
        "type": "invalid_request_error", "code": "context_length_exceeded"}})
    r = httpx.post(rig.url + "/v1/chat/completions", timeout=30,
                   json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400
    (row,) = wait_rows(rig.ledger, 1)
    assert row["error"] == "upstream 400 context_length_exceeded"
    assert SECRET not in str(row)
