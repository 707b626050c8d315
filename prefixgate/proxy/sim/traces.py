"""Agent traces as request sequences for ``prefixgate simulate`` (no network).

Supported traces (read in place, never copied):

* tau-bench JSON (``[{"task_id", "trial", "traj": [OpenAI messages], ...}]``): request *k* of a
  run is the run's system prompt + tools (``tools/tau_bench_airline.json`` beside the trace's
  ``traces/`` folder, or ``tools_path``) + ``traj`` up to (excluding) its *k*-th assistant turn;
  that assistant turn is the request's output.
* SWE-agent ``.traj`` (``{"history": [...], "trajectory": [...]}``): one run; tool messages'
  ``tool_call_ids`` lists become one ``tool`` message per id, ``tool_calls`` given as Python
  literals are parsed, extra keys (``agent``, ``thought``, ``action``, ``message_type``) dropped.
  The trajectory carries no tool schemas: each called tool gets an object schema of string
  arguments seen in its calls.

Bodies are produced in the *client's* API: OpenAI Chat as recorded, or Anthropic Messages via
:func:`to_anthropic` (top-level ``system``, ``tool_use`` / ``tool_result`` blocks, consecutive
tool results and a following user text merged into one user turn so roles alternate).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Message = dict[str, Any]


class TraceError(ValueError):
    """The trace file is not a tau-bench JSON list or a SWE-agent ``.traj``."""


@dataclass(frozen=True)
class SimRequest:
    """One request of a run: OpenAI-shaped ``messages`` (system first) and the assistant
    ``output`` message that answered it."""

    messages: list[Message]
    output: Message


@dataclass(frozen=True)
class SimRun:
    """One agent run (a session): ``run_id``, OpenAI ``tools``, requests in order."""

    run_id: str
    tools: list[dict[str, Any]]
    requests: list[SimRequest]


def _requests_of(traj: list[Message]) -> list[SimRequest]:
    return [SimRequest(list(traj[:i]), m) for i, m in enumerate(traj)
            if m.get("role") == "assistant" and i > 0]


def _default_tools_path(trace: Path) -> Path:
    return trace.resolve().parent.parent / "tools" / "tau_bench_airline.json"


def load_tau(trace: Path, tools_path: Path | None = None, runs: int | None = None) -> list[SimRun]:
    """Runs of a tau-bench trace (first ``runs`` of them when given)."""
    data = json.loads(trace.read_text())
    if not isinstance(data, list) or not data or "traj" not in data[0]:
        raise TraceError(f"{trace}: not a tau-bench trace (expected a list of runs with 'traj')")
    tools = json.loads((tools_path or _default_tools_path(trace)).read_text())
    picked = data if runs is None else data[:runs]
    return [SimRun(f"task{r.get('task_id', i)}-trial{r.get('trial', 0)}", tools,
                   _requests_of(r["traj"])) for i, r in enumerate(picked)]


_SWE_KEEP = ("role", "content", "tool_calls", "tool_call_id", "name")


def _swe_message(m: Message) -> list[Message]:
    calls = m.get("tool_calls")
    if isinstance(calls, str):
        calls = ast.literal_eval(calls)
    ids = m.get("tool_call_ids")
    if isinstance(ids, str):
        ids = ast.literal_eval(ids)
    base = {k: m[k] for k in _SWE_KEEP if k in m and k != "tool_calls"}
    if calls:
        base["tool_calls"] = calls
        if m.get("role") == "assistant" and not base.get("content"):
            base["content"] = None
    if m.get("role") == "tool" and isinstance(ids, list):
        return [dict(base, tool_call_id=tid) for tid in ids or [""]]
    return [base]


def swe_tools(messages: list[Message]) -> list[dict[str, Any]]:
    """Minimal function definitions for every tool called in ``messages`` (first-use order)."""
    props: dict[str, dict[str, Any]] = {}
    for m in messages:
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function", {})
            p = props.setdefault(str(fn.get("name", "")), {})
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except ValueError:
                args = {}
            for a in args if isinstance(args, dict) else {}:
                p.setdefault(a, {"type": "string"})
    return [{"type": "function", "function": {"name": n, "description": f"SWE-agent tool {n}",
             "parameters": {"type": "object", "properties": p}}} for n, p in props.items()]


def load_swe(trace: Path) -> list[SimRun]:
    """The single run of a SWE-agent trajectory. Request *k* uses the messages the agent really
    sent at step *k* (``trajectory[k].messages``, after its history processors), so elided old
    observations show up as history edits."""
    data = json.loads(trace.read_text())
    if not isinstance(data, dict) or "history" not in data:
        raise TraceError(f"{trace}: not a SWE-agent .traj (no 'history')")
    history = [x for m in data["history"] for x in _swe_message(m)]
    tools = swe_tools(history)
    steps = data.get("trajectory") or []
    requests: list[SimRequest] = []
    if steps and all("messages" in s for s in steps):
        assistants = [m for m in history if m.get("role") == "assistant"]
        for k, step in enumerate(steps):
            msgs = [x for m in step["messages"] for x in _swe_message(m)]
            out = assistants[k] if k < len(assistants) else {"role": "assistant", "content": ""}
            requests.append(SimRequest(msgs, out))
    else:
        requests = _requests_of(history)
    return [SimRun(trace.stem, tools, requests)]


def load_trace(trace: Path | str, tools_path: Path | str | None = None,
               runs: int | None = None) -> list[SimRun]:
    """Load a tau-bench ``.json`` or SWE-agent ``.traj``; raises :class:`TraceError`."""
    path = Path(trace)
    if not path.exists():
        raise TraceError(f"{path}: no such file")
    if path.suffix == ".traj":
        return load_swe(path)[: runs or None]
    return load_tau(path, Path(tools_path) if tools_path else None, runs)


def openai_body(model: str, tools: list[dict[str, Any]], messages: list[Message]) -> dict[str, Any]:
    """The OpenAI Chat body the client sent."""
    body: dict[str, Any] = {"model": model, "messages": messages}
    if tools:
        body["tools"] = tools
    return body


def _tool_result_block(m: Message) -> dict[str, Any]:
    content = m.get("content")
    return {"type": "tool_result", "tool_use_id": str(m.get("tool_call_id", "")),
            "content": content if isinstance(content, str) else json.dumps(content)}


def _text_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if isinstance(content, list):
        return [{"type": "text", "text": p.get("text", "")} for p in content
                if isinstance(p, dict) and p.get("type") == "text" and p.get("text")]
    return []


def _assistant_blocks(m: Message) -> list[dict[str, Any]]:
    blocks = _text_blocks(m.get("content"))
    for tc in m.get("tool_calls") or []:
        fn = tc.get("function", {})
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            args = {"raw": fn.get("arguments")}
        blocks.append({"type": "tool_use", "id": str(tc.get("id", "")),
                       "name": str(fn.get("name", "")), "input": args})
    return blocks


def to_anthropic(model: str, tools: list[dict[str, Any]], messages: list[Message],
                 max_tokens: int = 1024) -> dict[str, Any]:
    """The same conversation as an Anthropic Messages client would send it.

    Leading system messages → ``system`` (string); ``tool`` messages → ``tool_result`` blocks in
    a user turn; adjacent same-role turns are merged so roles alternate.
    """
    system_parts: list[str] = []
    rest = list(messages)
    while rest and rest[0].get("role") in ("system", "developer"):
        system_parts.append(str(rest.pop(0).get("content") or ""))
    out: list[Message] = []
    for m in rest:
        role = m.get("role")
        if role == "tool":
            role, blocks = "user", [_tool_result_block(m)]
        elif role == "assistant":
            blocks = _assistant_blocks(m)
        else:
            role, blocks = "user", _text_blocks(m.get("content"))
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens}
    if system_parts:
        body["system"] = "\n\n".join(system_parts)
    body["messages"] = out
    if tools:
        body["tools"] = [{"name": t["function"]["name"],
                          "description": t["function"].get("description", ""),
                          "input_schema": t["function"].get("parameters", {"type": "object"})}
                         for t in tools if t.get("type") == "function"]
    return body


def output_text(m: Message) -> str:
    """Text of an assistant output (content + tool-call names/arguments), for output tokens."""
    parts = [m.get("content") or ""] if isinstance(m.get("content"), str) else []
    for tc in m.get("tool_calls") or []:
        fn = tc.get("function", {})
        parts.append(f"{fn.get('name', '')} {fn.get('arguments', '')}")
    return "\n".join(parts)
