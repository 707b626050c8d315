"""`llm-comply` (PyPI) against the proxy in front of our engine (tiny random Llama): every
response the proxy builds or the engine returns passes the current OpenAI / Anthropic / Open
Responses schemas and protocols. A failure is tolerated only when it is a capability the model
lacks (bench/conformance.py ``classify``: no tool call, no EOS within the cap, no vision)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.conformance import classify, proxy_in_front_of_engine, run_suite
from tests.tiny_model import make_tiny_model_dir

pytestmark = pytest.mark.slow

SUITES = ("openai-chat", "anthropic", "open-responses")


@pytest.fixture(scope="module")
def proxy_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not Path(sys.executable).with_name("llm-comply").exists():
        pytest.skip("llm-comply is not installed (pip install -e '.[test]')")
    tiny = make_tiny_model_dir(tmp_path_factory.mktemp("tiny"))
    with proxy_in_front_of_engine(tiny, "tiny", default_max_tokens=24) as url:
        yield url


@pytest.mark.parametrize("suite", SUITES)
def test_llm_comply_suite_has_no_schema_or_protocol_failure(proxy_url: str, suite: str) -> None:
    results = run_suite(proxy_url, "tiny", suite)
    assert len(results) >= 9  # the suite ran (a suite that could not connect reports failures)
    schema = {r["id"]: r.get("errors") for r in results if classify(r) == "schema"}
    assert schema == {}
    assert sum(r["status"] == "passed" for r in results) >= 3


def test_classify_tells_a_schema_error_from_a_missing_capability() -> None:
    unfinished = {"id": "chat-basic-response", "status": "failed",
                  "errors": ["finish_reason: expected 'stop', got 'length'"]}
    schema = {"id": "chat-basic-response", "status": "failed",
              "errors": ["finish_reason: expected 'stop', got 'length'",
                         "choices.0.message: 'refusal' is a required property"]}
    image = {"id": "image-input", "status": "failed", "errors": ["HTTP 400 (expected [200])"]}
    image_500 = {"id": "image-input", "status": "failed", "errors": ["HTTP 500 (expected [200])"]}
    assert [classify(r) for r in (unfinished, schema, image, image_500)] == [
        "capability", "schema", "capability", "schema"]
