"""Request models of the engine's OpenAI-compatible HTTP API, and its error type.

Bodies follow OpenAI's `CreateChatCompletionRequest` / `CreateCompletionRequest`
(openai-openapi spec); the models are tolerant: unknown fields are accepted and ignored, as
vLLM and SGLang do, so SDKs that send newer parameters keep working. A few engine extensions
are accepted the same way vLLM accepts them: `top_k`, `min_p`, `repetition_penalty`,
`stop_token_ids`, `ignore_eos`, `cache_salt` (isolates this request's prefix-cache entries from
requests with another salt), `priority` (vLLM's: a lower value is served first; here only 0,
the default, or a positive background priority, so a client can lower its own rank, never jump
the queue: ``sched.scheduler``, "Priority"). Sampling ranges (temperature 0-2, top_p (0, 1],
penalties [-2, 2], logit_bias [-100, 100], seed 64-bit) are the core's
``SamplingParams.validate``; the bounds here only make the common ones fail at parse time with
the same 400.
Integer and boolean fields are strict, as OpenAI's are: ``"stream": "false"`` or
``"max_tokens": "10"`` is a 400 ``invalid_type``, never silently coerced.

Errors leave the server as OpenAI's shape, status 4xx::

    {"error": {"message": str, "type": "invalid_request_error", "param": str | None,
               "code": str | None}}
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

__all__ = [
    "ApiError",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "StreamOptions",
    "parse_request",
]

T = TypeVar("T", bound="BaseModel")


class ApiError(Exception):
    """A request error answered as OpenAI's ``{"error": {...}}`` body with ``status`` (4xx)."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.type = type

    def body(self) -> dict[str, Any]:
        """The JSON body: ``{"error": {"message", "type", "param", "code"}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class _Tolerant(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Tolerant):
    """``stream_options``: ``include_usage`` adds a final chunk with ``choices: []`` + usage."""

    include_usage: StrictBool = False


class ChatMessage(_Tolerant):
    """One chat message. ``content`` is a string, a list of content parts or null (an
    assistant turn that only calls tools); ``tool_calls`` are OpenAI's
    ``[{"id", "type": "function", "function": {"name", "arguments": str}}]``. ``role`` is one of
    OpenAI's (an unknown role is a 400 ``invalid_value`` naming ``messages[i].role``, as
    OpenAI answers, and as the proxy's OpenAPI document lists them)."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class _SamplingFields(_Tolerant):
    model: str | None = None
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: StrictInt | None = None
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, allow_inf_nan=False)
    logit_bias: dict[str, float] | None = None
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: StrictBool = False
    n: StrictInt | None = Field(default=1, ge=1)
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    logprobs: bool | int | None = None
    cache_salt: str | None = None
    priority: StrictInt = Field(default=0, ge=0, le=1_000_000)

    def stop_list(self) -> list[str]:
        """``stop`` as a list of non-empty strings (OpenAI accepts a string or up to 4)."""
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return [s for s in stops if s]


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions`` body. ``max_completion_tokens`` wins over the older
    ``max_tokens`` when both are given (OpenAI deprecates ``max_tokens``)."""

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None

    def requested_max_tokens(self) -> int | None:
        """The completion-token budget the client asked for, or None (= rest of context)."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions`` body: ``prompt`` is a string, a list of token ids, or a
    one-element list of either (this engine serves one prompt per request)."""

    prompt: str | list[StrictInt] | list[str] | list[list[StrictInt]]  # no true -> 1
    echo: StrictBool = False
    suffix: str | None = None

    def requested_max_tokens(self) -> int | None:
        """``max_tokens`` (OpenAI's legacy default is 16; None here = rest of context)."""
        return self.max_tokens


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse_request(model: type[T], payload: Any) -> T:
    """Validate a decoded JSON ``payload`` into ``model``.

    Errors: ApiError(400, code ``invalid_type`` / ``missing_required_parameter`` /
    ``invalid_value``) naming the first offending field as ``param`` (e.g.
    ``messages[0].role``) — OpenAI answers wrong types with 400, not FastAPI's 422.
    """
    if not isinstance(payload, dict):
        raise ApiError("The request body must be a JSON object.", code="invalid_type")
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = _loc(tuple(err["loc"]))
        kind: Literal["missing_required_parameter", "invalid_type", "invalid_value"]
        if err["type"] == "missing":
            kind = "missing_required_parameter"
            message = f"Missing required parameter: '{param}'."
        elif err["type"].endswith(("_type", "_parsing")):
            kind = "invalid_type"
            message = f"Invalid type for '{param}': {err['msg']}."
        else:
            kind = "invalid_value"
            message = f"Invalid value for '{param}': {err['msg']}."
        raise ApiError(message, param=param, code=kind) from None
