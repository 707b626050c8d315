"""Rewrite-pipeline cost per request on real agent traffic (tau-bench airline, 160 runs).

Each run is replayed as a session (memory merged after each request, like the proxy), with the
system prompt's clock advanced per request (the B03 shape), through the OpenAI form (provider
``openai``) and the Anthropic form (provider ``anthropic``, breakpoints placed). Reports
milliseconds per ``rewrite_request`` call (p50 / p95 / max) and how many requests kept a
byte-identical stable prefix (tools + system) within their session.

    .venv/bin/python bench/rewrite_overhead.py [--runs N]
Writes ``bench/results/rewrite_overhead.json`` as ``{"command": ..., "figures": {...}}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.result_file import command, write_json  # noqa: E402
from prefixgate.config.schema import RewriteSettings  # noqa: E402
from prefixgate.proxy.sim.traces import load_tau, openai_body, to_anthropic  # noqa: E402
from prefixgate.rewriter.pipeline import rewrite_request, session_updates  # noqa: E402
from prefixgate.rewriter.types import Context  # noqa: E402

TRACE = REPO.parent / "shared" / "data" / "traces" / "tau_bench_airline_gpt4o.json"
FIXED = "2024-05-15 15:00:00"


def _clocked(messages: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    stamp = f"2024-05-15 15:{k // 60 % 60:02d}:{k % 60:02d}"
    first = dict(messages[0], content=str(messages[0]["content"]).replace(FIXED, stamp))
    return [first, *messages[1:]]


def measure(api: str, runs: int | None) -> dict[str, Any]:
    """Replay the trace in one API form; returns the figures for that form."""
    ms: list[float] = []
    stable_same = stable_total = 0
    for run in load_tau(TRACE, runs=runs):
        memory: dict[str, Any] = {}
        first_hash = ""
        for k, req in enumerate(run.requests):
            msgs = _clocked(req.messages, k)
            body = (openai_body("gpt-4o", run.tools, msgs) if api == "openai"
                    else to_anthropic("claude-sonnet-4-5", run.tools, msgs))
            ctx = Context(RewriteSettings(), model=str(body["model"]), provider=api,
                          session=dict(memory))
            t0 = time.perf_counter()
            result = rewrite_request(body, api, ctx)  # type: ignore[arg-type]
            ms.append((time.perf_counter() - t0) * 1000)
            memory.update(session_updates(result))
            first_hash = first_hash or result.stable_prefix_hash
            stable_total += 1
            stable_same += result.stable_prefix_hash == first_hash
    ms.sort()
    return {"requests": len(ms), "ms_p50": round(statistics.median(ms), 2),
            "ms_p95": round(ms[int(0.95 * (len(ms) - 1))], 2), "ms_max": round(ms[-1], 2),
            "stable_prefix_unchanged_share": round(stable_same / stable_total, 4)}


def main() -> None:
    """Parse ``--runs``, measure both forms, write the JSON result."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=None)
    args = ap.parse_args()
    figures = {api: measure(api, args.runs) for api in ("openai", "anthropic")}
    out = REPO / "bench" / "results" / "rewrite_overhead.json"
    write_json(out, {"command": command(__file__), "figures": figures})
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
