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
with both or neither of ``prompt`` / ``messages``, ids outside the vocabulary, template rejections,
and (``PromptLimit``) a prompt text too long for the context at any tokenization.

**The size check before tokenizing** (``PromptLimit``): one token covers at most
``max_token_bytes`` bytes of input text, so a text of ``c`` characters (≤ its UTF-8 bytes) is at
least ``ceil(c / max_token_bytes)`` tokens. When that bound already reaches the context, the
prompt is refused (``context_length_exceeded``, "at least N tokens") without being tokenized —
an 8 MB prompt costs a length, not 16 s of tokenizer time. Prompts under the bound are tokenized
and checked exactly. Callers run these functions in a worker thread (the tokenizer releases the
GIL), never on the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field, StrictBool, StrictInt

from prefixgate.local_engine.server.chat import render_chat
from prefixgate.local_engine.server.protocol import ApiError, ChatMessage, _Tolerant, parse_request
from prefixgate.local_engine.server.schema_depth import check_tool_depths

__all__ = [
    "ChatTokenizeRequest",
    "DetokenizeRequest",
    "PromptLimit",
    "PromptTokenizeRequest",
    "chat_prompt_ids",
    "completion_prompt_ids",
    "context_error",
    "detokenize",
    "match_ids",
    "max_token_bytes",
    "tokenize",
]


def context_error(limit: int, got: int, param: str, at_least: bool = False) -> ApiError:
    """OpenAI's ``context_length_exceeded`` 400 (wording as OpenAI's own answer); ``at_least``:
    ``got`` is a lower bound (``PromptLimit``: the prompt was not tokenized)."""
    what = "messages" if param == "messages" else "prompt"
    n = f"at least {got}" if at_least else str(got)
    return ApiError(
        f"This model's maximum context length is {limit} tokens. However, your {what} "
        f"resulted in {n} tokens.",
        param=param,
        code="context_length_exceeded",
    )


def max_token_bytes(tokenizer: Any) -> int:
    """Most bytes of input text one token of ``tokenizer`` can cover: the longest vocabulary
    entry's string form, UTF-8 encoded (added tokens included). That over-estimates for
    byte-level BPE (each byte ≥ 0x80 is spelled as a 2-byte character) and SentencePiece (its
    3-byte ``▁`` stands for a 1-byte space). Assumes the normalizer never shortens text (none
    does in byte-level BPE, SentencePiece or lower-casing WordPiece). SmolLM2: 162."""
    return max((len(str(t).encode("utf-8", "surrogatepass")) for t in tokenizer.get_vocab()),
               default=1) or 1


@dataclass(frozen=True)
class PromptLimit:
    """The size check before tokenizing (module docstring). ``max_context_len``: tokens the
    engine holds per request; ``max_token_bytes``: ``max_token_bytes(tokenizer)``."""

    max_context_len: int
    max_token_bytes: int

    def min_tokens(self, text: str) -> int:
        """A lower bound on the tokens ``text`` becomes (characters ≤ UTF-8 bytes)."""
        return -(-len(text) // self.max_token_bytes)

    def check(self, text: str, param: str) -> None:
        """ApiError(400, ``context_length_exceeded``) when ``text`` cannot leave room for one
        completion token at any tokenization (at least ``max_context_len`` tokens)."""
        n = self.min_tokens(text)
        if n >= self.max_context_len:
            raise context_error(self.max_context_len, n, param, at_least=True)


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
                    tools: list[dict[str, Any]] | None, add_generation_prompt: bool = True,
                    limit: PromptLimit | None = None) -> list[int]:
    """Token ids of a chat request: tools checked for depth (``schema_depth``), messages as
    dicts without nulls, rendered by :func:`prefixgate.local_engine.server.chat.render_chat`,
    checked by ``limit`` (before tokenizing), tokenized without adding special tokens (the
    template holds them). Errors: those of ``check_tool_depths``, ``render_chat`` and ``limit``
    (ApiError 400)."""
    check_tool_depths(tools)  # before anything recursive reads them
    dicts = [m.model_dump(exclude_none=True) for m in messages]
    text = render_chat(tokenizer, dicts, tools or None, add_generation_prompt)
    if limit is not None:
        limit.check(text, "messages")
    return list(tokenizer.encode(text, add_special_tokens=False))


def completion_prompt_ids(tokenizer: Any, prompt: Any, limit: PromptLimit | None = None
                          ) -> list[int]:
    """Token ids of a completion ``prompt``: a string is checked by ``limit`` then encoded
    (special tokens added as the tokenizer does), ids are taken as given; a one-element list
    of either is unwrapped.

    Errors: ApiError(400, ``invalid_value``) for several prompts, an empty prompt or ids outside
    the vocabulary; ``limit``'s ``context_length_exceeded``.
    """
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise ApiError("This engine serves one prompt per request.", param="prompt",
                           code="invalid_value")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if limit is not None:
            limit.check(prompt, "prompt")
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


def tokenize(tokenizer: Any, max_model_len: int, payload: Any,
             limit: PromptLimit | None = None) -> dict[str, Any]:
    """The ``/tokenize`` answer for a decoded JSON ``payload`` (see module docstring).

    Errors: ApiError(400) when the payload has both or neither of ``prompt`` and ``messages``,
    or for any error of :func:`parse_request`, :func:`chat_prompt_ids`,
    :func:`completion_prompt_ids` (``limit``: a text that must exceed the context is refused
    untokenized, as generation would refuse it).
    """
    if not isinstance(payload, dict):
        raise ApiError("The request body must be a JSON object.", code="invalid_type")
    if ("prompt" in payload) == ("messages" in payload):
        raise ApiError("Give exactly one of 'prompt' or 'messages'.", param="messages",
                       code="invalid_value")
    strs: bool
    if "messages" in payload:
        chat = parse_request(ChatTokenizeRequest, payload)
        ids = chat_prompt_ids(tokenizer, chat.messages, chat.tools, chat.add_generation_prompt,
                              limit)
        strs = chat.return_token_strs
    else:
        plain = parse_request(PromptTokenizeRequest, payload)
        ids = completion_prompt_ids(tokenizer, plain.prompt, limit)
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
