"""Responses API clients through the proxy in front of our engine (tiny random Llama): the
`openai` SDK (create, stream, previous_response_id) and LangChain with use_responses_api."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from bench.conformance import proxy_in_front_of_engine
from tests.tiny_model import make_tiny_model_dir

pytestmark = pytest.mark.slow  # ~20 s: a real engine (tiny random Llama) behind the proxy


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tiny = make_tiny_model_dir(tmp_path_factory.mktemp("tiny"))
    with proxy_in_front_of_engine(tiny, "tiny", default_max_tokens=8) as u:
        yield u


def test_openai_responses_create_and_chain(url: str) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="sk-proxy", max_retries=0)
    first = client.responses.create(model="tiny", input="Hello there", temperature=0)
    assert first.status == "incomplete"  # the route's default cap (8) ends a random model
    assert first.incomplete_details.reason == "max_output_tokens"
    assert first.usage.output_tokens == 8 and first.output_text
    second = client.responses.create(model="tiny", input="And again", temperature=0,
                                     previous_response_id=first.id)
    # the chain re-sends the first turn and its answer: the engine's radix cache serves them
    assert second.usage.input_tokens > first.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 4


def test_openai_responses_stream_with_previous_response_id(url: str) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="sk-proxy", max_retries=0)
    # a random model never stops by itself: each stream ends at its cap with
    # response.incomplete (the SDK's get_final_response() waits for response.completed only)
    with client.responses.stream(model="tiny", input="Count", temperature=0,
                                 max_output_tokens=5) as stream:
        events = list(stream)
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert events[-1].type == "response.incomplete"
    first = events[-1].response
    assert "".join(deltas) == first.output_text and first.usage.output_tokens == 5
    with client.responses.stream(model="tiny", input="More", temperature=0, max_output_tokens=3,
                                 previous_response_id=first.id) as stream:
        second = list(stream)[-1].response
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens_details.cached_tokens > 0


def test_langchain_with_use_responses_api(url: str) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=url + "/v1", api_key="sk-proxy", model="tiny", temperature=0,
                     use_responses_api=True, max_retries=0)
    msg = llm.invoke("Say hello")
    assert isinstance(msg.content, list) and msg.content[0]["type"] == "text"
    assert msg.usage_metadata["output_tokens"] == 8  # no cap sent: the route's default
    chunks: Any = list(llm.stream("Say hello"))
    assert chunks and sum(len(c.content) for c in chunks) > 0


def test_anthropic_count_tokens_is_exact_for_our_engine(url: str) -> None:
    from anthropic import Anthropic

    client = Anthropic(base_url=url, api_key="sk-proxy", max_retries=0)
    kw: Any = {"model": "tiny", "system": "You are terse.", "messages": [
        {"role": "user", "content": "What is the capital of France?"}],
        "tools": [{"name": "lookup", "description": "Look a thing up.",
                   "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}]}
    raw = client.messages.with_raw_response.count_tokens(**kw)
    counted = raw.parse().input_tokens
    assert raw.headers["x-prefixgate-token-count"] == "exact"
    used = client.messages.create(max_tokens=2, **kw).usage
    assert counted == used.input_tokens + used.cache_read_input_tokens
