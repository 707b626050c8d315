"""Differential fuzzer for mid-conversation forms (issue 35, item 2): 0 moved or merged.

:data:`FORM_BODIES` seeded Messages bodies (10,000 by default; ``PREFIXGATE_FUZZ_BODIES`` lowers
it), in :data:`SHARDS` tests over disjoint seeds. Each is a realistic body of
:func:`tests.fuzz.gen_anthropic.anthropic_body` (a valid one: the hostile bodies are the differential fuzzer's) with one to four forms put in: a system message
between turns, ``tool_addition`` / ``tool_removal`` blocks and an unknown future block in user
turns, a ``tool_reference`` nested in a ``tool_result``, a ``defer_loading`` tool. Every message
carries a marker, and every form its own.

Each body is rewritten with every pass on (the differential fuzzer's policy, moves included) for
the Anthropic cache rules, then bridged to Chat Completions. Checked, independently of
:mod:`prefixgate.rewriter.wire.forms`: the markers reach the upstream as a subsequence of the
client's order (a turn may be pruned, nothing moves); every form's marker arrives exactly once; a
system form arrives as its own system message, equal to the client's but for ``cache_control``
(never merged into a neighbour or the head), a block form as the client's block; no breakpoint on a
trailing system message. The bridge carries a system form as a Chat system message in place, or
refuses with a 400 naming a field.
"""

from __future__ import annotations

import json
import os
import random
import re
from typing import Any

import pytest

from prefixgate.config.schema import RewriteSettings
from prefixgate.proxy.bridges.anthropic_openai_request import request_to_openai
from prefixgate.proxy.core.errors import ProxyError
from prefixgate.rewriter.pipeline import rewrite_request
from prefixgate.rewriter.types import Context
from tests.fuzz.gen_anthropic import anthropic_body
from tests.fuzz.harness import REWRITE_ALL_ON
from tests.fuzz.jsontext import dumps as fuzz_dumps

FORM_BODIES = int(os.environ.get("PREFIXGATE_FUZZ_BODIES", "10000"))
SHARDS = 4
PER_SHARD = max(1, FORM_BODIES // SHARDS)
MODEL = "claude-sonnet-4-5"
SETTINGS = RewriteSettings.model_validate(REWRITE_ALL_ON)
MARK = re.compile(r"\u27e6[TF][a-z]+\u27e7")


def _tag(k: int) -> str:
    s = ""
    k += 1
    while k:
        k, d = divmod(k - 1, 26)
        s = chr(97 + d) + s
    return s


def _mark(kind: str, k: int) -> str:
    return f"\u27e6{kind}{_tag(k)}\u27e7"


def _strip_cc(v: Any) -> Any:
    """``v`` without ``cache_control`` markers, a message's string content as its one text
    block (the planner marks a string content by turning it into that block: the same text)."""
    if isinstance(v, dict) and isinstance(v.get("content"), str) and "role" in v:
        v = {**v, "content": [{"type": "text", "text": v["content"]}]}
    if isinstance(v, dict):
        return {k: _strip_cc(x) for k, x in v.items() if k != "cache_control"}
    if isinstance(v, list):
        return [_strip_cc(x) for x in v]
    return v


def _mark_turns(msgs: list[dict[str, Any]]) -> None:
    for i, m in enumerate(msgs):
        c = m.get("content")
        t = _mark("T", i)
        if isinstance(c, str):
            m["content"] = c + " " + t
        elif isinstance(c, list) and m.get("role") == "assistant":
            m["content"] = [{"type": "text", "text": t}, *c]
        elif isinstance(c, list):
            m["content"] = [*c, {"type": "text", "text": t}]


def _with_forms(r: random.Random, body: dict[str, Any]) -> list[str]:
    """Put one to four forms into ``body`` (in place); returns the forms' markers."""
    msgs = body["messages"]
    _mark_turns(msgs)
    made: list[str] = []
    for _ in range(r.randint(1, 4)):
        f = _mark("F", len(made))
        roll = r.randrange(5)
        users = [m for m in msgs if m.get("role") == "user" and isinstance(m.get("content"), list)]
        if roll == 0 or not users:  # a system message after a user turn, or at the end
            spots = [i + 1 for i, m in enumerate(msgs) if m.get("role") == "user"] or [len(msgs)]
            content: Any = f"Policy update {f}: " + r.choice(("be brief.", "answer in French."))
            if r.random() < 0.5:
                content = [{"type": "text", "text": content}]
            msgs.insert(r.choice(spots), {"role": "system", "content": content})
        elif roll in (1, 2):
            kind = ("tool_addition", "tool_removal")[roll - 1]
            r.choice(users)["content"].append(
                {"type": kind, "tool": {"name": f"late_{len(made)}", "description": f,
                                        "input_schema": {"type": "object"}}})
        elif roll == 3:
            r.choice(users)["content"].append({"type": "future_block_v9", "note": f})
        else:
            results = [b for m in users for b in m["content"]
                       if isinstance(b, dict) and b.get("type") == "tool_result"]
            if not results:
                r.choice(users)["content"].append({"type": "future_block_v9", "note": f})
            else:
                b = r.choice(results)
                inner = b.get("content")
                inner = [{"type": "text", "text": inner}] if isinstance(inner, str) else list(
                    inner or [])
                b["content"] = [*inner, {"type": "tool_reference", "tool_name": f}]
        made.append(f)
    if body.get("tools") and r.random() < 0.5:
        r.choice(body["tools"])["defer_loading"] = True
    return made


def _markers(msgs: list[Any]) -> list[tuple[str, int]]:
    """``(marker, index of the message it is in)`` in document order."""
    out = []
    for i, m in enumerate(msgs):
        out += [(x, i) for x in MARK.findall(json.dumps(m, ensure_ascii=False))]
    return out


def _is_subsequence(xs: list[str], ys: list[str]) -> bool:
    it = iter(ys)
    return all(x in it for x in xs)


def _form_of(msgs: list[Any], f: str) -> Any:
    """The client's form holding marker ``f``: a whole system message, or one block."""
    for m in msgs:
        if m.get("role") == "system" and f in json.dumps(m, ensure_ascii=False):
            return m
        for b in m.get("content") if isinstance(m.get("content"), list) else ():
            if isinstance(b, dict) and f in json.dumps(b, ensure_ascii=False):
                if b.get("type") == "tool_result":
                    return next(x for x in b["content"] if f in json.dumps(x, ensure_ascii=False))
                return b
    raise AssertionError(f"{f} not found")


def check_body(seed: int) -> list[str]:
    """Problems of seed ``seed`` (empty when every form stayed in place)."""
    r = random.Random(seed)
    body, valid = anthropic_body(r, MODEL)
    while not valid:  # the hostile ones test other rules (tests/fuzz/test_differential.py)
        body, valid = anthropic_body(r, MODEL)
    body = json.loads(fuzz_dumps(body))  # plain JSON values (the generator's exact numbers)
    made = _with_forms(r, body)
    sent = rewrite_request(json.loads(json.dumps(body)), "anthropic",
                           Context(SETTINGS, model=MODEL, provider="anthropic",
                                   session_id=f"s{seed}")).body
    problems: list[str] = []
    client, upstream = _markers(body["messages"]), _markers(sent.get("messages") or [])
    if not _is_subsequence([x for x, _ in upstream], [x for x, _ in client]):
        problems.append("moved: markers out of the client's order")
    for f in made:
        where = [i for x, i in upstream if x == f]
        if len(where) != 1:
            problems.append(f"{f}: arrived {len(where)} times")
            continue
        want, got = _form_of(body["messages"], f), _form_of(sent["messages"], f)
        if _strip_cc(want) != _strip_cc(got):
            problems.append(f"{f}: merged or edited")
    last = (sent.get("messages") or [{}])[-1]
    if last.get("role") == "system" and "cache_control" in json.dumps(last):
        problems.append("breakpoint on a trailing system message")
    try:
        chat = request_to_openai(sent)
    except ProxyError as e:
        if not e.param:
            problems.append(f"bridge refused without naming a field: {e}")
        return [f"seed={seed}: {p}" for p in problems]
    bridged = _markers(chat["messages"])
    if not _is_subsequence([x for x, _ in bridged], [x for x, _ in client]):
        problems.append("bridge moved a marker")
    for f in made:
        msgs = [chat["messages"][i] for x, i in bridged if x == f]
        if len(msgs) != 1 or (isinstance(_form_of(body["messages"], f), dict)
                              and _form_of(body["messages"], f).get("role") == "system"
                              and msgs[0]["role"] != "system"):
            problems.append(f"{f}: bridge merged or re-roled it")
    return [f"seed={seed}: {p}" for p in problems]


@pytest.mark.parametrize("shard", range(SHARDS))
def test_no_mid_conversation_form_is_moved_or_merged(shard: int) -> None:
    """PER_SHARD seeded bodies with forms, every pass on, then the A->O bridge: 0 problems."""
    problems: list[str] = []
    for seed in range(shard * PER_SHARD, (shard + 1) * PER_SHARD):
        problems += check_body(seed)
    assert not problems, "\n".join(problems[:20])
