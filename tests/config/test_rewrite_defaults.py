"""By default nothing the model reads moves (issue 19: "a pass that changes what the model
answers is a defect"; DESIGN.md) until the route's own backend has shown it keeps its answers
(issue 36): the moves ship ``guarded``, which the passes read as off (only the proxy resolves it,
per route), and a session replayed with the defaults reaches the model as the client wrote it
while its clock changes, its request id changes and its retrieval is reordered; the same session
with the moves switched on is rewritten (so the replay below can see a move when there is one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from prefixgate.config.guard_settings import MOVES
from prefixgate.config.schema import MOVES_THE_MODEL_READS, Policy, RewriteSettings, switch_on
from prefixgate.rewriter.pipeline import rewrite_request, session_updates
from prefixgate.rewriter.types import Context

SHIPPED = Path(__file__).resolve().parents[2] / "prefixgate" / "config" / "default_policy.yaml"
STABLE = "You are an airline agent. Follow the policy below exactly.\n" + "Be brief and polite. " * 120


def _system(k: int) -> str:
    docs = [f'<kb_article id="kb{i}" title="Article {i}">\nText of article {i} ' + "about fees. " * 20
            + "\n</kb_article>" for i in range(3)]
    order = [0, 1, 2] if k % 2 == 0 else [2, 0, 1]
    return (f"Current time: 2026-12-01 10:{10 + k:02d}:{7 * k % 60:02d} UTC\nRequest ID: req_{k:04x}ab{k}\n"
            + STABLE + "\nKnowledge base articles:\n" + "\n".join(docs[i] for i in order))


def _session(n: int) -> list[dict[str, Any]]:
    tools = [{"type": "function", "function": {"name": f"t{i}", "parameters": {"type": "object"}}}
             for i in range(3)]
    out = []
    msgs: list[dict[str, Any]] = []
    for k in range(n):
        msgs = [*msgs, {"role": "user", "content": f"question {k}"}]
        out.append({"model": "m", "tools": tools, "messages": [{"role": "system", "content": _system(k)}, *msgs]})
        msgs = [*msgs, {"role": "assistant", "content": f"answer {k}"}]
    return out


def _replay(bodies: list[dict[str, Any]], settings: RewriteSettings) -> list[dict[str, Any]]:
    memory: dict[str, Any] = {}
    sent = []
    for b in bodies:
        r = rewrite_request(b, "openai", Context(settings, model="m", provider="radix", session=dict(memory)))
        memory.update(session_updates(r))
        sent.append(r.body)
    return sent


def test_the_moves_are_guarded_by_default_in_the_schema_and_in_the_shipped_policy() -> None:
    assert MOVES_THE_MODEL_READS == ("hoist_volatile", "stabilise_passages")
    assert set(MOVES_THE_MODEL_READS) < set(MOVES)
    defaults = RewriteSettings()
    shipped = Policy.model_validate(yaml.safe_load(SHIPPED.read_text())).rewrite
    for name in MOVES:
        assert getattr(defaults, name) == "guarded", name
        assert getattr(shipped, name) == "guarded", name
        assert not switch_on(defaults, name) and not switch_on(shipped, name), name
    assert defaults.tool_order == "first_seen" and shipped.tool_order == "first_seen"


def test_with_the_defaults_a_changing_session_reaches_the_model_as_written() -> None:
    bodies = _session(5)
    sent = _replay(bodies, RewriteSettings())
    for b, s in zip(bodies, sent):
        assert json.dumps(s["messages"]) == json.dumps(b["messages"])
        assert json.dumps(s["tools"]) == json.dumps(b["tools"])


def test_with_the_moves_on_the_same_session_is_rewritten() -> None:
    bodies = _session(5)
    moved = _replay(bodies, RewriteSettings(**{name: True for name in MOVES_THE_MODEL_READS}))
    changed = [k for k, (b, s) in enumerate(zip(bodies, moved)) if json.dumps(s) != json.dumps(b)]
    assert len(changed) >= 3  # the clock, the id and the retrieval's order all move
