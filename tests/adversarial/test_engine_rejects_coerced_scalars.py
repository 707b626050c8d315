"""The local engine answers a scalar of the wrong JSON type (``"stream": "true"``,
``"max_tokens": "10"``, ``"max_tokens": true``, ``"n": "1"``) with a 400 ``invalid_type`` naming
the field, as OpenAI does, instead of silently coercing it (``"false"`` is not ``false``)."""

from __future__ import annotations

from typing import Any

import pytest

from prefixgate.local_engine.server.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    parse_request,
)

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "tiny", "prompt": "hi"}


@pytest.mark.parametrize("field,value", [
    ("stream", "true"), ("stream", "false"), ("stream", 1), ("max_tokens", "10"),
    ("max_tokens", True), ("max_completion_tokens", "5"), ("n", "1"), ("seed", "7"),
    ("top_k", "3"), ("ignore_eos", "yes"),
])
@pytest.mark.parametrize("model,base", [(ChatCompletionRequest, CHAT),
                                        (CompletionRequest, COMPLETION)])
def test_wrong_json_type_scalars_are_400_invalid_type(model: Any, base: dict[str, Any],
                                                      field: str, value: Any) -> None:
    if field == "max_completion_tokens" and model is CompletionRequest:
        pytest.skip("chat-only field")
    with pytest.raises(ApiError) as ei:
        parse_request(model, {**base, field: value})
    assert ei.value.status == 400
    assert (ei.value.code, ei.value.param) == ("invalid_type", field)


@pytest.mark.parametrize("field,value", [("stream", True), ("max_tokens", 10), ("n", 1),
                                         ("temperature", 1), ("temperature", 0.5),
                                         ("top_p", 1), ("seed", 7)])
def test_right_json_types_still_parse(field: str, value: Any) -> None:
    req = parse_request(ChatCompletionRequest, {**CHAT, field: value})
    assert getattr(req, field) == value


@pytest.mark.parametrize("role", ["bot", "User", "", "model", 3])
def test_an_unknown_role_is_400_naming_the_message(role: Any) -> None:
    # a newcomer's {"role": "bot"} was answered 200: the template rendered it as a turn
    body = {**CHAT, "messages": [{"role": "system", "content": "be brief"},
                                 {"role": role, "content": "hi"}]}
    with pytest.raises(ApiError) as ei:
        parse_request(ChatCompletionRequest, body)
    assert ei.value.status == 400
    assert ei.value.param == "messages[1].role" and ei.value.code in ("invalid_value",
                                                                       "invalid_type")


@pytest.mark.parametrize("role", ["system", "developer", "user", "assistant", "tool", "function"])
def test_every_openai_role_parses(role: str) -> None:
    body = {**CHAT, "messages": [{"role": role, "content": "hi"}]}
    assert parse_request(ChatCompletionRequest, body).messages[0].role == role
