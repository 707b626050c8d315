"""Scripted OpenAI-Chat upstreams for the meaning guard (issue 36, item 3): their answers are
known functions of the request, so whether a move changes them is known too.

Three behaviours (:class:`GuardUpstream`, ``behaviour=``):

- ``unaffected``: the answer is a deterministic function of the request's *content*
  (:func:`content_key`): every message's text with clock / id lines, a hoisted note
  (``<system-reminder>`` blocks, note headers, ``[see note n at the end]`` placeholders) and
  whitespace runs taken out, plus tool calls and the tool catalogue. Where the clock sits does
  not change it; dropping a turn or a tool does.
- ``affected``: the same key plus the first system message's exact text: taking the clock line
  out of the system prompt (``hoist_volatile``) changes the answer (with probability 1 - 1/K,
  K = :data:`N_ANSWERS`).
- ``noisy``: ``unaffected``'s answer, except that each call independently (``random.Random(seed)``,
  one draw per call, even at temperature 0) answers the request's alternative instead with
  probability ``noise`` (0.25; trial and client calls draw from two streams seeded from ``seed``,
  in arrival order): the backend's own nondeterminism, which the guard's floor pair
  (the original sent twice) must absorb.

The answer: one of :data:`N_ANSWERS` canned decisions picked by a SHA-256 of the key — text
answers (differing from their first word, written to at most ``max_tokens`` words) or tau-bench
airline tool calls. Each answer's ``id`` is ``chatcmpl-gu-<n>``, ``n`` the call's index in
:attr:`GuardUpstream.calls`, so a client can tell which call its answer came from.

Usage: ``prompt_tokens`` and ``prompt_tokens_details.cached_tokens`` from a real prefix cache
(:class:`BlockCache`) over the prompt as :func:`bench.prefix_engine.render` writes it,
tokenised with o200k_base, shared by every request the upstream serves: ``rules="openai"``
(OpenAI's published rule: the longest common prefix with an earlier prompt, 0 below 1,024
tokens, else rounded down to 128 — exactly the number of leading 128-token blocks seen before)
or ``rules="radix"`` (vLLM's block cache: leading 16-token blocks seen before, at most all but
the last token).

Calls are classed for reporting only: a *trial* is non-streamed, ``temperature`` 0 and
``max_tokens`` at most ``trial_max_tokens`` (the guard's trial shape; clients of the benchmark
and tests stream or ask for more), or carries an ``x-prefixgate-trial`` header. Each call's
:class:`Call` records that class, the tokens, the answer key and whether the request arrived
hoisted (its first system message holds no clock line while another message does).

Streamed requests get Chat Completions chunks and, with ``stream_options.include_usage``, a
usage chunk, then ``[DONE]``. ``POST /v1/chat/completions`` only (plus ``GET /v1/models``).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from bench.prefix_engine import render
from prefixgate.rewriter.analysis.tokens import _encoder

Behaviour = Literal["unaffected", "affected", "noisy"]
BEHAVIOURS: tuple[Behaviour, ...] = ("unaffected", "affected", "noisy")
N_ANSWERS = 12
"""Canned decisions a key is hashed onto (a changed key keeps its answer with p = 1/12)."""

_REMINDER = re.compile(r"<system-reminder>.*?</system-reminder>", re.S)
_PLACEHOLDER = re.compile(r"\[see note \d+ at the end\]")
_NOTE_HEADER = "(Current values for the placeholders"
_VOLATILE_LINE = re.compile(
    r"(?i)(current (date and )?time|the time is|\b(request|trace|conversation) id\b)")
"""A line that says when or which request it is (a clock statement or an id header; not any
timestamp: tool results carry flight times and creation dates the answer may depend on)."""
_WS = re.compile(r"\s+")

TEXTS = (
    "Certainly, I can help with that reservation. Could you please share your user id first?",
    "Before I change anything, please confirm the reservation number and the passenger names.",
    "I have checked the booking and the flight is eligible for the change you asked about.",
    "Unfortunately this fare cannot be cancelled for a refund under the airline policy terms.",
    "Thank you, the update is complete and a confirmation has been sent to your email address.",
    "Would you like me to search for direct flights or also include one-stop options today?",
)
TOOLS = (
    ("get_user_details", {"user_id": "mia_li_3668"}),
    ("get_reservation_details", {"reservation_id": "NO6JO3"}),
    ("search_direct_flight", {"origin": "JFK", "destination": "SEA", "date": "2024-05-20"}),
    ("cancel_reservation", {"reservation_id": "H9ZU1C"}),
    ("transfer_to_human_agents", {"summary": "User asks for a refund outside the policy."}),
    ("calculate", {"expression": "2 * 150 + 35"}),
)
ANSWERS: tuple[tuple[str, Any], ...] = (*(("text", t) for t in TEXTS),
                                        *(("tool", t) for t in TOOLS))
assert len(ANSWERS) == N_ANSWERS


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def normalise(text: str) -> str:
    """``text`` without what only says *when* (module docstring, ``unaffected``): reminder
    blocks, placeholders, the note's placeholder section, every line holding a clock or a
    request / trace / conversation id; whitespace runs collapsed to one space."""
    text = _PLACEHOLDER.sub("", _REMINDER.sub("", text))
    head, _, _ = text.partition(_NOTE_HEADER)
    lines = [ln for ln in head.splitlines() if not _VOLATILE_LINE.search(ln)]
    return _WS.sub(" ", " ".join(lines)).strip()


def content_key(body: dict[str, Any]) -> str:
    """The request's content with where-the-clock-is taken out (module docstring): one line
    per message that keeps any text or tool call after :func:`normalise` (a note-only message
    vanishes), then the tool catalogue as canonical JSON."""
    parts = []
    for m in body.get("messages") or []:
        if not isinstance(m, dict):
            continue
        text = normalise(_text(m.get("content")))
        calls = json.dumps(m.get("tool_calls"), sort_keys=True) if m.get("tool_calls") else ""
        if text or calls:
            parts.append(f"{m.get('role')}|{text}|{calls}")
    parts.append(json.dumps(body.get("tools") or [], sort_keys=True))
    return "\n".join(parts)


def first_system(body: dict[str, Any]) -> str:
    """The first system / developer message's text ('' when none)."""
    for m in body.get("messages") or []:
        if isinstance(m, dict) and m.get("role") in ("system", "developer"):
            return _text(m.get("content"))
    return ""


def is_hoisted(body: dict[str, Any]) -> bool:
    """The request arrived with its clock moved: the first system message holds no clock / id
    line while a later message does (a note), or it holds a ``[see note n ...]`` placeholder."""
    system = first_system(body)
    if _PLACEHOLDER.search(system):
        return True
    if any(_VOLATILE_LINE.search(ln) for ln in system.splitlines()):
        return False
    msgs = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    return any(m.get("role") not in ("system", "developer")
               and (_REMINDER.search(_text(m.get("content")))
                    or any(_VOLATILE_LINE.search(ln) for ln in _text(m.get("content")).splitlines()))
               for m in msgs)


def pick(key: str, salt: str = "") -> int:
    """Index of the canned answer of ``key`` (SHA-256, uniform over :data:`N_ANSWERS`)."""
    return int.from_bytes(hashlib.sha256((salt + key).encode()).digest()[:8], "big") % N_ANSWERS


def answer_index(body: dict[str, Any], behaviour: Behaviour) -> int:
    """The deterministic answer of ``body`` (no noise): ``unaffected`` / ``noisy`` hash
    :func:`content_key`, ``affected`` also the first system message's exact text."""
    key = content_key(body)
    if behaviour == "affected":
        key = first_system(body) + "\x00" + key
    return pick(key)


def alternative(index: int, key_index: int) -> int:
    """The noisy alternative of answer ``index`` (never ``index`` itself)."""
    return (index + 1 + key_index % (N_ANSWERS - 1)) % N_ANSWERS


class BlockCache:
    """A prefix cache of token blocks (module docstring, Usage): a chained hash per full block
    of ``block`` tokens; cached = the leading blocks seen before x ``block``, 0 below
    ``min_tokens``, at most ``len(ids) - keep_last``. Every prompt's blocks are stored after the
    lookup (no eviction: the benchmark's working set fits)."""

    def __init__(self, block: int, min_tokens: int, keep_last: int) -> None:
        self.block, self.min_tokens, self.keep_last = block, min_tokens, keep_last
        self.seen: set[int] = set()

    @classmethod
    def of(cls, rules: str) -> BlockCache:
        """``openai``: 128-token blocks from 1,024 tokens; ``radix``: vLLM's 16-token blocks,
        the last token always computed."""
        if rules == "openai":
            return cls(128, 1024, 0)
        if rules == "radix":
            return cls(16, 0, 1)
        raise ValueError(f"unknown cache rules {rules!r}")

    def lookup_and_store(self, ids: list[int]) -> int:
        """Cached tokens of the prompt ``ids``; then its blocks are stored."""
        h, hits, matching = 0, 0, True
        for i in range(len(ids) // self.block):
            h = hash((h, tuple(ids[i * self.block:(i + 1) * self.block])))
            if matching and h in self.seen:
                hits += 1
            else:
                matching = False
                self.seen.add(h)
        cached = min(hits * self.block, max(len(ids) - self.keep_last, 0))
        return cached if cached >= self.min_tokens else 0


@dataclass
class Call:
    """One call as the upstream served it (no prompt text kept)."""

    n: int
    trial: bool
    stream: bool
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    answer: int
    noisy: bool
    hoisted: bool


@dataclass
class GuardUpstream:
    """See module docstring. ``trial_max_tokens``: the guard's trial output cap (its
    ``max_tokens`` setting); ``rules``: :meth:`BlockCache.of`."""

    behaviour: Behaviour
    seed: int = 36
    noise: float = 0.25
    rules: str = "openai"
    trial_max_tokens: int = 16
    calls: list[Call] = field(default_factory=list)
    cache: BlockCache = field(init=False)
    rngs: dict[bool, random.Random] = field(init=False)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.behaviour not in BEHAVIOURS:
            raise ValueError(f"unknown behaviour {self.behaviour!r}")
        self.cache = BlockCache.of(self.rules)
        self.rngs = {False: random.Random(self.seed), True: random.Random(self.seed + 1)}

    # -- classification and counts -------------------------------------------------------

    def is_trial(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> bool:
        """The call has the guard's trial shape (module docstring)."""
        if headers and any(k.lower() == "x-prefixgate-trial" for k in headers):
            return True
        cap = body.get("max_tokens", body.get("max_completion_tokens"))
        return (not body.get("stream") and body.get("temperature") == 0
                and isinstance(cap, int) and cap <= self.trial_max_tokens)

    def counts(self) -> dict[str, int]:
        """``{"client_calls", "trial_calls", "trial_prompt_tokens", "trial_completion_tokens",
        "client_prompt_tokens", "client_cached_tokens", "client_hoisted"}``."""
        client = [c for c in self.calls if not c.trial]
        trial = [c for c in self.calls if c.trial]
        return {"client_calls": len(client), "trial_calls": len(trial),
                "trial_prompt_tokens": sum(c.prompt_tokens for c in trial),
                "trial_completion_tokens": sum(c.completion_tokens for c in trial),
                "client_prompt_tokens": sum(c.prompt_tokens for c in client),
                "client_cached_tokens": sum(c.cached_tokens for c in client),
                "client_hoisted": sum(c.hoisted for c in client)}

    def call_of(self, answer_id: str) -> Call | None:
        """The call whose answer carried ``answer_id`` (``chatcmpl-gu-<n>``), else None."""
        m = re.fullmatch(r"chatcmpl-gu-(\d+)", answer_id or "")
        if not m or int(m.group(1)) >= len(self.calls):
            return None
        return self.calls[int(m.group(1))]

    # -- answering ----------------------------------------------------------------------

    def serve(self, body: dict[str, Any], headers: dict[str, str] | None = None
              ) -> tuple[Call, dict[str, Any]]:
        """Answer one Chat Completions ``body``: the call's record and the ``chat.completion``
        JSON (streamed answers are cut from it by :meth:`chunks`)."""
        enc = _encoder("o200k_base")
        assert enc is not None, "no offline o200k_base vocabulary"
        ids = list(enc.encode(render(body, compact_tools=True), disallowed_special=()))
        index = answer_index(body, self.behaviour)
        cap = body.get("max_tokens", body.get("max_completion_tokens"))
        cap = cap if isinstance(cap, int) and cap > 0 else 64
        trial = self.is_trial(body, headers)
        with self.lock:  # one draw per call, in arrival order within its class: trials run
            # one at a time, so a rerun repeats their noise however client calls interleave
            noisy = self.behaviour == "noisy" and self.rngs[trial].random() < self.noise
            cached = self.cache.lookup_and_store(ids)
            n = len(self.calls)
            if noisy:
                index = alternative(index, pick(content_key(body), "alt"))
            kind, value = ANSWERS[index]
            message: dict[str, Any] = {"role": "assistant", "content": None}
            if kind == "text":
                message["content"] = " ".join(str(value).split()[:cap])
                out_tokens = min(cap, len(str(value).split()))
            else:
                name, args = value
                message["tool_calls"] = [{"id": f"call_gu{n}", "type": "function", "function": {
                    "name": name, "arguments": json.dumps(args)}}]
                out_tokens = min(cap, 12)
            call = Call(n, trial, bool(body.get("stream")), len(ids),
                        cached, out_tokens, index, noisy, is_hoisted(body))
            self.calls.append(call)
        usage = {"prompt_tokens": len(ids), "completion_tokens": out_tokens,
                 "total_tokens": len(ids) + out_tokens,
                 "prompt_tokens_details": {"cached_tokens": cached}}
        doc = {"id": f"chatcmpl-gu-{n}", "object": "chat.completion", "created": 1,
               "model": body.get("model"), "usage": usage,
               "choices": [{"index": 0, "message": message, "logprobs": None,
                            "finish_reason": "tool_calls" if kind == "tool" else "stop"}]}
        return call, doc

    @staticmethod
    def chunks(doc: dict[str, Any], include_usage: bool) -> Iterator[bytes]:
        """``doc`` as Chat Completions SSE: a role chunk, the content or tool call, the finish,
        the usage chunk when asked, ``[DONE]``."""
        choice = doc["choices"][0]
        msg = choice["message"]
        base = {"id": doc["id"], "object": "chat.completion.chunk", "created": 1,
                "model": doc["model"]}

        def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
            obj = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            return b"data: " + json.dumps(obj).encode() + b"\n\n"
        yield event({"role": "assistant", "content": ""})
        if msg.get("tool_calls"):
            tc = msg["tool_calls"][0]
            yield event({"tool_calls": [{"index": 0, **tc}]})
        else:
            yield event({"content": msg["content"]})
        yield event({}, choice["finish_reason"])
        if include_usage:
            usage = {**base, "choices": [], "usage": doc["usage"]}
            yield b"data: " + json.dumps(usage).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    def app(self) -> Starlette:
        """The upstream as an ASGI app (serve it with :func:`tests.servers.serve_app`)."""
        async def completions(request: Request) -> Response:
            try:
                body = json.loads(await request.body())
            except ValueError:
                return JSONResponse({"error": {"message": "bad json"}}, 400)
            _, doc = self.serve(body, dict(request.headers))
            if body.get("stream"):
                usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return StreamingResponse(self.chunks(doc, usage), media_type="text/event-stream")
            return JSONResponse(doc)

        async def models(request: Request) -> Response:
            return JSONResponse({"object": "list", "data": [
                {"id": "gpt-4o-mini", "object": "model", "created": 0, "owned_by": "guard"}]})

        return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"]),
                                 Route("/v1/models", models, methods=["GET"])])
