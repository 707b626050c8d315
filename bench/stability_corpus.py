"""The answer-stability corpus (``bench/answer_stability.py``'s module docstring, "Corpus") and
the rewrite of a session as the proxy sends it; shared by the span-reuse benchmarks."""

from __future__ import annotations

import argparse
import importlib
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from pathlib import Path
from typing import Any

from bench.pruning_data import banking_docs, banking_tasks, tau_airline_runs, tau_airline_tools
from tests.trace_requests import SWE_TRACE, normalise_swe_history, swe_tools

DEFAULT_MODEL = Path("~/.cache/prefixgate/models/SmolLM2-135M-Instruct").expanduser()
POLICY_CHARS = 900
RESULT_CHARS = 400
TEXT_CHARS = 700
SWE_CHARS = (240, 240, 700)
"""SWE-agent cuts: tool results, other messages, system prompt (its turns are long)."""
DOC_CHARS = 360
TAU_TOOLS = ("cancel_reservation", "get_reservation_details", "get_user_details",
             "transfer_to_human_agents")
POLICY_CLOCK = "The current time is 2024-05-15 15:00:00 EST."
EST = timezone(timedelta(hours=-5))
START = datetime(2024, 5, 15, 15, 0, 0, tzinfo=EST)


@dataclass
class Case:
    """One request of a session: its body at clock ``t`` and with only the clock advanced."""

    session: str
    kind: str
    turn: int
    body: dict[str, Any]
    tick: dict[str, Any]
    clock: str
    moved_id: str = ""


@dataclass
class Clock:
    """A session's clock: ``render(t)`` writes the template's clock value for a time."""

    render: Callable[[datetime], str]
    rng: random.Random
    fixed: bool = False
    """A template whose clock never moves (``tau_constant``): every request shows START; its
    tick variant still shows START advanced by the gap."""
    t: datetime = START

    def advance(self) -> tuple[datetime, datetime]:
        """``(this request's time, the next request's time)``; moves to the next request."""
        gap = timedelta(seconds=self.rng.randint(6, 90))
        now = self.t
        self.t = now if self.fixed else now + gap
        return now, now + gap


def _cut(text: str, n: int) -> str:
    """``text`` cut to at most ``n`` characters, at a line end when one is in the last third."""
    if len(text) <= n:
        return text
    cut = text.rfind("\n", n * 2 // 3, n)
    return text[: cut if cut > 0 else n].rstrip()


def _msg_cut(m: dict[str, Any], cuts: tuple[int, int, int]) -> dict[str, Any]:
    out = dict(m)
    limit = cuts[0] if m.get("role") == "tool" else cuts[1]
    if isinstance(out.get("content"), str):
        out["content"] = _cut(out["content"], limit)
    return {k: v for k, v in out.items() if k in ("role", "content", "tool_calls", "tool_call_id")}


def _requests(traj: list[dict[str, Any]], turns: int,
              cuts: tuple[int, int, int] = (RESULT_CHARS, TEXT_CHARS, POLICY_CHARS)) -> list[list[dict[str, Any]]]:
    """The messages before each of the first ``turns`` assistant turns (system excluded), cut
    to ``cuts`` (tool results, other messages)."""
    out = []
    for i, m in enumerate(traj):
        if m.get("role") == "assistant" and i > 1:
            out.append([_msg_cut(x, cuts) for x in traj[1:i]])
            if len(out) == turns:
                break
    return out


def _hexid(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


def _uuid(rng: random.Random) -> str:
    h = _hexid(rng, 32)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:]}"


def _session(name: str, kind: str, system: Callable[[str, str], str], clock: Clock,
             turns: list[list[dict[str, Any]]], tools: list[dict[str, Any]] | None,
             max_tokens: int, id_len: int = 0) -> list[Case]:
    """A session's cases: ``system(clock value, request id)`` on top of each turn's messages."""
    cases = []
    for k, msgs in enumerate(turns):
        now, nxt = clock.advance()
        rid = _hexid(clock.rng, id_len) if id_len else ""

        def body(t: datetime, rid: str = rid, msgs: list[dict[str, Any]] = msgs) -> dict[str, Any]:
            b: dict[str, Any] = {"model": "local", "max_tokens": max_tokens, "messages": [
                {"role": "system", "content": system(clock.render(t), rid)}, *msgs]}
            if tools:
                b["tools"] = tools
            return b
        cases.append(Case(name, kind, k, body(now), body(nxt), clock.render(now), rid))
    return cases


def _est(t: datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S EST")


def tau_cases(runs: int, turns: int, max_tokens: int, rng: random.Random) -> list[Case]:
    """The tau-bench sessions (module docstring)."""
    tools = [t for t in tau_airline_tools() if t["function"]["name"] in TAU_TOOLS]
    trials = [r for r in tau_airline_runs() if r["trial"] == 0][:runs]
    out: list[Case] = []
    for n, run in enumerate(trials):
        policy = _cut(run["traj"][0]["content"], POLICY_CHARS)
        kind = ("tau_live", "tau_request_id", "tau_constant")[n % 3]
        conv = _uuid(rng)
        if kind == "tau_live":
            def system(v: str, rid: str, policy: str = policy, conv: str = conv) -> str:
                return policy.replace(POLICY_CLOCK, f"The current time is {v}.\nConversation ID: {conv}")
            render: Callable[[datetime], str] = _est
        elif kind == "tau_request_id":
            def system(v: str, rid: str, policy: str = policy) -> str:
                return (f"Current date and time: {v}\nRequest ID: req_{rid}\n\n"
                        + policy.replace(POLICY_CLOCK + "\n\n", ""))
            render = datetime.isoformat
        else:
            def system(v: str, rid: str, policy: str = policy) -> str:
                return policy.replace(POLICY_CLOCK, f"The current time is {v}.")
            render = _est
        out += _session(f"tau{run['task_id']}", kind, system, Clock(render, rng, kind == "tau_constant"),
                        _requests(run["traj"], turns), tools, max_tokens,
                        id_len=24 if kind == "tau_request_id" else 0)
    return out


def swe_cases(turns: int, max_tokens: int, rng: random.Random) -> list[Case]:
    """The SWE-agent session (module docstring)."""
    history = normalise_swe_history(json.loads(SWE_TRACE.read_text())["history"])
    prompt = _cut(history[0]["content"], SWE_CHARS[2])

    def system(v: str, rid: str) -> str:
        return f"Current time: {v}\nTrace ID: {rid}\n\n{prompt}"
    return _session("swe", "swe", system, Clock(format_datetime, rng), _requests(history, turns, SWE_CHARS),
                    swe_tools(history), max_tokens, id_len=32)


def _opening(task: dict[str, Any]) -> str | None:
    m = re.search(r'Start naturally:\*\*\s*"([^"]+)"', task["instructions"])
    return m.group(1) if m else None


def passage_cases(tasks: int, max_tokens: int, rng: random.Random) -> list[Case]:
    """The two-turn retrieval sessions (module docstring), ranked and unranked per task."""
    docs = {d["id"]: d for d in banking_docs()}
    picked, seen = [], set()
    for task in banking_tasks():
        q = _opening(task)
        req = [d for d in task["required_documents"] if d in docs]
        if len(picked) >= tasks:
            break
        if q and len(req) >= 2 and q[:40] not in seen:
            seen.add(q[:40])
            picked.append((task, q, req[:2]))
    others = sorted(docs)
    out: list[Case] = []
    for task, q, req in picked:
        extra = next(d for d in others[rng.randrange(len(others)):] + others if d not in req)
        chosen = [docs[d] for d in (*req, extra)]
        for kind in ("passages_ranked", "passages_unranked"):
            def system(v: str, rid: str, chosen: list[dict[str, str]] = chosen, kind: str = kind,
                       order: list[int] | None = None) -> str:
                return _bank_system(v, chosen, kind, order or [0, 1, 2])
            t1 = [{"role": "user", "content": q}]
            t2 = [*t1, {"role": "assistant", "content": "Thanks for reaching out. Let me look into that."},
                  {"role": "user", "content": "Could you tell me exactly what I should do next?"}]
            clock = Clock(_est, rng)
            first = _session(f"{task['id']}/{kind}", kind, system, clock, [t1], None, max_tokens)
            second = _session(f"{task['id']}/{kind}", kind,
                              lambda v, rid, s=system: s(v, rid, order=[1, 0, 2]), clock, [t2],
                              None, max_tokens)
            second[0].turn = 1
            out += first + second
    return out


def _bank_system(clock: str, docs: list[dict[str, str]], kind: str, order: list[int]) -> str:
    head = ("You are a Rho-Bank customer support agent. Answer only from the documents below, "
            f"briefly.\nThe current time is {clock}.\n\n")
    if kind == "passages_ranked":
        items = "\n".join(f'<document id="{docs[i]["id"]}">{docs[i]["title"]}\n'
                          f'{_cut(docs[i]["content"], DOC_CHARS)}</document>' for i in order)
        return head + "Retrieved documents (most relevant first; trust the first one):\n" + items
    items = "\n".join(f'<kb_article id="{docs[i]["id"]}" title="{docs[i]["title"]}">\n'
                      f'{_cut(docs[i]["content"], DOC_CHARS)}\n</kb_article>' for i in order)
    return head + "Knowledge base articles:\n" + items


def corpus(args: argparse.Namespace) -> list[list[Case]]:
    """Every session's cases, in session order."""
    rng = random.Random(19)
    cases = (tau_cases(args.tau_runs, args.turns, args.max_tokens, rng)
             + swe_cases(args.swe_turns, args.max_tokens, rng)
             + passage_cases(args.bank_tasks, args.max_tokens, rng))
    sessions: dict[str, list[Case]] = {}
    for c in cases:
        sessions.setdefault(c.session, []).append(c)
    return list(sessions.values())


# -- rewriting --------------------------------------------------------------------------------


def _bridge(names: tuple[str, ...], fn: str) -> Callable[..., dict[str, Any]]:
    """prefixgate's own bridge function ``fn``, wherever the proxy package keeps it."""
    for name in names:
        try:
            return getattr(importlib.import_module(name), fn)  # type: ignore[no-any-return]
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"no bridge {fn} in {names}")


def bridges() -> tuple[Callable[..., dict[str, Any]], Callable[..., dict[str, Any]]]:
    """``(Chat -> Messages, Messages -> Chat)`` request bridges."""
    o2a = _bridge(("prefixgate.proxy.bridges.openai_anthropic_request", "prefixgate.proxy.o2a_request"),
                  "request_to_anthropic")
    a2o = _bridge(("prefixgate.proxy.bridges.anthropic_openai_request", "prefixgate.proxy.a2o_request"),
                  "request_to_openai")
    return o2a, a2o


def rewrite_session(cases: list[Case], api: str, placement: str, **switches: bool
                    ) -> list[tuple[dict[str, Any], dict[str, Any], str]]:
    """Per case ``(original as the engine gets it, rewritten as the engine gets it, edits)``;
    ``switches``: other ``RewriteSettings`` (``hoist_volatile=False``: the other passes alone)."""
    from prefixgate.config.schema import RewriteSettings
    from prefixgate.rewriter.pipeline import rewrite_request, session_updates
    from prefixgate.rewriter.types import Context

    o2a, a2o = bridges()
    memory: dict[str, Any] = {}
    settings = RewriteSettings(hoist_target=placement, **switches)  # type: ignore[arg-type]
    out = []
    for c in cases:
        body = o2a(c.body) if api == "anthropic" else c.body
        r = rewrite_request(body, api, Context(settings, model="local", provider="radix",  # type: ignore[arg-type]
                                               session=memory))
        memory.update(session_updates(r))
        orig, sent = (a2o(body), a2o(r.body)) if api == "anthropic" else (body, r.body)
        out.append((orig, sent, r.summary()))
    return out
