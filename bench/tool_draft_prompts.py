"""Tool-call prompts for the speculative benchmark (issue 27): tau-bench airline conversations
cut before an assistant turn that calls a tool, rendered with the tools it uses (Hermes block)
and its earlier calls as history, the answer opened with the ``<tool_call>`` frame.

Only the tools a conversation calls (at most ``max_tools``) are declared, so prompts stay under
~1.5k tokens on a shared 2-core box; the schemas are the catalog's
(``shared/data/tools/tau_bench_airline.json``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
FRAME = "<tool_call>\n"


def tool_call_chats(n: int, max_tools: int = 4, max_msgs: int = 8) -> list[tuple[list[dict[str, Any]],
                                                                                list[dict[str, Any]]]]:
    """``n`` (messages, tools) pairs, each ending before an assistant turn with ``tool_calls``
    that follows at least one earlier call (so earlier calls' values can be drafted)."""
    catalog = {t["function"]["name"]: t for t in json.loads((DATA / "tools" / "tau_bench_airline.json").read_text())}
    trace = json.loads((DATA / "traces" / "tau_bench_airline_gpt4o.json").read_text())
    out = []
    for run in trace:
        msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are an airline agent. Call tools "
                                       "with the exact ids the customer gave."}]
        calls_seen = 0
        for m in run["traj"][1:]:
            if m["role"] == "assistant" and m.get("tool_calls") and calls_seen >= 1:
                names = [c["function"]["name"] for c in m["tool_calls"]]
                used = {c["function"]["name"] for mm in msgs for c in mm.get("tool_calls") or []}
                tools = [catalog[x] for x in dict.fromkeys(names + sorted(used)) if x in catalog][:max_tools]
                out.append(([msgs[0], *msgs[1:][-max_msgs:]], tools))
                break
            entry: dict[str, Any] = {"role": m["role"], "content": str(m.get("content") or "")[:500]}
            if m.get("tool_calls"):
                entry["tool_calls"] = m["tool_calls"]
                calls_seen += 1
            if m["role"] == "tool":
                entry["tool_call_id"] = m.get("tool_call_id", "")
            msgs.append(entry)
        if len(out) >= n:
            break
    return out
