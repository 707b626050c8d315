"""The engine server through the real ``openai`` SDK (sync + async, stream + non-stream)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.engine_server.conftest import MAX_CONTEXT

MSGS: list[Any] = [{"role": "user", "content": "Say something short."}]


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture
def aclient(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    ids = [m.id for m in client.models.list().data]
    assert ids == ["tiny"]


def test_chat_non_stream_has_openai_shape_and_usage(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=6, temperature=0)
    assert resp.object == "chat.completion" and resp.id.startswith("chatcmpl-")
    assert resp.model == "tiny"
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    usage = resp.usage
    assert usage is not None
    assert usage.prompt_tokens > 5
    assert 1 <= usage.completion_tokens <= 6
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens is not None


def test_stream_gives_same_text_as_non_stream_for_greedy(client: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "Count with me: one, two"}]
    full = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0)
    chunks = list(client.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True},
    ))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1
    assert {c.model for c in chunks} == {"tiny"}
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].choices == []  # include_usage: the last chunk carries only usage
    usage = chunks[-1].usage
    assert usage is not None and full.usage is not None
    assert usage.completion_tokens == full.usage.completion_tokens
    assert usage.prompt_tokens == full.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_repeated_prompt_reports_cached_tokens(client: openai.OpenAI) -> None:
    msgs = [{"role": "system", "content": "You are a terse assistant. " * 8},
            {"role": "user", "content": "Hello again"}]
    first = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, temperature=0)
    second = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, temperature=0)
    assert first.usage and second.usage
    cached = second.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    assert cached is not None
    assert second.usage.prompt_tokens // 2 < cached <= second.usage.prompt_tokens


def test_tools_are_rendered_into_the_prompt(client: openai.OpenAI) -> None:
    tools: Any = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
    plain = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=1, temperature=0)
    with_tools = client.chat.completions.create(
        model="tiny", messages=MSGS, tools=tools, max_tokens=1, temperature=0)
    assert plain.usage and with_tools.usage
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 40


def test_assistant_tool_call_history_is_accepted(client: openai.OpenAI) -> None:
    msgs: Any = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "toolu_9", "type": "function", "function": {"name": "calc", "arguments": '{"e":"2+2"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_9", "content": "4"},
    ]
    tools: Any = [{"type": "function", "function": {"name": "calc", "parameters": {
        "type": "object", "properties": {"e": {"type": "string"}}}}}]
    resp = client.chat.completions.create(model="tiny", messages=msgs, tools=tools, max_tokens=2)
    assert resp.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_context_length_exceeded_is_openai_400(client: openai.OpenAI) -> None:
    long = "word " * (MAX_CONTEXT + 50)
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": long}], max_tokens=4,
                stream=stream)
        body: Any = err.value.body
        assert err.value.status_code == 400
        assert body["code"] == "context_length_exceeded" and body["param"] == "messages"
        assert body["type"] == "invalid_request_error"
        assert body["message"].startswith(f"This model's maximum context length is {MAX_CONTEXT} tokens. However, your messages resulted in ")
    with pytest.raises(openai.BadRequestError) as err2:
        client.completions.create(model="tiny", prompt=long, max_tokens=4)
    assert err2.value.code == "context_length_exceeded"


def test_image_part_is_rejected_with_400(client: openai.OpenAI) -> None:
    msgs: Any = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "text", "text": "What color is the square?"}]}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=msgs, max_tokens=4)
    body: Any = err.value.body
    assert body["param"] == "messages[0].content[0]"
    assert "text-only" in body["message"]


def test_n_greater_than_one_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2, n=2)
    assert err.value.param == "n"  # type: ignore[attr-defined]


def test_stop_and_max_completion_tokens_are_honoured(client: openai.OpenAI) -> None:
    full = client.chat.completions.create(model="tiny", messages=MSGS, max_completion_tokens=8,
                                          temperature=0)
    text = full.choices[0].message.content or ""
    assert full.usage and full.usage.completion_tokens <= 8
    if len(text) > 3:  # stop at a substring the greedy answer is known to contain
        stop = text[2:4]
        cut = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=8,
                                             temperature=0, stop=stop)
        assert cut.choices[0].message.content == text[: text.index(stop)]
        assert cut.choices[0].finish_reason == "stop"


def test_seeded_sampling_is_reproducible(client: openai.OpenAI) -> None:
    kw: Any = {"model": "tiny", "messages": MSGS, "max_tokens": 6, "temperature": 1.0,
               "seed": 11, "extra_body": {"top_k": 50}}
    a = client.chat.completions.create(**kw).choices[0].message.content
    b = client.chat.completions.create(**kw).choices[0].message.content
    assert a == b


def test_completions_sync_stream_and_non_stream_agree(client: openai.OpenAI) -> None:
    full = client.completions.create(model="tiny", prompt="The sky is", max_tokens=6, temperature=0)
    assert full.object == "text_completion"
    assert full.usage and full.usage.completion_tokens >= 1
    parts = list(client.completions.create(model="tiny", prompt="The sky is", max_tokens=6,
                                           temperature=0, stream=True))
    assert "".join(p.choices[0].text for p in parts if p.choices) == full.choices[0].text


async def test_async_sdk_stream_and_non_stream(aclient: openai.AsyncOpenAI) -> None:
    full = await aclient.chat.completions.create(model="tiny", messages=MSGS, max_tokens=5,
                                                 temperature=0)
    stream = await aclient.chat.completions.create(model="tiny", messages=MSGS, max_tokens=5,
                                                   temperature=0, stream=True)
    text = ""
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
    assert text == full.choices[0].message.content
    comp = await aclient.completions.create(model="tiny", prompt=[1, 2, 3, 4], max_tokens=3,
                                            temperature=0)
    assert comp.usage and comp.usage.prompt_tokens == 4


async def test_concurrent_streams_are_batched_and_all_complete(
    aclient: openai.AsyncOpenAI, engine: Any
) -> None:
    import asyncio

    async def one(i: int) -> tuple[str, int]:
        stream = await aclient.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": f"Request number {i}"}],
            max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True})
        text, completion = "", 0
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage:
                completion = chunk.usage.completion_tokens
        return text, completion

    results = await asyncio.gather(*(one(i) for i in range(4)))
    assert [n for _, n in results] == [12] * 4
    assert all(text for text, _ in results)
    assert engine.stats()["num_running"] == 0


def test_unsupported_response_format_is_400_not_ignored(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="tiny", messages=MSGS, max_tokens=2,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {}}})
    assert err.value.param == "response_format"  # type: ignore[attr-defined]
    ok = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=1,
                                        response_format={"type": "text"})
    assert ok.choices[0].finish_reason in ("stop", "length")
