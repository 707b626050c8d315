"""A scripted engine with a REAL prefix cache, for checking the counterfactual against measurement.

:class:`PrefixEngine` renders a Chat Completions body the way chat templates do — the leading
system messages, then the tools as ``json.dumps(tools, sort_keys=True)`` (Jinja's ``tojson``
sorts keys, so a tool schema's key order is invisible to the model), then each message, then
the generation prompt — and tokenizes it with a real BPE vocabulary (o200k_base, offline). Its
cache is shared by every request it serves (all sessions), per ``cache_salt``:

- ``rules="radix"`` (vLLM / SGLang / our engine): cached = the longest common prefix of the
  prompt's ids but its last with any earlier prompt's ids;
- ``rules="openai"`` (OpenAI's published rules): the longest common prefix with any earlier
  prompt, 0 below 1,024 tokens, else rounded down to 128.

OpenAI does not publish how it renders tool definitions (its harmony format writes them as
TypeScript-like declarations, not JSON); ``compact_tools=True`` renders them as compact JSON,
the size the proxy's block models count them at, so that a check of the caching rules and of
the sharing across conversations does not also measure that unknown.

It answers ``POST /v1/chat/completions`` with that usage (non-streamed) and, when
``tokenize=True``, ``POST /tokenize`` with the ids (vLLM's endpoint shape): as an ASGI app
(:meth:`PrefixEngine.app`, for a real server) or an ``httpx`` handler (:meth:`PrefixEngine.handle`,
for ``httpx.MockTransport``). None of this shares code with the proxy's cache models: it is the
measurement they are checked against (``tests/proxy/test_shared_counterfactual.py``,
``bench/counterfactual_check.py --scripted``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from prefixgate.rewriter.analysis.tokens import _encoder


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def render(body: dict[str, Any], compact_tools: bool = False) -> str:
    """The prompt text of a Chat Completions ``body`` (module docstring); ``compact_tools``:
    tool definitions as compact JSON (no spaces after ``,`` / ``:``) instead of ``tojson``'s."""
    msgs = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    out = []
    i = 0
    while i < len(msgs) and msgs[i].get("role") in ("system", "developer"):
        out.append(f"<|im_start|>system\n{_text(msgs[i].get('content'))}<|im_end|>\n")
        i += 1
    if body.get("tools"):
        seps = (",", ":") if compact_tools else (", ", ": ")
        tools = json.dumps(body["tools"], sort_keys=True, separators=seps)
        out.append(f"<|im_start|>tools\n{tools}<|im_end|>\n")
    for m in msgs[i:]:
        calls = json.dumps(m["tool_calls"], sort_keys=True) if m.get("tool_calls") else ""
        out.append(f"<|im_start|>{m.get('role')}\n{_text(m.get('content'))}{calls}<|im_end|>\n")
    out.append("<|im_start|>assistant\n")
    return "".join(out)


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class PrefixEngine:
    """See module docstring. ``compact_tools``: see :func:`render`; ``log``: ``(prompt_tokens,
    cached_tokens)`` per answered request."""

    rules: str = "radix"
    tokenize: bool = True
    compact_tools: bool = False
    seen: dict[str, list[list[int]]] = field(default_factory=dict)
    log: list[tuple[int, int]] = field(default_factory=list)

    def ids(self, body: dict[str, Any]) -> list[int]:
        enc = _encoder("o200k_base")
        assert enc is not None, "no offline vocabulary"
        return list(enc.encode(render(body, self.compact_tools)))

    def cached(self, ids: list[int], salt: str) -> int:
        """Cached tokens of prompt ``ids`` by the rules, then the prompt is stored."""
        store = self.seen.setdefault(salt, [])
        if self.rules == "radix":
            hit = max((_lcp(ids[:-1], s) for s in store), default=0)
        else:
            m = max((_lcp(ids, s) for s in store), default=0)
            hit = 0 if len(ids) < 1024 or m < 1024 else m // 128 * 128
        store.append(ids)
        return hit

    def answer(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
        """(status, JSON answer) for a POST of ``body`` to ``path``."""
        if path.endswith("/tokenize"):
            if not self.tokenize:
                return 404, None
            ids = self.ids(body)
            return 200, {"tokens": ids, "count": len(ids)}
        ids = self.ids(body)
        cached = self.cached(ids, str(body.get("cache_salt") or ""))
        self.log.append((len(ids), cached))
        usage = {"prompt_tokens": len(ids), "completion_tokens": 1, "total_tokens": len(ids) + 1,
                 "prompt_tokens_details": {"cached_tokens": cached}}
        return 200, {"id": "c1", "object": "chat.completion", "created": 1,
                     "model": body.get("model"), "usage": usage, "choices": [
                         {"index": 0, "finish_reason": "stop",
                          "message": {"role": "assistant", "content": "ok"}}]}

    def handle(self, request: httpx.Request) -> httpx.Response:
        """The engine as an ``httpx.MockTransport`` handler."""
        status, doc = self.answer(request.url.path, json.loads(request.content or b"{}"))
        return httpx.Response(status, json=doc) if doc is not None else httpx.Response(status)

    def app(self) -> Starlette:
        """The engine as an ASGI app (chat completions, tokenize)."""
        async def handle(request: Request) -> Response:
            status, doc = self.answer(request.url.path, json.loads(await request.body()))
            return JSONResponse(doc, status) if doc is not None else Response(status_code=status)

        return Starlette(routes=[Route("/v1/chat/completions", handle, methods=["POST"]),
                                 Route("/tokenize", handle, methods=["POST"])])
