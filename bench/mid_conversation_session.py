"""A Claude Code-shaped session through prefixgate keeps its cached share (issue 35, item 2).

Claude Code sends a per-turn ``<system-reminder>`` as a ``role: "system"`` message after the
newest user turn (a mid-conversation system message, replaced every turn), its own
``cache_control`` on the newest user block, and at one turn a ``tool_addition`` block. Replayed
into the Anthropic cache model (:mod:`prefixgate.cache.provider_models.anthropic`: breakpoints,
20-block lookback, 5 min TTL) under four strategies: the client's bodies as sent; the same with
every mid-conversation system message folded into the top-level system prompt, as the gateways
of Ollama #18431 / GoModel #713 did (markers moved with it); prefixgate's shipped defaults on the
client's bodies; prefixgate on the bodies without the client's markers.

Writes ``bench/results/mid_conversation_session.json`` (cached share of input tokens per
strategy) with the exact command. Usage: ``python bench/mid_conversation_session.py [--turns 16]``
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from prefixgate.cache.provider_models import make_model
from prefixgate.cache.provider_models.prefix_blocks import flatten, memo_counter
from prefixgate.config.schema import RewriteSettings
from prefixgate.rewriter.analysis.tokens import count_tokens
from prefixgate.rewriter.pipeline import rewrite_request, session_updates
from prefixgate.rewriter.types import Context

OUT = REPO / "bench" / "results" / "mid_conversation_session.json"
MODEL = "claude-sonnet-4-5"
SYSTEM = "You are an agent for software engineering tasks. Follow the repository's rules. " * 100
TOOLS = [{"name": f"tool_{i}", "description": "operates on the repository " * 15,
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
         for i in range(12)]
CC = {"type": "ephemeral"}


def session(turns: int, client_marks: bool) -> list[dict[str, Any]]:
    """The client's bodies, one per turn (module docstring)."""
    msgs: list[dict[str, Any]] = []
    out = []
    for k in range(turns):
        user: dict[str, Any] = {"role": "user", "content": [
            {"type": "text", "text": f"Step {k}: edit the module and run its tests. " * 12}]}
        if k == turns // 3:
            user["content"].append({"type": "tool_addition", "tool": {
                "name": "run_benchmarks", "input_schema": {"type": "object"}}})
        msgs = [*msgs, user]
        sent = json.loads(json.dumps(msgs))
        if client_marks:
            sent[-1]["content"][0]["cache_control"] = dict(CC)
        reminder = {"role": "system", "content": f"<system-reminder>Todo list: {k} open items; "
                                                 f"cwd /repo; turn {k}</system-reminder>"}
        out.append({"model": MODEL, "max_tokens": 512, "system": SYSTEM, "tools": TOOLS,
                    "messages": [*sent, reminder]})
        msgs = [*msgs, {"role": "assistant", "content": [
            {"type": "text", "text": f"Done with step {k}. " + "Edited and tested. " * 30}]}]
    return out


def fold(body: dict[str, Any]) -> dict[str, Any]:
    """What the gateways in Ollama #18431 / GoModel #713 did: every system message in
    ``messages`` appended to the top-level system prompt."""
    b = json.loads(json.dumps(body))
    extra = [m["content"] for m in b["messages"] if m.get("role") == "system"]
    b["messages"] = [m for m in b["messages"] if m.get("role") != "system"]
    b["system"] = b["system"] + "\n" + "\n".join(extra)
    return b


def cached_share(bodies: list[dict[str, Any]], strategy: str) -> float:
    """Cached share of input tokens over the session under ``strategy``."""
    count = memo_counter(count_tokens)
    model = make_model("anthropic", count)
    memory: dict[str, Any] = {}
    total = cached = 0
    for t, body in enumerate(bodies):
        now = 30.0 * t
        if strategy == "fold":
            sent = fold(body)
        elif strategy.startswith("prefixgate"):
            r = rewrite_request(body, "anthropic", Context(
                RewriteSettings(), model=MODEL, provider="anthropic", session_id="cc",
                session=dict(memory), now_s=now))
            memory.update(session_updates(r))
            sent = r.body
        else:
            sent = body
        o = model.process(sent, now, flatten(sent, "anthropic", count))
        total += o.input_tokens
        cached += o.cached_read_tokens
    return round(cached / total, 4) if total else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=16)
    args = ap.parse_args()
    marked, bare = session(args.turns, True), session(args.turns, False)
    figures = {"as_sent": cached_share(marked, "as_sent"),
               "folded_into_system": cached_share(marked, "fold"),
               "prefixgate": cached_share(marked, "prefixgate"),
               "prefixgate_no_client_markers": cached_share(bare, "prefixgate")}
    OUT.write_text(json.dumps({"command": f"python bench/mid_conversation_session.py --turns "
                                          f"{args.turns}", "turns": args.turns,
                               "figures": figures}, indent=2) + "\n")
    print(figures)


if __name__ == "__main__":
    main()
