"""Chat rendering: template use, Hermes tools block, tool history, text-only content rule."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from prefixgate.local_engine.server.chat import (
    encode_chat,
    hermes_tools_block,
    render_chat,
    template_supports_tools,
)
from prefixgate.local_engine.server.protocol import ApiError
from tests.paths import DATA
from tests.tiny_model import real_model_dir

TOOLS_PATH = DATA / "tools" / "tau_bench_airline.json"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(real_model_dir()))


@pytest.fixture(scope="module")
def tools() -> list[dict[str, Any]]:
    data = json.loads(TOOLS_PATH.read_text())
    return list(data if isinstance(data, list) else data["tools"])[:3]


USER = [{"role": "user", "content": "Book me a flight"}]


def test_plain_chat_uses_the_tokenizer_template(tokenizer: Any) -> None:
    text = render_chat(tokenizer, USER)
    expected = tokenizer.apply_chat_template(USER, tokenize=False, add_generation_prompt=True)
    assert text == expected
    assert text.endswith("<|im_start|>assistant\n")


def test_tools_go_into_system_turn_as_hermes_block_and_cost_tokens(tokenizer: Any, tools: Any) -> None:
    assert not template_supports_tools(tokenizer)  # SmolLM2's template ignores tools
    msgs = [{"role": "system", "content": "You are an airline agent."}, *USER]
    without = encode_chat(tokenizer, msgs)
    with_tools = encode_chat(tokenizer, msgs, tools)
    block_tokens = len(tokenizer.encode(hermes_tools_block(tools), add_special_tokens=False))
    assert len(with_tools) - len(without) >= block_tokens  # the tools are real prefill
    text = render_chat(tokenizer, msgs, tools)
    assert text.index("You are an airline agent.") < text.index("<tools>") < text.index("Book me")
    for tool in tools:
        assert json.dumps(tool) in text
    assert text.count("<|im_start|>system") == 1


def test_tools_without_system_message_get_their_own_system_turn(tokenizer: Any, tools: Any) -> None:
    text = render_chat(tokenizer, USER, tools)
    assert text.startswith("<|im_start|>system\n# Tools")


def test_same_tools_render_identical_bytes(tokenizer: Any, tools: Any) -> None:
    assert render_chat(tokenizer, USER, tools) == render_chat(tokenizer, USER, copy.deepcopy(tools))


def test_tool_history_rendered_hermes_style(tokenizer: Any, tools: Any) -> None:
    msgs = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "search", "arguments": '{"origin": "JFK"}'}},
            {"id": "c2", "type": "function",
             "function": {"name": "search", "arguments": '{"origin": "LAX"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "flight A"},
        {"role": "tool", "tool_call_id": "c2", "content": "flight B"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "thanks"},
    ]
    text = render_chat(tokenizer, msgs, tools)
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "search", "arguments": {"origin": "JFK"}}'
            "\n</tool_call>\n<tool_call>") in text
    assert ("<|im_start|>user\n<tool_response>\nflight A\n</tool_response>\n"
            "<tool_response>\nflight B\n</tool_response><|im_end|>") in text
    assert "<|im_start|>assistant\n<|im_end|>" in text  # empty content (case B18) is fine


def test_text_parts_are_joined_and_developer_is_system(tokenizer: Any) -> None:
    msgs = [{"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}]
    text = render_chat(tokenizer, msgs)
    assert "<|im_start|>system\nBe brief.<|im_end|>" in text
    assert "<|im_start|>user\nHi there<|im_end|>" in text


def test_image_part_is_rejected_not_dropped(tokenizer: Any) -> None:
    msgs = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "text", "text": "What color is the square?"}]}]
    with pytest.raises(ApiError) as err:
        render_chat(tokenizer, msgs)
    assert err.value.status == 400
    assert err.value.param == "messages[0].content[0]"
    assert "image_url" in err.value.message and "text-only" in err.value.message


def test_tools_aware_template_receives_tools_and_dict_arguments(tokenizer: Any, tools: Any) -> None:
    tok = copy.copy(tokenizer)
    tok.chat_template = (
        "{% for t in tools %}TOOL:{{ t.function.name }};{% endfor %}"
        "{% for m in messages %}[{{ m.role }}]{{ m.content }}"
        "{% for c in m.tool_calls or [] %}CALL:{{ c.function.arguments.origin }};{% endfor %}"
        "{% endfor %}[assistant]"
    )
    assert template_supports_tools(tok)
    msgs = [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "s", "arguments": '{"origin": "JFK"}'}}]}]
    text = render_chat(tok, msgs, tools)
    names = "".join(f"TOOL:{t['function']['name']};" for t in tools)
    assert text == f"{names}[user]Book me a flight[assistant]CALL:JFK;[assistant]"


def test_template_error_is_a_400(tokenizer: Any) -> None:
    tok = copy.copy(tokenizer)
    tok.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(ApiError) as err:
        render_chat(tok, USER)
    assert err.value.status == 400 and "roles must alternate" in err.value.message
