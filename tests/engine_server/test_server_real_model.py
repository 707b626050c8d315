"""The server on the real SmolLM2-135M-Instruct (slow): a right answer, stream == non-stream,
prefix-cache hits reported in usage."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.servers import serve_app
from tests.tiny_model import real_model_dir

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def real_client() -> Iterator[openai.OpenAI]:
    from prefixgate.local_engine.engine import Engine, EngineConfig
    from prefixgate.local_engine.server import build_app

    engine = Engine(EngineConfig(model_path=str(real_model_dir()), num_kv_slots=8192))
    try:
        with serve_app(build_app(engine)) as url:
            yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    finally:
        engine.shutdown()


def test_greedy_answer_is_right_and_streams_identically(real_client: openai.OpenAI) -> None:
    msgs: Any = QUESTION
    full = real_client.chat.completions.create(model="x", messages=msgs, max_tokens=16,
                                               temperature=0)
    text = full.choices[0].message.content or ""
    assert "Paris" in text
    assert full.model == "SmolLM2-135M-Instruct"
    chunks = list(real_client.chat.completions.create(
        model="x", messages=msgs, max_tokens=16, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    # the same prompt again: all but the last prompt token come from the radix cache
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1


def test_tools_prompt_is_served(real_client: openai.OpenAI) -> None:
    tools: Any = [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
    msgs: Any = [{"role": "user", "content": "What's the weather in Paris?"}]
    resp = real_client.chat.completions.create(model="x", messages=msgs, tools=tools,
                                               max_tokens=24, temperature=0)
    choice = resp.choices[0]
    assert resp.usage is not None and resp.usage.prompt_tokens > 100
    if choice.finish_reason == "tool_calls":  # the model chose to call: it must be well-formed
        assert choice.message.tool_calls and choice.message.tool_calls[0].function.name
    else:
        assert choice.message.content
