"""An upstream answer of the wrong shape that a bridge must translate is a 502 in the caller's
shape (never a bare text 500 without a ledger row)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.adversarial.conftest import body_for
from tests.proxy.upstream import wait_rows


@pytest.mark.parametrize("path,model", [("/v1/messages", "wrong-shape"),
                                        ("/v1/chat/completions", "claude-wrong-shape")])
def test_wrong_shape_answer_through_a_bridge_is_502_in_callers_shape(hostile: Any, path: str,
                                                                       model: str) -> None:
    r = httpx.post(hostile.url + path, json=body_for(path, model), timeout=30)
    assert r.status_code == 502, r.text
    if path == "/v1/messages":
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "api_error"
    else:
        assert r.json()["error"]["code"] == "upstream_unavailable"
    row = wait_rows(hostile.ledger, 1)[-1]
    assert (row["status"], row["model"]) == ("upstream_error", model)
