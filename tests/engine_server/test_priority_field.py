"""The engine's ``priority`` request field (vLLM's extension): read into ``SamplingParams``,
0 by default, a client may lower its own rank (> 0) but never jump the queue (< 0 is a 400
naming ``priority``), and a string is a type error, never coerced."""

from __future__ import annotations

import pytest

from prefixgate.local_engine.server.jobs import sampling_params
from prefixgate.local_engine.server.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    parse_request,
)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}


@pytest.mark.parametrize("model,body", [(ChatCompletionRequest, CHAT), (CompletionRequest, COMPLETION)])
@pytest.mark.parametrize("priority", [None, 0, 1, 7])
def test_priority_reaches_the_sampling_params(model: type, body: dict, priority: int | None) -> None:
    payload = body if priority is None else {**body, "priority": priority}
    params = sampling_params(parse_request(model, payload), vocab_size=100)
    assert params.priority == (priority or 0)


@pytest.mark.parametrize("bad,code", [(-1, "invalid_value"), ("1", "invalid_type"),
                                      (True, "invalid_type")])
def test_a_priority_a_client_may_not_send_is_a_400_naming_it(bad: object, code: str) -> None:
    with pytest.raises(ApiError) as e:
        parse_request(ChatCompletionRequest, {**CHAT, "priority": bad})
    assert e.value.param == "priority" and e.value.code == code
