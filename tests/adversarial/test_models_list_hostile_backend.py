"""``GET /v1/models`` asks each local / OpenAI-compatible backend for its models; a backend that
answers with the wrong shape (``{"data": 5}``, a list, models without ids) is skipped and the
list still comes back (200, the routes' own model names), never a bare 500."""

from __future__ import annotations

from typing import Any

import httpx
import pytest


@pytest.mark.parametrize("answer", [{"data": 5}, [1, 2], {"data": [5, None, "x"]}, "text",
                                    {"data": [{"id": "real-model"}, {"object": "model"}]}])
def test_wrong_shape_model_list_is_skipped(hostile: Any, answer: Any) -> None:
    hostile.upstream.models_body = answer
    r = httpx.get(hostile.url + "/v1/models", timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list"
    ids = [m["id"] for m in body["data"]]
    assert all(isinstance(i, str) for i in ids)
    if isinstance(answer, dict) and answer["data"] == [{"id": "real-model"}, {"object": "model"}]:
        assert "real-model" in ids and "None" not in ids


def test_any_unexpected_proxy_failure_is_a_shaped_500(hostile: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import prefixgate.proxy.api.models

    async def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("bug")

    monkeypatch.setattr(prefixgate.proxy.api.models, "list_models", boom)
    r = httpx.get(hostile.url + "/v1/models", timeout=30)
    assert r.status_code == 500
    assert r.json()["error"]["code"] == "internal_error"
    assert "Traceback" not in r.text and "bug" not in r.text
