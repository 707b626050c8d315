"""The rewriter's ``inline`` note against the note search's measured rows (issue 36).

    python bench/note_inline_check.py --rows ROWS [the corpus flags of the run that wrote ROWS]

``inline`` (``prefixgate/rewriter/analysis/note_placement.py``) writes the moved lines' values
on one bracketed line, appended to the last message after a user turn, a new user message after
a tool result: per request the same token sequence as the note search's ``in_last/values`` or
``end/values`` candidate (``bench/note_search.py``) of a ``bench/answer_stability.py`` run.
This script rebuilds that run's corpus (same flags, same seed; no engine: the tokenizer only),
rewrites every session with ``hoist_target: inline`` (the moves on) and checks, per request
where a note exists, that its tokens are the matching candidate's; then takes its
teacher-forced figures from the run's rows (``--rows``), its ``turn3_on_cached_share`` from its
own token sequences (the radix rule of ``bench/answer_stability.py``), and its ratio to the
rewriter's ``reminder`` placement over the same requests (issue 36's goal: at most 0.5).

Writes ``bench/results/note_inline_check.json``: ``{"command", "figures": {"requests",
"token_identical", "kl_mean", "top1_agreement", "nll_delta", "changed",
"turn3_on_cached_share", "reminder": {...}, "kl_ratio_to_reminder"}}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import note_search  # noqa: E402
from bench.answer_stability import OPT_IN, common_prefix  # noqa: E402
from bench.result_file import command, write_json  # noqa: E402
from bench.stability_corpus import DEFAULT_MODEL, corpus, rewrite_session  # noqa: E402
from bench.teacher_forced import summary  # noqa: E402

OUT = REPO / "bench" / "results" / "note_inline_check.json"


def check(args: argparse.Namespace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of the module docstring."""
    from transformers import AutoTokenizer

    from prefixgate.local_engine.server.chat import encode_chat

    tok = AutoTokenizer.from_pretrained(str(args.model))

    def ids(body: dict[str, Any]) -> list[int]:
        return list(encode_chat(tok, body["messages"], body.get("tools")))

    sessions = corpus(args)[: args.limit or None]
    figs: list[dict[str, Any]] = []
    same, reuse, k = 0, [], 0
    for s in sessions:
        inline = rewrite_session(s, "openai", "inline", **OPT_IN)
        end = rewrite_session(s, "openai", "end", **OPT_IN)
        prev: list[int] | None = None
        for t, (c, (_, sent, edits), e) in enumerate(zip(s, inline, end)):
            row = rows[k]
            k += 1
            assert (row["session"], row["turn"]) == (c.session, c.turn), "rows of another corpus"
            got = ids(sent)
            if prev is not None and t >= 2:
                reuse.append((common_prefix(prev, got), len(got)))
            prev = got
            if not row["search"]:
                continue
            bare, note = note_search.split_note(e[1])
            name = "in_last/values" if bare["messages"][-1]["role"] == "user" else "end/values"
            same += ids(note_search.candidate(bare, note, name)) == got and "hoist_volatile" in edits
            figs.append(dict(row["search"][name], reminder=row["variants"]["openai/reminder"]))
    mine, ref = summary(figs), summary([f["reminder"] for f in figs])
    share = round(sum(a for a, _ in reuse) / sum(b for _, b in reuse), 3) if reuse else None
    return {"requests": len(figs), "token_identical": same, "kl_mean": mine["kl_mean"],
            "top1_agreement": mine["top1_agreement"], "nll_delta": mine["nll_delta"],
            "changed": sum(1 for f in figs if f["changed"]), "turn3_on_cached_share": share,
            "reminder": {"kl_mean": ref["kl_mean"], "top1_agreement": ref["top1_agreement"],
                         "nll_delta": ref["nll_delta"]},
            "kl_ratio_to_reminder": round(mine["kl_mean"] / ref["kl_mean"], 3)
            if mine["kl_mean"] is not None and ref["kl_mean"] else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=Path, required=True)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--tau-runs", type=int, default=17)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--swe-turns", type=int, default=5)
    ap.add_argument("--bank-tasks", type=int, default=8)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    figs = check(args, json.loads(args.rows.read_text()))
    write_json(args.out, {"command": command(__file__, argv), "figures": figs})
    print(json.dumps(figs, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
