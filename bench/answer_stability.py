"""Answer stability: does prefixgate's rewrite change greedy answers more often than the clock ticking?

    nice -n 10 .venv/bin/python bench/answer_stability.py [--max-tokens 24] [--out FILE]

DESIGN.md, "Meaning at the model level": a rewrite may not change answers more often than the
clock ticking does. Issue 19, item 1: with the hoisted note as a new final user message, 7 of
15 greedy answers were about the time.

Corpus (built from ``../shared/data``, read in place; nothing copied into the repo). Every
request is an OpenAI Chat body; a session's requests are sent in order, one exchange apart, and
the session's clock advances between them by a seeded gap of 6..90 s:

* ``tau_*`` — tau-bench airline runs (``traces/tau_bench_airline_gpt4o.json``, trial 0 of
  ``--tau-runs`` tasks), requests 1..``--turns`` of each run (system + tools + the messages
  before each assistant turn). The policy is cut to :data:`POLICY_CHARS` at a line end, tool
  results to :data:`RESULT_CHARS`; tools: the four the early turns use. The system prompt's
  clock and id are written as agent templates write them, one template per run in turn:
  ``tau_live`` (the policy's own ``The current time is ... EST.`` line showing the request's
  time, and a ``Conversation ID: <uuid>`` constant in the session), ``tau_request_id`` (a header
  ``Current date and time: <ISO 8601>`` / ``Request ID: req_<hex>``, new every request),
  ``tau_constant`` (the trace as recorded: the policy's line, identical on every request).
* ``swe`` — the SWE-agent trajectory (``traces/swe_agent/``, normalised as
  ``tests/trace_requests.py`` does), its first ``--swe-turns`` requests, a ``Current time:
  <RFC 2822>`` / ``Trace ID: <hex>`` header on its system prompt; texts cut as above.
* ``passages_ranked`` / ``passages_unranked`` — tau2 banking knowledge (``rag/``): per task, a
  two-turn session whose system prompt carries a clock line and three documents (the task's
  first two required documents and one other, each cut to :data:`DOC_CHARS`). Ranked: under
  ``Retrieved documents (most relevant first; trust the first one):``, turn 2 re-ranked (the
  first two swapped) — the order carries meaning, so it must be sent as the client sent it.
  Unranked: ``<kb_article id=...>`` elements (an application's own tag name), turn 2 in another
  order — stabilise_passages puts them back in turn 1's order.

Variants of each request, each sent to the local engine (``bench/stability_engine.py``:
``prefixgate.local_engine``, SmolLM2-135M-Instruct, fp32 CPU, in-process, span reuse off, radix
prefix cache shared by all variants; greedy, ``max_tokens`` = ``--max-tokens``; prompts of about
400..1450 tokens, most 600..1200; identical token sequences decoded once, the others of one
request in one continuous batch — their greedy tokens equal one-at-a-time decoding, checked on
16 corpus prompts):

* ``original`` — as the client sent it; controls: ``clock_tick`` — the same body with only the
  clock value advanced (by the gap to the session's next request): the noise floor;
  ``line_removed`` — the system prompt's clock line taken out, no note anywhere
  (:func:`line_removed`): what losing the line costs the model, with nothing added;
* ``<api>/defaults`` — the shipped defaults (``RewriteSettings()``: the passes that move text
  the model reads, ``MOVES_THE_MODEL_READS``, ship ``guarded``, which is off here: the pipeline
  run directly has no meaning-guard verdict, issue 36): the headline figures;
* ``<api>/<placement>`` — the pipeline with those moves switched on (:data:`OPT_IN`;
  ``rewriter.rewrite_request``, provider ``radix``, session memory carried like the proxy) and
  ``hoist_target`` set to each placement, for the
  OpenAI API (the corpus as sent) and for the Anthropic API (the body mapped to Messages by
  prefixgate's own bridge, rewritten, and mapped back for the engine, as the proxy serves an
  Anthropic client from a Chat backend; its original is the same round trip unrewritten);
* the decomposition variants below.

Rules. ``changed``: the completion's text differs from the original's (exact, whitespace at
the ends stripped). Teacher-forced (issue 36; ``bench/teacher_forced.py``): the original's
greedy answer forced after each variant, the next-token distributions at its tokens compared
with the original's own: ``kl_mean`` (mean over requests of each one's mean KL(original ||
variant) over the answer's tokens, nats/token), ``top1_agreement`` (the variant's argmax is the
original's token; mean over requests of each one's share), ``nll_delta`` (the answer's mean
negative log-likelihood per token under the variant minus under the original, nats); each also
``where_hoisted`` (the requests where the variant moved the clock); for the Anthropic variants
the original is its own round trip. ``mentions_note``: the answer matches :data:`NOTE_WORDS` (``note``,
``placeholder``, ``reminder``, ``current time``, ``current values``, ``[see``), or holds this
request's clock value (its time of day ``HH:MM``) or the moved id (its first 8 characters), while
the original answer does not. Goal: ``changed_by_rewrite <= changed_by_clock_tick`` and
``mentions_note == 0``. The default placement of each API (``figures.default_placement``, to be
:data:`prefixgate.config.schema.HOIST_TARGET_BY_API`; ``tests/config/test_hoist_default.py``) is
:func:`winner`: among the placements that keep the prefix reusable (cached share from turn 3 on
within :data:`REUSE_MARGIN` of the API's best — the clock is moved for that), the lowest
``kl_mean`` (issue 36), then the fewest answers mentioning the note, then the fewest changed
answers. Cached shares are those of the engine's
radix rule (common token prefix with the session's previous request, as sent).

Decomposition (rows, and ``figures.where_hoisted``): ``system_edit_only`` — the OpenAI
``reminder`` rewrite without its note (what editing the system prompt alone does);
``other_passes_only`` — the pipeline with ``hoist_volatile`` off (canonicalize_tools,
stabilise_passages alone).

Note search (``figures.note_search``, ``bench/note_search.py``; the OpenAI API; ``--no-search``
skips it): the note of the OpenAI ``end`` rewrite written again at other placements in other
wordings; per candidate its teacher-forced figures over the requests where a note exists,
``changed`` (greedy tokens differ from the original's: some top-1 is not the original's token)
and ``turn3_on_cached_share``; ``chosen``: the lowest ``kl_mean`` among the candidates within
:data:`REUSE_MARGIN` of the best cached share; ``kl_ratio_to_reminder``: its ``kl_mean`` over
the rewriter's ``reminder`` placement's on the same requests (issue 36's goal: at most 0.5).

Writes ``bench/results/answer_stability.json``: ``{"command", "figures": {"requests",
"changed_by_rewrite", "changed_by_clock_tick", "mentions_note", "default_placement": {api:
placement}, "opt_in_moves": {api: figures of its winning placement}, "by_placement":
{"<api>/defaults" | "<api>/<placement>": {"changed_by_rewrite", "mentions_note", "hoisted",
"turn2_cached_share", "turn3_on_cached_share", "kl_mean", "top1_agreement", "nll_delta",
"tf_requests", "tf_missing_positions", "where_hoisted": {...}}}, "controls": {"clock_tick" |
"line_removed" | "system_edit_only" | "other_passes_only": {"changed", "kl_mean", ...}},
"note_search", "by_api", "by_kind", "where_hoisted", "where_not_hoisted", "passages",
"prefix_reuse"}, "setup"}`` (headline figures: the OpenAI API with the shipped defaults;
``where_*`` and ``passages``: the OpenAI winner with the moves on). Cost: the full corpus (101
requests) took 54 min before the teacher-forced figures (``setup.wall_s`` of that run); with
them and the search, 41 requests (``--tau-runs 6 --bank-tasks 3``) took 48 min at load 5-16 on
2 shared cores; ``--tau-runs``, ``--swe-turns``,
``--bank-tasks`` and ``--limit N`` (the first N sessions) take a subset; ``--from-rows`` prints
the figures of rows saved by ``--rows`` (``--write``: into ``--out`` too).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import note_search, teacher_forced  # noqa: E402
from bench.pruning_data import DATA  # noqa: E402
from bench.result_file import command, write_json  # noqa: E402
from bench.stability_corpus import DEFAULT_MODEL, Case, corpus, rewrite_session  # noqa: E402
from bench.stability_engine import Answers, Key  # noqa: E402

OUT = REPO / "bench" / "results" / "answer_stability.json"
PLACEMENTS = {"openai": ("end", "last_user", "system_end", "reminder", "inline"),
              "anthropic": ("end", "last_user", "reminder")}
"""The rewriter's placements measured per API (``inline``: issue 36's note search; a results
file written before it lacks its entry, and :func:`winner` chooses among those measured)."""
NOTE_WORDS = re.compile(r"(?i)\bnotes?\b|placeholder|reminder|current time|current values|\[see")
"""Words of an answer that addresses the hoisted note (module docstring, rule ``mentions_note``)."""


# -- figures ----------------------------------------------------------------------------------


def changed(a: str, b: str) -> bool:
    """Rule ``changed`` (module docstring)."""
    return a.strip() != b.strip()


def mentions(answer: str, case: Case) -> bool:
    """The answer matches the note rule (module docstring) for ``case``'s clock and id."""
    hhmm = re.search(r"\d{1,2}:\d{2}", case.clock)
    return bool(NOTE_WORDS.search(answer) or (hhmm and hhmm.group() in answer)
                or (case.moved_id and case.moved_id[:8] in answer))


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def without_note(body: dict[str, Any], note_turn_added: bool) -> dict[str, Any]:
    """``body`` (a rewritten Chat body) without its hoisted note: the system edit alone."""
    msgs = list(body["messages"])
    if note_turn_added:
        msgs = msgs[:-1]
    else:
        last = dict(msgs[-1])
        if isinstance(last.get("content"), str):
            last["content"] = last["content"].split("\n\n<system-reminder>")[0]
        msgs[-1] = last
    return dict(body, messages=msgs)


def line_removed(body: dict[str, Any], clock: str) -> dict[str, Any]:
    """Control ``line_removed``: ``body`` with the system prompt's lines holding ``clock`` (its
    clock value) taken out, no note anywhere."""
    msgs = [dict(m) for m in body["messages"]]
    for m in msgs:
        if m.get("role") in ("system", "developer") and isinstance(m.get("content"), str):
            m["content"] = "\n".join(x for x in m["content"].split("\n") if clock not in x)
    return dict(body, messages=msgs)


def _tf(fig: dict[str, Any]) -> dict[str, Any]:
    """A row's teacher-forced figures (``bench/teacher_forced.py``), rounded."""
    return {k: (round(fig[k], 7) if isinstance(fig[k], float) else fig[k])
            for k in ("kl_mean", "top1", "nll_delta", "missing")}


def _search(rewrite: tuple[dict[str, Any], dict[str, Any], str]) -> dict[str, dict[str, Any]]:
    """Every note-search candidate's body (``bench/note_search.py``) from a request's OpenAI
    ``end`` rewrite; the rewrite itself for each where nothing was hoisted."""
    _, sent, summary = rewrite
    if "hoist_volatile" not in summary:
        return {n: sent for n in note_search.names()}
    bare, note = note_search.split_note(sent)
    return {n: note_search.candidate(bare, note, n) for n in note_search.names()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every case through the engine; rows with per-variant results and prefix reuse."""
    sessions = corpus(args)
    if args.limit:
        sessions = sessions[:args.limit]
    eng = Answers(args.model, args.max_tokens)
    rows: list[dict[str, Any]] = []
    t0 = time.time()
    for s in sessions:
        rewrites = {f"{api}/defaults": rewrite_session(s, api, "auto") for api in PLACEMENTS}
        rewrites.update({f"{api}/{p}": rewrite_session(s, api, p, **OPT_IN) for api, ps in PLACEMENTS.items()
                         for p in ps})
        others = rewrite_session(s, "openai", "end", **dict(OPT_IN, hoist_volatile=False))
        searched = [_search(r) for r in rewrites["openai/end"]] if args.search else [{} for _ in s]
        prev: dict[str, Key] = {}
        for k, c in enumerate(s):
            base, sent, summary = rewrites["openai/reminder"][k]
            bare = without_note(sent, len(sent["messages"]) > len(base["messages"])) \
                if "hoist_volatile" in summary else sent
            orig = eng.ids(c.body)
            controls = {"clock_tick": eng.ids(c.tick), "line_removed": eng.ids(line_removed(c.body, c.clock)),
                        "system_edit_only": eng.ids(bare), "other_passes_only": eng.ids(others[k][1])}
            keyed = {key: (eng.ids(rs[k][0]), eng.ids(rs[k][1])) for key, rs in rewrites.items()}
            cands = {n: eng.ids(b) for n, b in searched[k].items()}
            pairs = [*((v, orig) for v in controls.values()), *((v, r) for r, v in keyed.values()),
                     *((v, orig) for v in cands.values())]
            tf = eng.request([orig, *(r for r, _ in keyed.values())], pairs,
                             [*controls.values(), *(v for _, v in keyed.values())])
            ctl, var, srch = tf[:4], tf[4:4 + len(keyed)], tf[4 + len(keyed):]
            text = eng.text(orig)
            row: dict[str, Any] = {"session": c.session, "kind": c.kind, "turn": c.turn, "original": text,
                                   "original_mentions": mentions(text, c),
                                   "other_passes_edits": others[k][2], "variants": {}, "reuse": {},
                                   "controls": {n: _tf(f) for n, f in zip(controls, ctl)},
                                   "search": {n: dict(_tf(f), changed=f["top1"] != 1.0)
                                              for n, f in zip(cands, srch) if "hoist_volatile" in
                                              rewrites["openai/end"][k][2]}}
            for n, v in controls.items():
                row[f"{n}_changed"] = changed(text, eng.text(v))
            for (key, rs), f in zip(rewrites.items(), var):
                a_orig, a_sent = (eng.text(x) for x in keyed[key])
                row["variants"][key] = {
                    "changed": changed(a_orig, a_sent), "hoisted": "hoist_volatile" in rs[k][2],
                    "stabilised": "stabilise_passages" in rs[k][2], "edits": rs[k][2],
                    "mentions_note": mentions(a_sent, c) and not mentions(a_orig, c), **_tf(f),
                    **({"answer": a_sent} if changed(a_orig, a_sent) else {})}
            seqs = {"original": orig, **{v: p[1] for v, p in keyed.items()},
                    **{f"search:{n}": v for n, v in cands.items()}}
            for key, ids in seqs.items():
                if key in prev:
                    row["reuse"][key] = [common_prefix(list(prev[key]), list(ids)), len(ids)]
                prev[key] = ids
            rows.append(row)
            print(f"[{time.time() - t0:6.0f}s] {c.session} t{c.turn} {c.kind} "
                  + " ".join(f"{n}:{x['kl_mean']:.4f}" for n, x in row["controls"].items()) + " | "
                  + " ".join(f"{v}:{int(x['changed'])}{'m' if x['mentions_note'] else ''}/{x['kl_mean']:.3f}"
                             for v, x in row["variants"].items()), flush=True)
        if args.rows:  # after every session: a cut-off run keeps its rows (``--from-rows``)
            write_json(args.rows, rows, indent=1)
    eng.shutdown()
    return {"rows": rows, "wall_s": round(time.time() - t0, 1), "prompt_tokens": eng.prompt_tokens}


OPT_IN = {"hoist_volatile": True, "stabilise_passages": True}
"""The passes that move text the model reads (``MOVES_THE_MODEL_READS``, off by default),
switched on for the placement variants."""
REUSE_MARGIN = 0.02
"""A placement keeps the prefix reusable when its cached share from turn 3 on is at most this
far below the API's best (:func:`winner`)."""


def winner(by_placement: dict[str, dict[str, Any]], api: str) -> str:
    """The API's default by measurement (issue 36): among the placements that keep the prefix
    reusable (cached share from turn 3 on within :data:`REUSE_MARGIN` of the best: moving the
    clock is for that), the lowest mean teacher-forced KL over the original's answer
    (``kl_mean``), then the fewest answers mentioning the note, then the fewest changed
    answers (ties: :data:`PLACEMENTS` order)."""
    keys = [f"{api}/{p}" for p in PLACEMENTS[api] if f"{api}/{p}" in by_placement]
    best = max(by_placement[k]["turn3_on_cached_share"] for k in keys)
    kept = [k for k in keys if by_placement[k]["turn3_on_cached_share"] >= best - REUSE_MARGIN]
    return min(kept, key=lambda k: (by_placement[k]["kl_mean"], by_placement[k]["mentions_note"],
                                    by_placement[k]["changed_by_rewrite"], keys.index(k)))


def tf_figures(per_request: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"kl_mean", "top1_agreement", "nll_delta", "tf_requests", "tf_missing_positions"}``:
    the means over requests of the rows' teacher-forced figures (``bench/teacher_forced.py``,
    :func:`~bench.teacher_forced.summary`)."""
    got = teacher_forced.summary(per_request)
    return {"kl_mean": got["kl_mean"], "top1_agreement": got["top1_agreement"],
            "nll_delta": got["nll_delta"], "tf_requests": got["requests"],
            "tf_missing_positions": got["missing_positions"]}


def _share(xs: list[list[int]]) -> float | None:
    return round(sum(x[0] for x in xs) / sum(x[1] for x in xs), 3) if xs else None


def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON figures (module docstring) from :func:`run`'s rows."""
    from prefixgate.config.schema import HOIST_TARGET_BY_API

    keys = list(rows[0]["variants"])

    def count(rs: list[dict[str, Any]], key: str, what: str) -> int:
        return sum(1 for r in rs if r["variants"][key][what])
    def reuse(key: str, turns: Callable[[int], bool]) -> float | None:
        return _share([r["reuse"][key] for r in rows if turns(r["turn"]) and key in r["reuse"]])
    by_placement = {k: {"changed_by_rewrite": count(rows, k, "changed"),
                        "mentions_note": count(rows, k, "mentions_note"),
                        "hoisted": count(rows, k, "hoisted"),
                        "turn2_cached_share": reuse(k, lambda t: t == 1),
                        "turn3_on_cached_share": reuse(k, lambda t: t >= 2),
                        **tf_figures([r["variants"][k] for r in rows]),
                        "where_hoisted": tf_figures([r["variants"][k] for r in rows
                                                     if r["variants"][k]["hoisted"]])} for k in keys}
    tick = sum(1 for r in rows if r["clock_tick_changed"])
    won = {api: winner(by_placement, api) for api in PLACEMENTS}
    by_api = {api: {"winner": won[api], "configured_default": f"{api}/{HOIST_TARGET_BY_API[api]}",
                    **by_placement[won[api]]} for api in PLACEMENTS}
    d = "openai/defaults"
    h = won["openai"]
    by_kind = {kd: {"requests": len(rs), "changed_by_clock_tick": sum(r["clock_tick_changed"] for r in rs),
                    "changed_by_rewrite": count(rs, d, "changed"), "mentions_note": count(rs, d, "mentions_note"),
                    "changed_by_opt_in_moves": count(rs, h, "changed"),
                    "hoisted_by_opt_in_moves": count(rs, h, "hoisted"),
                    "stabilised_by_opt_in_moves": count(rs, h, "stabilised")}
               for kd in sorted({r["kind"] for r in rows}) for rs in [[r for r in rows if r["kind"] == kd]]}
    hoisted = [r for r in rows if r["variants"][h]["hoisted"]]
    ranked = [r for r in rows if r["kind"] == "passages_ranked" and r["turn"] == 1]
    unranked = [r for r in rows if r["kind"] == "passages_unranked" and r["turn"] == 1]
    return {"requests": len(rows), "changed_by_rewrite": by_placement[d]["changed_by_rewrite"],
            "changed_by_clock_tick": tick, "mentions_note": by_placement[d]["mentions_note"],
            "default_placement": {api: won[api].split("/")[1] for api in PLACEMENTS},
            "opt_in_moves": {api: by_placement[won[api]] for api in PLACEMENTS},
            "by_placement": by_placement, "by_api": by_api, "by_kind": by_kind,
            "where_hoisted": {"requests": len(hoisted), "changed_by_rewrite": count(hoisted, h, "changed"),
                              "changed_by_clock_tick": sum(r["clock_tick_changed"] for r in hoisted),
                              "changed_by_system_edit_alone": sum(r["system_edit_only_changed"] for r in hoisted),
                              "changed_by_other_passes_alone": sum(r["other_passes_only_changed"] for r in hoisted)},
            "where_not_hoisted": {"requests": len(rows) - len(hoisted),
                                  "changed_by_rewrite": count([r for r in rows if r not in hoisted], h, "changed"),
                                  "changed_by_clock_tick": sum(r["clock_tick_changed"] for r in rows
                                                               if r not in hoisted)},
            "passages": {"ranked_turn2_reordered": sum(any(v["stabilised"] for v in r["variants"].values())
                                                       for r in ranked),
                         "ranked_turn2_requests": len(ranked),
                         "unranked_turn2_stabilised": count(unranked, h, "stabilised"),
                         "unranked_turn2_requests": len(unranked),
                         "unranked_turn2_changed": count(unranked, h, "changed"),
                         "unranked_turn2_changed_by_stabilise_alone": sum(r["other_passes_only_changed"]
                                                                         for r in unranked)},
            "controls": {n: {"changed": sum(r[f"{n}_changed"] for r in rows),
                             **tf_figures([r["controls"][n] for r in rows]),
                             "where_hoisted": tf_figures([r["controls"][n] for r in rows
                                                          if r["variants"]["openai/end"]["hoisted"]])}
                         for n in rows[0]["controls"]},
            "note_search": note_search.figures(rows, REUSE_MARGIN) if any(r["search"] for r in rows)
            else None,
            "prefix_reuse": {"original": {"turn2_cached_share": reuse("original", lambda t: t == 1),
                                          "turn3_on_cached_share": reuse("original", lambda t: t >= 2)}}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--tau-runs", type=int, default=17)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--swe-turns", type=int, default=5)
    ap.add_argument("--bank-tasks", type=int, default=8)
    ap.add_argument("--limit", type=int, default=0, help="first N sessions only (a smoke run)")
    ap.add_argument("--no-search", dest="search", action="store_false",
                    help="skip the note search (bench/note_search.py)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--rows", type=Path, default=None, help="also write every row here")
    ap.add_argument("--from-rows", type=Path, default=None,
                    help="print the figures of rows written by --rows (no engine run)")
    ap.add_argument("--write", action="store_true", help="with --from-rows: also write --out")
    args = ap.parse_args(argv)
    if args.from_rows:
        figs = figures(json.loads(args.from_rows.read_text()))
        if args.write:
            write_json(args.out, {"command": command(__file__, argv), "figures": figs,
                                  "setup": {"model": args.model.name, "from_rows": True}})
        print(json.dumps(figs, indent=2))
        return 0
    res = run(args)
    figs = figures(res["rows"])
    out = {"command": command(__file__, argv), "figures": figs,
           "setup": {"model": args.model.name, "device": "cpu (fp32)", "greedy": True,
                     "max_tokens": args.max_tokens, "wall_s": res["wall_s"],
                     "prompt_tokens": {"min": min(res["prompt_tokens"]), "max": max(res["prompt_tokens"])},
                     "data": str(DATA.relative_to(REPO.parent)) if DATA.is_relative_to(REPO.parent) else str(DATA),
                     "engine": "prefixgate.local_engine in-process, span reuse off, radix prefix cache shared by "
                                "every variant (references decoded in their own namespace)"}}
    write_json(args.out, out)
    if args.rows:
        write_json(args.rows, res["rows"], indent=1)
    print(json.dumps(figs, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
