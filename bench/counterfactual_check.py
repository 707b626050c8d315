"""Does the ledger's counterfactual agree with measurement? One tau-bench replay, both sides.

    .venv/bin/python bench/counterfactual_check.py [--max-requests 5] [--runs 1]
        [--model-dir ~/.cache/prefixgate/models/SmolLM2-135M-Instruct]
        [--out bench/results/counterfactual_check.json]
    .venv/bin/python bench/counterfactual_check.py --scripted [--conversations 4] [--turns 8]

Runs ``bench/replay_tau.py`` once (proxy + local engine, rewriting off then on, the first
``--max-requests`` requests of each run, ``--volatile-clock``) keeping its ledger, then reads the
ledger:

* ``measured_unrewritten_cached_share``: over the rewrite-off rows (the client's bodies sent as
  they are), cached tokens / prompt tokens as the engine reported them;
* ``modelled_cached_share``: over the rewrite-on rows, ``cf_cached_tokens`` (what the client's
  original bodies would have cached, :mod:`prefixgate.proxy.observe.insight`) / ``prompt_tokens``.

The two sides replay the same requests, each with its own session and ``cache_salt``, so the
modelled counterfactual of the "on" side should equal the measured share of the "off" side (goal:
within 0.05; issue 9). Writes ``{"command", "figures": {"measured_unrewritten_cached_share",
"modelled_cached_share"}, "detail": {...}}``; shares are 0-1, tokens are tokens.

``--scripted [--conversations 4] [--turns 8]``: the cross-session check instead (issue 19, item
3; goal within 0.02): conversations sharing a system prompt and tools, interleaved, against
scripted engines with one real shared prefix cache (:mod:`bench.counterfactual_interleaved`),
written to ``bench/results/counterfactual_check_interleaved.json`` (same shape). Each run of the
engine replay above has its own ``cache_salt``, so no prefix is shared across its sessions: the
per-session and the shared counterfactual agree there, and its figures do not move.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = Path("~/.cache/prefixgate/models/SmolLM2-135M-Instruct").expanduser()


def ledger_rows(path: Path) -> list[dict[str, Any]]:
    """The ``requests`` rows of a ledger file, oldest first."""
    db = sqlite3.connect(path)
    db.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in db.execute("SELECT * FROM requests ORDER BY id")]
    finally:
        db.close()


def shares(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The two figures and the per-request detail from the ledger ``rows`` of one replay."""
    ok = [r for r in rows if r["status"] == "ok" and r["prompt_tokens"]]
    off = [r for r in ok if not r["rewrite"]]
    on = [r for r in ok if r["rewrite"] and r["cf_cached_tokens"] is not None]
    off_prompt = sum(r["prompt_tokens"] for r in off)
    on_prompt = sum(r["prompt_tokens"] for r in on)
    measured = sum(r["cached_tokens"] or 0 for r in off) / off_prompt if off_prompt else None
    modelled = sum(r["cf_cached_tokens"] for r in on) / on_prompt if on_prompt else None
    sources: dict[str, int] = {}
    for r in on:
        sources[r["cf_source"]] = sources.get(r["cf_source"], 0) + 1
    return {
        "figures": {"measured_unrewritten_cached_share": measured,
                    "modelled_cached_share": modelled},
        "detail": {
            "difference": None if measured is None or modelled is None
            else abs(measured - modelled),
            "off_requests": len(off), "on_requests": len(on),
            "on_cf_source_counts": sources,
            "on_measured_cached_share": sum(r["cached_tokens"] or 0 for r in on) / on_prompt
            if on_prompt else None,
            "pairs": [{"off_prompt_tokens": a["prompt_tokens"], "off_cached_tokens":
                       a["cached_tokens"], "on_prompt_tokens": b["prompt_tokens"],
                       "on_cf_cached_tokens": b["cf_cached_tokens"], "on_cf_source":
                       b["cf_source"], "on_cached_tokens": b["cached_tokens"]}
                      for a, b in zip(off, on)],
        },
    }


def main() -> None:
    """Run the check (see module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-requests", type=int, default=5)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--model-dir", default=str(DEFAULT_MODEL))
    ap.add_argument("--out", default=None)
    ap.add_argument("--scripted", action="store_true",
                    help="interleaved conversations, scripted engines (bench/counterfactual_"
                         "interleaved.py) instead of the local engine replay")
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--turns", type=int, default=8)
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from bench.result_file import command

    if args.scripted:
        from bench.counterfactual_interleaved import run

        doc = {"command": command(__file__), **run(args.conversations, args.turns)}
        _write(doc, Path(args.out or REPO / "bench" / "results" /
                         "counterfactual_check_interleaved.json"))
        return
    tmp = Path(tempfile.mkdtemp(prefix="pg-cfcheck-"))
    replay = [sys.executable, "bench/replay_tau.py", "--runs", str(args.runs),
              "--max-requests", str(args.max_requests), "--model-dir", args.model_dir,
              "--ledger", str(tmp / "ledger.sqlite"), "--out", str(tmp / "replay.json")]
    subprocess.run(replay, cwd=REPO, check=True)
    doc: dict[str, Any] = {"command": command(__file__)}
    doc.update(shares(ledger_rows(tmp / "ledger.sqlite")))
    rep = json.loads((tmp / "replay.json").read_text())
    doc["detail"]["replay_command"] = rep.get("replay_command")
    doc["detail"]["replay_figures"] = rep.get("figures")
    doc["detail"]["setup"] = rep.get("setup")
    _write(doc, Path(args.out or REPO / "bench" / "results" / "counterfactual_check.json"))


def _write(doc: dict[str, Any], out: Path) -> None:
    from bench.result_file import write_json

    write_json(out, doc)
    print(json.dumps({**doc["figures"], "difference": doc["detail"]["difference"]}, indent=2))


if __name__ == "__main__":
    main()
