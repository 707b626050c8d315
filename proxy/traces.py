"""Rebuild the requests of recorded agent runs, for ``prefixgate replay`` and the simulator.

A tau-bench trace (``../shared/data/traces/tau_bench_airline_gpt4o.json``) is a list of runs, each
``{"task_id", "trial", "traj": [OpenAI chat messages]}``. Request *k* of a run is what the agent
sent to produce its *k*-th assistant turn: the tools
(``../shared/data/tools/tau_bench_airline.json``) and ``traj[:i]`` where ``traj[i]`` is that
assistant message.

The airline system prompt carries a fixed clock line, ``The current time is 2024-05-15 15:00:00
EST.``; :func:`with_wall_clock` replaces it with the time of sending, which is what a real agent
does and what breaks naive prefix caching (case B03).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

CLOCK_RE = re.compile(r"The current time is \d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} [A-Z]{2,4}\.")


def load_runs(trace: Path | str) -> list[dict[str, Any]]:
    """The runs of a trace file (JSON list of ``{"traj": [...], ...}``)."""
    runs = json.loads(Path(trace).read_text())
    if not isinstance(runs, list):
        raise TypeError(f"{trace}: expected a JSON list of runs")
    return runs


def default_tools_path(trace: Path | str) -> Path:
    """``<data>/tools/tau_bench_airline.json`` next to ``<data>/traces/<trace>``."""
    return Path(trace).resolve().parent.parent / "tools" / "tau_bench_airline.json"


def run_requests(traj: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 model: str) -> list[dict[str, Any]]:
    """Chat Completions bodies ``{"model", "messages", "tools"?}``, one per assistant turn.

    Messages are shared with ``traj``; do not mutate them.
    """
    out: list[dict[str, Any]] = []
    for i, m in enumerate(traj):
        if m.get("role") == "assistant" and i > 0:
            body: dict[str, Any] = {"model": model, "messages": list(traj[:i])}
            if tools:
                body["tools"] = tools
            out.append(body)
    return out


def with_wall_clock(body: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """A copy of ``body`` whose system-prompt clock line shows ``now`` (default: the current
    local time, second resolution). Only the first system message is touched."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    msgs = list(body["messages"])
    for i, m in enumerate(msgs):
        if m.get("role") == "system" and isinstance(m.get("content"), str):
            msgs[i] = {**m, "content": CLOCK_RE.sub(f"The current time is {stamp} EST.",
                                                    m["content"], count=1)}
            break
    return {**body, "messages": msgs}
