"""What a turn's rewrite costs with and without the stable-region memo (issue 25).

    python bench/rewrite_incremental.py [--runs 8] [--rounds 3]
        [--out bench/results/rewrite_incremental.json]

In process: the first ``--runs`` tau-bench airline runs (``../shared/data``, read in place) are
replayed turn by turn as the proxy rewrites them — the shipped passes, the proxy's token memo,
session memory merged after each turn, each body parsed from its compact wire bytes — once with
a fresh :class:`prefixgate.rewriter.region_memo.RegionMemo` shared by the runs (what the proxy
keeps) and once without. Every turn's result is checked byte for byte against the other's
(body, Edits, stable prefix hash): a difference stops the benchmark. Figures: ms per turn
(parse + passes + render), the median over ``--rounds`` interleaved rounds with min / max, and
the memo's hits / misses / bytes after the last round.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.result_file import command, write_json  # noqa: E402
from prefixgate.config.schema import RewriteSettings  # noqa: E402
from prefixgate.proxy.core import exactjson  # noqa: E402
from prefixgate.proxy.sim.traces import load_tau, openai_body  # noqa: E402
from prefixgate.rewriter.analysis.tokens import count_tokens  # noqa: E402
from prefixgate.rewriter.pipeline import rewrite_request, session_updates  # noqa: E402
from prefixgate.rewriter.region_memo import RegionMemo  # noqa: E402
from prefixgate.rewriter.token_memo import TokenMemo  # noqa: E402
from prefixgate.rewriter.types import Context  # noqa: E402

DATA = Path(os.environ.get("PREFIXGATE_DATA_DIR") or REPO.parent / "shared" / "data")
TRACE = DATA / "traces" / "tau_bench_airline_gpt4o.json"


def sessions(runs: int) -> list[list[bytes]]:
    """Each run's requests as compact wire bytes, in turn order."""
    return [[exactjson.dumps(openai_body("gpt-4o", run.tools, r.messages)) for r in run.requests]
            for run in load_tau(TRACE, runs=runs)]


def replay(runs: list[list[bytes]], memo: RegionMemo | None, counter: Any
           ) -> tuple[float, list[Any]]:
    """(seconds spent rewriting, every turn's result view) for all runs."""
    spent, views = 0.0, []
    settings = RewriteSettings()
    for k, run in enumerate(runs):
        memory: dict[str, Any] = {}
        for turn, raw in enumerate(run):
            t0 = time.perf_counter()
            body = exactjson.loads(raw)
            ctx = Context(settings=settings, model="gpt-4o", provider="openai",
                          session_id=f"s{k}", session=MappingProxyType(dict(memory)),
                          now_s=1_800_000_000.0 + 30 * turn, count_tokens=counter, memo=memo)
            res = rewrite_request(body, "openai", ctx)
            spent += time.perf_counter() - t0
            memory.update(session_updates(res))
            views.append((exactjson.dumps(res.body), res.edits, res.stable_prefix_hash))
    return spent, views


def main() -> None:
    """Run and write the JSON (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" /
                                          "rewrite_incremental.json"))
    args = ap.parse_args()
    runs = sessions(args.runs)
    turns = sum(len(r) for r in runs)
    counter = TokenMemo(count_tokens)
    replay(runs, None, counter)  # warm: encodings loaded, token memo filled (both ways alike)
    memo = RegionMemo()
    per: dict[str, list[float]] = {"full_ms_per_turn": [], "memo_ms_per_turn": []}
    for _ in range(args.rounds):
        full_s, full = replay(runs, None, counter)
        memo_s, kept = replay(runs, memo, counter)
        if kept != full:
            raise SystemExit("the memo changed a rewrite: results differ")
        per["full_ms_per_turn"].append(full_s / turns * 1e3)
        per["memo_ms_per_turn"].append(memo_s / turns * 1e3)
    fig = {k: {"median": round(sorted(v)[len(v) // 2], 3), "min": round(min(v), 3),
               "max": round(max(v), 3)} for k, v in per.items()}
    doc = {"command": command(__file__, prefix="nice -n 5 python"),
           "figures": fig,
           "speedup": round(fig["full_ms_per_turn"]["median"]
                            / fig["memo_ms_per_turn"]["median"], 1),
           "byte_identical": True,
           "memo": {"hits": memo.hits, "misses": memo.misses, "bytes": memo.bytes,
                    "entries": len(memo)},
           "setup": {"runs": args.runs, "turns": turns, "rounds": args.rounds,
                     "body_bytes_median": sorted(len(b) for r in runs for b in r)[turns // 2],
                     "passes": "shipped defaults (RewriteSettings()), provider openai",
                     "machine": f"{os.cpu_count()} CPUs shared with other jobs; in process"}}
    write_json(args.out, doc)
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
