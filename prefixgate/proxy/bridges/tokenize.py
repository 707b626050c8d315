"""A Messages request as a ``POST /tokenize`` request: the one shape both ``/tokenize`` clients send.

Our engine, vLLM and SGLang serve ``POST /tokenize`` beside ``/v1`` (vLLM docs, "OpenAI-Compatible
Server", Tokenizer API): ``{"model", "messages", "tools", "add_generation_prompt"} -> {"tokens":
[int], "count": int}``, rendered with the model's own chat template. Two callers use it: the
count_tokens endpoint (:class:`CountTokens`, through the pipeline's send) and the after-answer
counterfactual (:mod:`prefixgate.proxy.observe.engine_tokens`, for the ids).
"""

from __future__ import annotations

from typing import Any

import orjson

from prefixgate.proxy.bridges.anthropic_openai import AnthropicToOpenAI, error_to_anthropic
from prefixgate.proxy.bridges.base import Bridge, Rewritten
from prefixgate.proxy.core import exactjson
from prefixgate.proxy.core.usage import Usage


def tokenize_url(base_url: str) -> str:
    """``http://h:p/v1`` -> ``http://h:p/tokenize`` (vLLM serves it at the root)."""
    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    return root + "/tokenize"


def tokenize_body(chat: dict[str, Any], add_generation_prompt: bool) -> dict[str, Any]:
    """The ``/tokenize`` request of a Chat Completions body: its model, messages and tools;
    ``add_generation_prompt``: count the assistant header generation renders after them."""
    out: dict[str, Any] = {"model": chat.get("model"), "messages": chat.get("messages")}
    if add_generation_prompt:
        out["add_generation_prompt"] = True
    if chat.get("tools"):
        out["tools"] = chat["tools"]
    return out


def parse_count(answer: Any) -> int:
    """``count`` of a ``/tokenize`` answer. Raises ValueError when it is not an int >= 0."""
    count = answer.get("count") if isinstance(answer, dict) else None
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ValueError("the backend's /tokenize sent an unreadable answer")
    return count


class CountTokens(Bridge):
    """A Messages ``count_tokens`` request on an engine that tokenizes: bridged to Chat
    Completions (the same A->O bridge ``/v1/messages`` uses), sent to ``/tokenize``; the answer
    ``{"count"}`` -> Anthropic's ``{"input_tokens"}``; errors in Anthropic's shape."""

    translate = True

    def __init__(self) -> None:
        super().__init__("anthropic", "openai", "/tokenize", passes=False)
        self._chat = AnthropicToOpenAI()

    def url(self, base_url: str) -> str:
        return tokenize_url(base_url)

    def encode(self, body: dict[str, Any], raw: bytes, rewritten: Rewritten | None,
               model: str | None, max_depth: int) -> bytes:
        chat = self._chat.request({**body, "max_tokens": 1, **({"model": model} if model else {})},
                                  max_depth)
        return exactjson.dumps(tokenize_body(chat, add_generation_prompt=False))

    def answer(self, answer: dict[str, Any], content: bytes, model: str) -> tuple[bytes, Usage]:
        count = parse_count(answer)
        return orjson.dumps({"input_tokens": count}), Usage(prompt_tokens=count)

    def error(self, raw: bytes, status: int) -> bytes | None:
        return orjson.dumps(error_to_anthropic(raw, status))
