"""Replayable request sequences built from the real traces in ``../shared/data`` (read in place).

Independent of ``rewriter``: every function returns plain wire bodies (dicts), so the proxy,
simulator and rewriter tests can all replay the same requests.

* :func:`tau_requests` — tau-bench airline runs (OpenAI Chat): request *k* of a run is
  ``{"model": "gpt-4o", "messages": traj[:i], "tools": tools}`` for every assistant turn at
  index ``i`` (the prompt whose answer is that assistant turn).
* :func:`swe_requests` — the SWE-agent trajectory, tool messages normalised from
  ``tool_call_ids`` lists to one message per id with ``tool_call_id``.
* :func:`anthropic_fixture_bodies` — the recorded Anthropic tool-runner request bodies.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.paths import DATA, REPO  # noqa: F401  (REPO re-exported for callers)

TAU_TRACE = DATA / "traces" / "tau_bench_airline_gpt4o.json"
TAU_TOOLS = DATA / "tools" / "tau_bench_airline.json"
SWE_TRACE = DATA / "traces" / "swe_agent" / "marshmallow-1867.function_calling.traj"
ANTHROPIC_FIXTURES = DATA / "fixtures" / "anthropic_tool_runner"


def requests_of_run(
    traj: list[dict[str, Any]], tools: list[dict[str, Any]] | None, model: str = "gpt-4o"
) -> list[dict[str, Any]]:
    """One Chat Completions body per assistant turn of ``traj`` (messages before that turn).

    Shape: ``[{"model": model, "messages": [...], "tools": [...]}, ...]`` (``tools`` omitted
    when ``None``). The message dicts are shared with ``traj`` (do not mutate them).
    """
    out: list[dict[str, Any]] = []
    for i, m in enumerate(traj):
        if m.get("role") == "assistant" and i > 0:
            body: dict[str, Any] = {"model": model, "messages": list(traj[:i])}
            if tools is not None:
                body["tools"] = tools
            out.append(body)
    return out


def tau_requests(
    path: Path | str = TAU_TRACE,
    tools_path: Path | str = TAU_TOOLS,
    runs: int | list[int] | None = None,
) -> list[list[dict[str, Any]]]:
    """Per run, the sequence of Chat Completions requests GPT-4o received.

    ``runs``: ``None`` for all 160 runs, an int for the first N, or a list of run indices.
    Returns ``[[body_0, body_1, ...], ...]`` in trace order.
    """
    trace = json.loads(Path(path).read_text())
    tools = json.loads(Path(tools_path).read_text())
    if runs is None:
        idx = list(range(len(trace)))
    elif isinstance(runs, int):
        idx = list(range(min(runs, len(trace))))
    else:
        idx = list(runs)
    return [requests_of_run(trace[i]["traj"], tools) for i in idx]


def normalise_swe_history(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """SWE-agent ``history`` as valid Chat messages.

    A tool message with ``tool_call_ids: [a, b]`` becomes one message per id, with
    ``tool_call_id`` in place of ``tool_call_ids`` (other keys and their order kept).
    """
    out: list[dict[str, Any]] = []
    for m in history:
        ids = m.get("tool_call_ids")
        if m.get("role") == "tool" and isinstance(ids, list):
            for tid in ids or [""]:
                out.append({("tool_call_id" if k == "tool_call_ids" else k):
                            (tid if k == "tool_call_ids" else v) for k, v in m.items()})
        else:
            out.append(m)
    return out


def swe_tools(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Minimal function definitions for every tool the trajectory calls (first-use order).

    The trajectory does not carry its schemas; each tool gets an object schema whose
    properties are the argument names seen in its calls (all strings).
    """
    props: dict[str, dict[str, Any]] = {}
    for m in history:
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function", {})
            name = fn.get("name", "")
            args = json.loads(fn.get("arguments") or "{}")
            p = props.setdefault(name, {})
            for a in args:
                p.setdefault(a, {"type": "string"})
    return [{"type": "function", "function": {"name": n, "description": f"SWE-agent {n}",
             "parameters": {"type": "object", "properties": p}}} for n, p in props.items()]


def swe_requests(path: Path | str = SWE_TRACE, model: str = "gpt-4o") -> list[dict[str, Any]]:
    """Requests of the SWE-agent trajectory (normalised), one per assistant turn."""
    history = normalise_swe_history(json.loads(Path(path).read_text())["history"])
    return requests_of_run(history, swe_tools(history), model=model)


def anthropic_fixture_bodies(folder: Path | str = ANTHROPIC_FIXTURES) -> list[dict[str, Any]]:
    """Every recorded Anthropic ``request.body`` (file order, then exchange order)."""
    bodies: list[dict[str, Any]] = []
    for f in sorted(Path(folder).glob("*.json")):
        for exchange in json.loads(f.read_text()):
            req = exchange.get("request", {})
            if isinstance(req.get("body"), dict):
                bodies.append(req["body"])
    return bodies
