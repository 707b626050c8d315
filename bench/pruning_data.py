"""Loaders for the labelled data the pruning evaluation runs on (read in place, never copied).

- BFCL (PyPI ``bfcl-eval``, optional: ``pip install --no-deps bfcl-eval``): ``live_multiple``
  queries with gold function names from ``possible_answer/``, ``live_irrelevance``, and the pool
  of every BFCL function (unique by name, ~1,850), converted to OpenAI tools (BFCL types
  ``dict -> object``, ``float -> number``, ``tuple -> array``, ``any -> string``).
- ``../shared/data/tools``: tau-bench airline tools, the GitHub MCP server's 117 tools.
- ``../shared/data/traces/tau_bench_airline_gpt4o.json``: 160 GPT-4o airline runs.
- ``../shared/data/rag``: tau2 banking knowledge base + tasks, NQ-open oracle passages.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"

_BFCL_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}


def bfcl_dir() -> Path | None:
    """``bfcl_eval/data`` of the installed ``bfcl-eval`` package, or None when not installed."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(next(iter(spec.submodule_search_locations))) / "data"
    return d if d.is_dir() else None


def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def bfcl_schema(schema: Any) -> Any:
    """BFCL schema -> JSON Schema: rename BFCL-only types, recursively."""
    if isinstance(schema, dict):
        out = {k: bfcl_schema(v) for k, v in schema.items()}
        t = out.get("type")
        if isinstance(t, str) and t in _BFCL_TYPES:
            out["type"] = _BFCL_TYPES[t]
        return out
    if isinstance(schema, list):
        return [bfcl_schema(v) for v in schema]
    return schema


def bfcl_tool(fn: dict[str, Any]) -> dict[str, Any]:
    """One BFCL function -> OpenAI Chat tool ``{"type":"function","function":{...}}``."""
    return {
        "type": "function",
        "function": {
            "name": fn["name"],
            "description": fn.get("description", ""),
            "parameters": bfcl_schema(fn.get("parameters") or {"type": "object", "properties": {}}),
        },
    }


def bfcl_rows(name: str) -> list[dict[str, Any]]:
    """Rows of ``BFCL_v4_<name>.json`` with ``gold`` (list of function names, [] if unknown)."""
    d = bfcl_dir()
    if d is None:
        return []
    answers: dict[str, list[str]] = {}
    ans = d / "possible_answer" / f"BFCL_v4_{name}.json"
    if ans.exists():
        for row in _jsonl(ans):
            answers[row["id"]] = [n for call in row["ground_truth"] for n in call]
    rows = []
    for row in _jsonl(d / f"BFCL_v4_{name}.json"):
        turns = row["question"]
        user = [m["content"] for turn in turns for m in turn if m.get("role") == "user"]
        rows.append(
            {
                "id": row["id"],
                "user": user,
                "tools": [bfcl_tool(f) for f in row.get("function") or []],
                "gold": answers.get(row["id"], []),
            }
        )
    return rows


def bfcl_pool() -> list[dict[str, Any]]:
    """Every BFCL function (single- and multi-function sets), unique by name, first seen wins,
    as OpenAI tools in file-name order. About 1,850 tools."""
    d = bfcl_dir()
    if d is None:
        return []
    pool: dict[str, dict[str, Any]] = {}
    for path in sorted(d.glob("BFCL_v4_*.json")):
        try:
            rows = list(_jsonl(path))
        except json.JSONDecodeError:
            continue
        for row in rows:
            for fn in row.get("function") or []:
                if isinstance(fn, dict) and "name" in fn and fn["name"] not in pool:
                    pool[fn["name"]] = bfcl_tool(fn)
    return list(pool.values())


def github_mcp_tools() -> list[dict[str, Any]]:
    """The GitHub MCP server's 117 tools as OpenAI tools."""
    raw = json.loads((DATA / "tools" / "github_mcp_server.json").read_text())
    return [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description", ""),
                "parameters": t.get("inputSchema") or {"type": "object", "properties": {}},
            },
        }
        for t in raw
    ]


def tau_airline_tools() -> list[dict[str, Any]]:
    """tau-bench airline's 14 OpenAI tools."""
    return list(json.loads((DATA / "tools" / "tau_bench_airline.json").read_text()))


def tau_airline_runs() -> list[dict[str, Any]]:
    """160 runs ``{"task_id", "trial", "traj": [OpenAI messages]}``."""
    return list(json.loads((DATA / "traces" / "tau_bench_airline_gpt4o.json").read_text()))


def banking_docs() -> list[dict[str, str]]:
    """698 documents ``{"id", "title", "content"}``."""
    return list(_jsonl(DATA / "rag" / "tau2_banking_knowledge" / "documents.jsonl"))


def banking_tasks() -> list[dict[str, Any]]:
    """77 tasks ``{"id", "instructions", "required_documents": [doc ids]}``."""
    return list(json.loads((DATA / "rag" / "tau2_banking_knowledge" / "tasks.json").read_text()))


def nq_rows() -> list[dict[str, Any]]:
    """2,655 NQ-open questions ``{"question", "gold": {"title", "text"}}`` (the ``isgold`` ctx)."""
    out = []
    for row in _jsonl(DATA / "rag" / "nq_open_oracle.jsonl.gz"):
        gold = next((c for c in row["ctxs"] if c.get("isgold")), None)
        if gold:
            out.append({"question": row["question"], "gold": {"title": gold["title"], "text": gold["text"]}})
    return out
