"""Prompt -> token ids, shared by generation and the ``/tokenize`` / ``/detokenize`` routes.

``POST /tokenize`` is vLLM's endpoint of the same name (vLLM docs, "OpenAI-Compatible Server",
Tokenizer API): the body is either a completion-style ``{"prompt": str | [int]}`` or a chat-style
``{"messages": [...], "tools": [...], "add_generation_prompt": true}``; the answer is
``{"tokens": [int], "count": int, "max_model_len": int}`` (plus ``"token_strs"`` when
``return_token_strs`` is true). The ids are exactly those generation would prefill:
:func:`chat_prompt_ids` and :func:`completion_prompt_ids` are the functions the chat and
completion routes call too, so a caller (the proxy's counterfactual) sees the engine's own token
sequence. Nothing is generated, nothing enters the KV cache.

``POST /detokenize``: ``{"tokens": [int]} -> {"prompt": str}``.

Errors are OpenAI's 400 shape (:class:`~prefixgate.local_engine.server.protocol.ApiError`): a body
with both or neither of ``prompt`` / ``messages``, ids outside the vocabulary, template rejections.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, StrictBool, StrictInt

from prefixgate.local_engine.server.chat import encode_chat
from prefixgate.local_engine.server.protocol import ApiError, ChatMessage, _Tolerant, parse_request

__all__ = [
    "ChatTokenizeRequest",
    "DetokenizeRequest",
    "PromptTokenizeRequest",
    "chat_prompt_ids",
    "completion_prompt_ids",
    "detokenize",
    "match_ids",
    "tokenize",
]


class PromptTokenizeRequest(_Tolerant):
    """``/tokenize`` with a raw ``prompt`` (string or ids, as ``/v1/completions`` takes it)."""

    model: str | None = None
    prompt: str | list[StrictInt] | list[str] | list[list[StrictInt]]  # no true -> 1
    return_token_strs: StrictBool = False


class ChatTokenizeRequest(_Tolerant):
    """``/tokenize`` with chat ``messages`` (+ ``tools``), rendered by the chat template."""

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: StrictBool = True
    return_token_strs: StrictBool = False


class DetokenizeRequest(_Tolerant):
    """``/detokenize`` body: the ids to turn back into text."""

    model: str | None = None
    tokens: list[StrictInt]


def _check_vocab(tokenizer: Any, ids: list[int], param: str) -> None:
    vocab = len(tokenizer)
    if any(t < 0 or t >= vocab for t in ids):
        raise ApiError(f"Token ids must lie in [0, {vocab}).", param=param, code="invalid_value")


def chat_prompt_ids(tokenizer: Any, messages: list[ChatMessage],
                    tools: list[dict[str, Any]] | None, add_generation_prompt: bool = True
                    ) -> list[int]:
    """Token ids of a chat request: messages as dicts without nulls, then
    :func:`prefixgate.local_engine.server.chat.encode_chat`. Errors: those of ``encode_chat``
    (ApiError 400)."""
    dicts = [m.model_dump(exclude_none=True) for m in messages]
    return encode_chat(tokenizer, dicts, tools or None, add_generation_prompt)


def completion_prompt_ids(tokenizer: Any, prompt: Any) -> list[int]:
    """Token ids of a completion ``prompt``: a string is encoded (special tokens added as the
    tokenizer does), ids are taken as given; a one-element list of either is unwrapped.

    Errors: ApiError(400, ``invalid_value``) for several prompts, an empty prompt or ids outside
    the vocabulary.
    """
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise ApiError("This engine serves one prompt per request.", param="prompt",
                           code="invalid_value")
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = list(tokenizer.encode(prompt))
    else:
        ids = [int(t) for t in prompt]
    if not ids:
        raise ApiError("The prompt is empty.", param="prompt", code="invalid_value")
    _check_vocab(tokenizer, ids, "prompt")
    return ids


def match_ids(tokenizer: Any, body: dict[str, Any]) -> tuple[list[int], bytes | None]:
    """``/v1/cache/match``'s ids form ``{"input_ids": [int], "cache_salt"?: str}`` -> (ids, the
    radix key of the salt or None). ApiError(400) for an id that is not an integer (a boolean
    or float is not one) or lies outside the vocabulary, or a salt that is not a string:
    filtering them out would answer for a prompt nobody sent."""
    ids = body["input_ids"]
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ApiError("'input_ids' must be an array of integer token ids.", param="input_ids",
                       code="invalid_type")
    _check_vocab(tokenizer, ids, "input_ids")
    salt = body.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise ApiError("Invalid type for 'cache_salt': expected a string.", param="cache_salt",
                       code="invalid_type")
    return ids, (salt.encode() if salt else None)


def tokenize(tokenizer: Any, max_model_len: int, payload: Any) -> dict[str, Any]:
    """The ``/tokenize`` answer for a decoded JSON ``payload`` (see module docstring).

    Errors: ApiError(400) when the payload has both or neither of ``prompt`` and ``messages``,
    or for any error of :func:`parse_request`, :func:`chat_prompt_ids`,
    :func:`completion_prompt_ids`.
    """
    if not isinstance(payload, dict):
        raise ApiError("The request body must be a JSON object.", code="invalid_type")
    if ("prompt" in payload) == ("messages" in payload):
        raise ApiError("Give exactly one of 'prompt' or 'messages'.", param="messages",
                       code="invalid_value")
    strs: bool
    if "messages" in payload:
        chat = parse_request(ChatTokenizeRequest, payload)
        ids = chat_prompt_ids(tokenizer, chat.messages, chat.tools, chat.add_generation_prompt)
        strs = chat.return_token_strs
    else:
        plain = parse_request(PromptTokenizeRequest, payload)
        ids = completion_prompt_ids(tokenizer, plain.prompt)
        strs = plain.return_token_strs
    out: dict[str, Any] = {"tokens": ids, "count": len(ids), "max_model_len": max_model_len}
    if strs:
        out["token_strs"] = list(tokenizer.convert_ids_to_tokens(ids))
    return out


def detokenize(tokenizer: Any, payload: Any) -> dict[str, str]:
    """The ``/detokenize`` answer ``{"prompt": text}`` (special tokens kept, as vLLM does).

    Errors: ApiError(400) for a malformed body or ids outside the vocabulary.
    """
    req = parse_request(DetokenizeRequest, payload)
    _check_vocab(tokenizer, req.tokens, "tokens")
    return {"prompt": str(tokenizer.decode(req.tokens))}
