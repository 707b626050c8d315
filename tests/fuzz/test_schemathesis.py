"""schemathesis against the proxy's own OpenAPI document, both model endpoints, in-process.

The document (``/openapi.json``, request-body schemas from :mod:`prefixgate.proxy.api.openapi_schemas`) drives
generation: positive bodies (what the schema allows) and negative ones (what it does not). Each
goes through the ASGI app — fuzz policy, every pass on, recording upstream — and the answer must
be below 500 and in the caller's API shape: an error body of its API (a 400 naming the param),
or a completion / message (a stream that ends with its final event). Bounded: ``EXAMPLES`` per
endpoint and mode.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode

from prefixgate.cache.ledger.store import Ledger
from tests.fuzz.harness import RecordingUpstream, fuzz_app
from tests.fuzz.jsontext import loads
from tests.fuzz.known_defects import uncovered
from tests.fuzz.meaning import Violation
from tests.fuzz.shapes import answer_problems, error_problems

EXAMPLES = 100
ENDPOINTS = {"/v1/chat/completions": "openai", "/v1/messages": "anthropic"}
APP = fuzz_app(RecordingUpstream(), Ledger(":memory:"))
SCHEMA = schemathesis.openapi.from_asgi("/openapi.json", APP)


@pytest.fixture(autouse=True)
def quiet_logs() -> Iterator[None]:
    logging.disable(logging.ERROR)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def test_openapi_document_describes_both_model_request_bodies() -> None:
    """The document is served and carries a JSON request-body schema for each model endpoint."""
    paths = SCHEMA.raw_schema["paths"]
    for path in ENDPOINTS:
        body = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert "model" in body["required"] and "messages" in body["required"]


def _problems(path: str, status: int, body: bytes, ctype: str, sent: object) -> list[Violation]:
    api = ENDPOINTS[path]
    if status >= 500:
        return [Violation("status_5xx", f"{status}: {body[:200]!r}")]
    if status >= 400:
        try:
            err = loads(body)
        except ValueError:
            err = None
        found = error_problems(status, err, api)
        if b"could not parse the JSON" in body or b"body must be a JSON object" in body:
            # about the body as a whole (not JSON, not an object): there is no field to name
            found = [p for p in found if p != "error_names_no_param"]
        return [Violation(p, f"{status}: {body[:200]!r}") for p in found]
    stream = isinstance(sent, dict) and sent.get("stream") is True
    return [Violation(p, body[:200].decode("utf-8", "replace")) for p in answer_problems(body, ctype, api, stream)]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
@pytest.mark.parametrize("path", sorted(ENDPOINTS))
def test_schema_generated_bodies_get_no_5xx_and_answers_in_the_callers_shape(path: str, mode: GenerationMode) -> None:
    strategy = SCHEMA.include(path=path, method="POST").as_strategy(generation_mode=mode)

    @settings(max_examples=EXAMPLES, deadline=None, phases=(Phase.explicit, Phase.generate),
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def check(case: schemathesis.Case) -> None:
        resp = case.call()
        client_api = ENDPOINTS[path]
        model = case.body.get("model") if isinstance(case.body, dict) else None
        backend = "anthropic" if isinstance(model, str) and model.startswith("claude-") else "openai"
        found = _problems(path, resp.status_code, resp.content, resp.headers.get("content-type", [""])[0]
                          if isinstance(resp.headers.get("content-type"), list)
                          else resp.headers.get("content-type", ""), case.body)
        left = uncovered(f"{client_api}->{backend}", found, case.body if isinstance(case.body, bytes)
                         else repr(case.body).encode())
        assert not left, f"{case.body!r:.600}\n" + "\n".join(f"{v.kind}: {v.detail}" for v in left)

    check()
