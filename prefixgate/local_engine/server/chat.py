"""Chat prompt rendering: OpenAI messages (+ tools) -> prompt text -> token ids.

Rules (the same split vLLM and SGLang make):

- The tokenizer's own chat template renders the conversation. When that template knows about
  tools (its source mentions ``tools``), tools are handed to it (``apply_chat_template(...,
  tools=...)``) and tool-call history is passed in HF's format (``arguments`` as a dict).
- Otherwise tools are written into the system turn as a Hermes-style block (NousResearch
  Hermes-2-Pro / Qwen2.5 function-calling format)::

      # Tools
      ...
      <tools>
      {"type": "function", "function": {...}}      one JSON line per tool, in request order
      </tools>
      ... <tool_call>{"name": ..., "arguments": ...}</tool_call> ...

  and history is rendered Hermes-style too: an assistant turn's ``tool_calls`` become
  ``<tool_call>\\n{"name": .., "arguments": {..}}\\n</tool_call>`` lines after its text, and
  consecutive ``tool`` results become one user turn of ``<tool_response>..</tool_response>``.
  Either way the tools are real prompt tokens, so their prefill cost (and their prefix-cache
  reuse) is real.
- A tokenizer without any chat template falls back to plain ChatML.
- Content parts: only text parts (``{"type": "text", "text": ..}``) are accepted. Any other
  part (image, audio, file) is rejected with a 400: this engine serves a text-only model, and
  dropping an image silently would answer a different question (case B23).
- ``developer`` messages are rendered as ``system`` (OpenAI's o-series rename).
"""

from __future__ import annotations

import json
from typing import Any

from jinja2 import TemplateError

from prefixgate.local_engine.server.protocol import ApiError
from prefixgate.local_engine.server.schema_depth import MAX_TOOL_DEPTH, json_depth

__all__ = [
    "encode_chat",
    "hermes_tools_block",
    "normalize_content",
    "render_chat",
    "template_supports_tools",
]

TEXT_PART_TYPES = ("text", "input_text")

_TOOLS_PREAMBLE = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
_TOOLS_POSTAMBLE = (
    "\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def normalize_content(content: str | list[dict[str, Any]] | None, index: int) -> str:
    """Flatten a message's ``content`` to text; ``index`` is the message's position.

    Shapes: a string is returned as is; null -> ""; a list of parts -> the text parts joined
    with "" (OpenAI concatenates text parts). Errors: ApiError(400,
    code ``unsupported_content_type``, param ``messages[i].content[j]``) for a non-text part.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if kind in TEXT_PART_TYPES and isinstance(part.get("text"), str):
            texts.append(part["text"])
            continue
        param = f"messages[{index}].content[{j}]"
        raise ApiError(
            f"This engine serves a text-only model: content part of type '{kind}' at {param} "
            "is not supported. Remove it or route the request to a multimodal model.",
            param=param,
            code="unsupported_content_type",
        )
    return "".join(texts)


def template_supports_tools(tokenizer: Any) -> bool:
    """True when the tokenizer's chat template reads a ``tools`` variable."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: {"default": ..., "tool_use": ...}
        return "tool_use" in template or any("tools" in t for t in template.values())
    return isinstance(template, str) and "tools" in template


def hermes_tools_block(tools: list[dict[str, Any]]) -> str:
    """The Hermes-style ``# Tools ... <tools>..</tools> ...`` system text for ``tools``.

    One compact-but-spaced JSON line per tool (``json.dumps`` default separators), in request
    order, so the same tools always give the same bytes (prefix-cache stable).
    """
    lines = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return _TOOLS_PREAMBLE + lines + _TOOLS_POSTAMBLE


def _arguments_obj(arguments: Any) -> Any:
    """Tool-call ``arguments`` (an OpenAI JSON string) as an object when it parses within
    ``schema_depth.MAX_TOOL_DEPTH`` levels; else the string as sent (templates and
    ``json.dumps`` recurse into the object; ``json.loads`` itself raises RecursionError past
    ~1000 levels)."""
    if isinstance(arguments, str):
        try:
            obj = json.loads(arguments)
        except (ValueError, RecursionError):
            return arguments
        return obj if json_depth(obj) <= MAX_TOOL_DEPTH else arguments
    return arguments


def _hermes_tool_calls(tool_calls: list[dict[str, Any]]) -> str:
    blocks = []
    for call in tool_calls:
        fn = call.get("function") or {}
        payload = {"name": fn.get("name"), "arguments": _arguments_obj(fn.get("arguments", {}))}
        blocks.append("<tool_call>\n" + json.dumps(payload, ensure_ascii=False) + "\n</tool_call>")
    return "\n".join(blocks)


def _hermes_messages(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[dict[str, str]]:
    """Messages as plain ``{"role", "content": str}`` with tools and tool turns inlined."""
    out: list[dict[str, str]] = []
    for i, msg in enumerate(messages):
        role = "system" if msg["role"] == "developer" else msg["role"]
        text = normalize_content(msg.get("content"), i)
        if role == "assistant" and msg.get("tool_calls"):
            calls = _hermes_tool_calls(msg["tool_calls"])
            text = f"{text}\n{calls}" if text else calls
        if role == "tool":
            response = f"<tool_response>\n{text}\n</tool_response>"
            if out and out[-1].get("_tool"):
                out[-1]["content"] += "\n" + response
            else:
                out.append({"role": "user", "content": response, "_tool": "1"})
            continue
        out.append({"role": role, "content": text})
    for msg in out:
        msg.pop("_tool", None)
    if tools:
        block = hermes_tools_block(tools)
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{block}" if out[0]["content"] else block
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def _hf_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages for a tools-aware template: text content, tool-call arguments as objects."""
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        item = dict(msg)
        if item["role"] == "developer":
            item["role"] = "system"
        item["content"] = normalize_content(msg.get("content"), i)
        if msg.get("tool_calls"):
            item["tool_calls"] = [
                {
                    **call,
                    "function": {
                        **(call.get("function") or {}),
                        "arguments": _arguments_obj((call.get("function") or {}).get("arguments")),
                    },
                }
                for call in msg["tool_calls"]
            ]
        out.append(item)
    return out


def _chatml(messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return body + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def render_chat(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """Render OpenAI ``messages`` (dicts) and ``tools`` into the prompt text, ending with the
    assistant generation prompt (unless ``add_generation_prompt`` is False: ``/tokenize`` may
    ask for the conversation alone). See the module docstring for the rules.

    Errors: ApiError(400) for non-text content parts; ApiError(400, code
    ``invalid_chat_template_input``) when the template rejects the conversation (e.g. roles
    that do not alternate).
    """
    try:
        if tools and template_supports_tools(tokenizer):
            text = tokenizer.apply_chat_template(
                _hf_messages(messages), tools=tools, tokenize=False,
                add_generation_prompt=add_generation_prompt,
            )
        else:
            plain = _hermes_messages(messages, tools)
            if getattr(tokenizer, "chat_template", None):
                text = tokenizer.apply_chat_template(
                    plain, tokenize=False, add_generation_prompt=add_generation_prompt
                )
            else:
                text = _chatml(plain, add_generation_prompt)
    except ApiError:
        raise
    except (TemplateError, TypeError, KeyError, ValueError) as exc:  # raise_exception() etc.
        raise ApiError(
            f"The model's chat template rejected the messages: {exc}",
            param="messages",
            code="invalid_chat_template_input",
        ) from None
    return str(text)


def encode_chat(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> list[int]:
    """``render_chat`` then tokenize without adding special tokens (the template already
    holds them). Returns the prompt token ids, length = prompt_tokens."""
    text = render_chat(tokenizer, messages, tools, add_generation_prompt)
    return list(tokenizer.encode(text, add_special_tokens=False))
