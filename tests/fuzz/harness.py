"""The whole proxy in-process, every rewrite pass on, in front of a recording upstream.

:class:`FuzzRig` builds :func:`prefixgate.proxy.app.build_app` with a policy whose every pass is on with
small budgets (so pruning fires on fuzz-sized bodies), a ``:memory:`` ledger, and an
``httpx.MockTransport`` upstream that records each body it receives and answers (see
:mod:`tests.fuzz.answers`) in the backend's API, JSON or SSE. Requests go through
``httpx.ASGITransport``; one event loop serves the rig's whole life (:meth:`FuzzRig.send`).

Routes: ``claude-*`` -> Anthropic backend, ``gpt-4o*`` -> OpenAI backend (provider ``openai``),
anything else -> OpenAI-compatible backend (provider ``radix``). The five paths of the fuzzer:

    ("openai", "gpt-fuzz")       identity  OpenAI client -> OpenAI-compatible backend
    ("openai", "gpt-4o-fuzz")    identity  OpenAI client -> OpenAI backend
    ("anthropic", "claude-fuzz") identity  Anthropic client -> Anthropic backend
    ("anthropic", "gpt-fuzz")    bridge    Anthropic client -> OpenAI-compatible backend
    ("openai", "claude-fuzz")    bridge    OpenAI client -> Anthropic backend
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from tests.fuzz.answers import answer_tool, anthropic_answer, openai_answer

UPSTREAM = "http://upstream.fuzz/v1"
KEY_ENV = "PG_FUZZ_ANTHROPIC_KEY"

REWRITE_ALL_ON: dict[str, Any] = {
    "enabled": True, "canonicalize_tools": True, "tool_schema_sort_properties": True,
    "hoist_volatile": True, "learn_volatility": True, "stabilise_passages": True,  # both opt-in
    "place_breakpoints": True,
    "openai_prompt_cache_key": True, "prune_tools": True, "prune_tools_min_catalog": 4,
    "pinned_tools": ["get_weather"], "prune_history": True,
    "history_high_watermark_tokens": 400, "history_low_watermark_tokens": 200,
    "prune_rag": True, "rag_budget_tokens": 60, "rag_delimiters": ["\n---\n"],
}


def fuzz_policy(**extra: Any) -> Any:
    """The fuzz policy (see module docstring); ``extra``: top-level sections to add (the fan-out
    gate, for the side-path fuzzer)."""
    return parse_policy({
        "backends": {
            "compat": {"kind": "openai_compat", "base_url": UPSTREAM},
            "oai": {"kind": "openai", "base_url": UPSTREAM},
            "anth": {"kind": "anthropic", "base_url": UPSTREAM, "api_key": "${" + KEY_ENV + "}"},
        },
        "routes": [{"match": "claude-*", "backend": "anth"}, {"match": "gpt-4o*", "backend": "oai"},
                   {"match": "*", "backend": "compat"}],
        "rewrite": REWRITE_ALL_ON,
        "ledger": {"path": ":memory:"},
        "default_max_tokens": 0,  # the checkers compare fields sent with fields asked: no cap added
        **extra,
    })


@dataclass
class Recorded:
    """One request the upstream received: ``api`` it was sent to, raw ``body``, ``headers``."""

    api: str
    body: bytes
    headers: dict[str, str]


@dataclass
class Exchange:
    """One fuzz request's outcome: proxy ``status``, response ``headers`` and ``body``, and the
    upstream requests it caused (``sent``)."""

    status: int
    headers: dict[str, str]
    body: bytes
    sent: list[Recorded] = field(default_factory=list)


class RecordingUpstream:
    """An ``httpx.MockTransport`` upstream: records every request (:attr:`seen`) and answers
    in the API its path names, as JSON or, when the body asks for it, as SSE."""

    def __init__(self) -> None:
        self.seen: list[Recorded] = []

    async def handle(self, request: httpx.Request) -> httpx.Response:
        """The transport's handler."""
        raw = await request.aread()
        if request.url.path.endswith("/tokenize"):  # the after-answer counterfactual's side
            return httpx.Response(404)               # call (observe.engine_tokens): not a model call
        path = request.url.path
        if path.endswith("/count_tokens"):
            self.seen.append(Recorded("count_tokens", raw, dict(request.headers)))
            return httpx.Response(200, json={"input_tokens": 7})
        if path.endswith("/responses"):  # a backend that serves the Responses API itself
            self.seen.append(Recorded("responses", raw, dict(request.headers)))
            return responses_answer(raw)
        api = "anthropic" if path.endswith("/messages") else "openai"
        self.seen.append(Recorded(api, raw, dict(request.headers)))
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            body = {}
        stream = isinstance(body, dict) and body.get("stream") is True
        tool = answer_tool(body)
        content, ctype = (anthropic_answer if api == "anthropic" else openai_answer)(stream, tool)
        return httpx.Response(200, content=content, headers={"content-type": ctype})

    def transport(self) -> httpx.MockTransport:
        """A transport for :func:`prefixgate.proxy.app.build_app`."""
        return httpx.MockTransport(self.handle)


def responses_answer(raw: bytes) -> httpx.Response:
    """A Responses API answer (``response`` object, or events ending ``response.completed``)."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        body = {}
    resp = {"id": "resp_up", "object": "response", "status": "completed", "model": "up",
            "output": [{"type": "message", "id": "msg_up", "status": "completed", "role": "assistant",
                        "content": [{"type": "output_text", "text": "ok", "annotations": []}]}],
            "usage": {"input_tokens": 9, "output_tokens": 2, "total_tokens": 11,
                      "input_tokens_details": {"cached_tokens": 0}}}
    if not (isinstance(body, dict) and body.get("stream") is True):
        return httpx.Response(200, json=resp)
    events = [("response.created", {"type": "response.created", "sequence_number": 0,
                                    "response": {**resp, "status": "in_progress", "output": []}}),
              ("response.output_text.delta", {"type": "response.output_text.delta", "sequence_number": 1,
                                              "item_id": "msg_up", "output_index": 0,
                                              "content_index": 0, "delta": "ok"}),
              ("response.completed", {"type": "response.completed", "sequence_number": 2,
                                      "response": resp})]
    text = "".join(f"event: {k}\ndata: {json.dumps(v)}\n\n" for k, v in events)
    return httpx.Response(200, content=text.encode(), headers={"content-type": "text/event-stream"})


def fuzz_app(upstream: RecordingUpstream, ledger: Ledger, **extra: Any) -> Any:
    """The proxy app with the fuzz policy (``extra``: sections to add) in front of ``upstream``."""
    os.environ.setdefault(KEY_ENV, "fuzz-backend-key")
    return build_app(fuzz_policy(**extra), ledger=ledger, transport=upstream.transport())


class FuzzRig:
    """The proxy app and its recording upstream on one private event loop. Use as a context
    manager; :meth:`send` posts one raw body and returns the :class:`Exchange`."""

    def __init__(self, **policy_extra: Any) -> None:
        self.upstream = RecordingUpstream()
        self.seen = self.upstream.seen
        self.ledger = Ledger(":memory:")
        self.app = fuzz_app(self.upstream, self.ledger, **policy_extra)
        self.loop = asyncio.new_event_loop()
        self.stats: Counter[tuple[str, ...]] = Counter()  # what the fuzz test saw, for its report
        self._lifespan: Any = None
        self.client: httpx.AsyncClient | None = None

    def ledger_state(self) -> tuple[int, int | None]:
        """``(rows written, http_status of the newest row)``."""
        db, lock = self.ledger._db, self.ledger._lock  # noqa: SLF001 - a test reading the ledger
        with lock:
            n, = db.execute("SELECT COUNT(*) FROM requests").fetchone()
            last = db.execute("SELECT http_status FROM requests ORDER BY id DESC LIMIT 1").fetchone()
        return int(n), (None if last is None else last[0])

    def __enter__(self) -> FuzzRig:
        self._lifespan = self.app.router.lifespan_context(self.app)
        self.loop.run_until_complete(self._lifespan.__aenter__())
        # raise_app_exceptions=False: an unhandled error is the 500 a client would get
        transport = httpx.ASGITransport(app=self.app, raise_app_exceptions=False)
        self.client = httpx.AsyncClient(transport=transport, base_url="http://proxy.fuzz", timeout=60)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.client is not None
        self.loop.run_until_complete(self.client.aclose())
        self.loop.run_until_complete(self._lifespan.__aexit__(None, None, None))
        self.loop.close()

    def send(self, api: str, raw: bytes, headers: dict[str, Any] | None = None,
             path: str | None = None) -> Exchange:
        """POST ``raw`` to the endpoint of ``api`` (or to ``path``) and return what happened."""
        assert self.client is not None
        path = path or ("/v1/messages" if api == "anthropic" else "/v1/chat/completions")
        hdrs = {"content-type": "application/json", **(headers or {})}
        if api == "anthropic":
            hdrs.setdefault("x-api-key", "client-key")
            hdrs.setdefault("anthropic-version", "2023-06-01")
        else:
            hdrs.setdefault("authorization", "Bearer client-key")
        self.seen.clear()  # only this request's upstream traffic is kept (memory stays flat)
        resp = self.loop.run_until_complete(self.client.post(path, content=raw, headers=hdrs))
        return Exchange(resp.status_code, dict(resp.headers), resp.content, list(self.seen))
