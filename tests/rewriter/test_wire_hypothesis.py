"""Round-trip identity (key order included) on generated requests of both APIs."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings

from prefixgate.rewriter.wire import codec as wire
from tests.rewriter.strategies import JSONV, anthropic_requests, openai_requests

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(openai_requests())
def test_generated_openai_requests_round_trip_byte_identical(body: dict[str, Any]) -> None:
    assert json.dumps(wire.render(wire.parse(body, "openai"))) == json.dumps(body)


@FAST
@given(anthropic_requests())
def test_generated_anthropic_requests_round_trip_byte_identical(body: dict[str, Any]) -> None:
    assert json.dumps(wire.render(wire.parse(body, "anthropic"))) == json.dumps(body)


@FAST
@given(JSONV)
def test_arbitrary_json_in_modelled_keys_round_trips(value: Any) -> None:
    for api in ("openai", "anthropic"):
        for key in ("messages", "system", "tools"):
            body = {"model": "m", key: value, "after": 1}
            assert json.dumps(wire.render(wire.parse(body, api))) == json.dumps(body)
