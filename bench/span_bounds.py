"""Span reuse bounds: which gate settings keep teacher-forced answers at the clock-tick floor.

    nice -n 10 .venv/bin/python bench/span_bounds.py [--limit N] [--max-tokens 24] [--out FILE]

Chooses ``EngineConfig.span_reuse_*`` defaults by measurement (issue 33). Corpus: the
answer-stability sessions (``bench/answer_stability.corpus``: tau-bench airline turns, the
SWE-agent turns, the tau2 banking sessions, each with a live clock and / or a per-request id;
``../shared/data`` read in place), sent in session order, as an agent would: request k+1 finds
request k (prompt + answer) in the engine's radix tree.

Per request (SmolLM2-135M-Instruct, fp32 CPU, in-process):

* reference (an engine with no prefix cache: every prompt prefilled in full): the greedy answer
  ``a`` (``--max-tokens``), then prompt + ``a`` teacher-forced with ``prompt_logprobs`` over the
  answer positions; and the same for the clock-tick variant of the body (the floor:
  ``kl_clock_tick``);
* each setting under test (one engine each, the prefix cache reset between sessions unless
  ``--keep-tree``): prompt +
  ``a`` teacher-forced — its answer positions are in the fresh tail, the rest from the tree
  (prefix match, and with span reuse the re-aligned runs). ``kl``: mean over the answer
  positions of KL(reference || setting) in nats/token; ``top1``: the share of positions whose
  argmax is the reference's next answer token (all of them: greedy decoding gives ``a``
  exactly, ``greedy_identical``); ``cached`` / ``span_reused`` / ``prompt``: tokens. Answer
  positions the setting took from the cache (a branch that already holds this answer, e.g.
  another session's identical first turn) have no row: the figures use the rows it computed
  (``answer_rows``).

Writes ``bench/results/span_bounds.json``: ``{"command", "figures": {setting: {"requests",
"cached_share", "span_reused_share", "kl_mean", "kl_max", "greedy_identical_share",
"prefill_tokens"}}, "kl_clock_tick_mean", "rows"}``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.stability_corpus import DEFAULT_MODEL, corpus  # noqa: E402

OUT = REPO / "bench" / "results" / "span_bounds.json"
SETTINGS: dict[str, dict[str, Any]] = {
    "prefix_only": {"span_reuse": False},
    "default": {},
    "any_content": {"span_reuse_values_only": False},
    "span16": {"span_reuse_max_span_tokens": 16},
    "anchor8": {"span_reuse_min_anchor_tokens": 8},
    "anchor32": {"span_reuse_min_anchor_tokens": 32},
    "spans1": {"span_reuse_max_spans": 1},
    "span256": {"span_reuse_max_span_tokens": 256},
}


def _collect(eng: Any, ids: list[int], **kw: Any) -> Any:
    """Run one request to completion on ``eng``; returns (tokens, first output, last output)."""
    import asyncio

    from prefixgate.local_engine.engine import SamplingParams

    async def go() -> tuple[list[int], Any, Any]:
        outs = [o async for o in eng.generate(ids, SamplingParams(temperature=0.0, **kw))]
        return [t for o in outs for t in o.new_token_ids], outs[0], outs[-1]

    return asyncio.run(go())


def forced_rows(eng: Any, prompt: list[int], answer: list[int]) -> tuple[Any, list[int], Any]:
    """Teacher-forced log-prob rows predicting ``answer`` after ``prompt``: ``(rows [k, V], the
    answer indices they predict, the last output)``; an answer position whose K/V came from
    the cache (a cached branch holding the same answer) has no row."""
    import torch

    ids = prompt + answer
    start = len(prompt) - 1
    _, first, last = _collect(eng, ids, max_tokens=1, ignore_eos=True, prompt_logprobs=True,
                              prompt_logprobs_start=start)
    pl = first.prompt_logprobs
    got = [(i, pl.row(start + i)) for i in range(len(answer))] if pl is not None else []
    got = [(i, r) for i, r in got if r is not None]
    rows = torch.stack([r for _, r in got]) if got else torch.empty(0)
    return rows, [i for i, _ in got], last


def kl_top1(ref: Any, got: Any, answer: list[int]) -> tuple[float, float, bool]:
    """Mean KL(ref || got) nats/token over the rows ``got`` has (``ref`` already cut to them),
    top-1 agreement with the answer tokens they predict, all of them agree (no row: 0, 1, True)."""
    import torch

    if got.numel() == 0:
        return 0.0, 1.0, True
    kl = (ref.exp() * (ref - got)).sum(-1)
    agree = got.argmax(-1) == torch.tensor(answer)
    return float(kl.mean()), float(agree.float().mean()), bool(agree.all())


def run(args: argparse.Namespace) -> dict[str, Any]:
    from prefixgate.local_engine.engine import Engine, EngineConfig
    from prefixgate.local_engine.server.chat import encode_chat

    sessions = corpus(args)
    if args.sessions:
        keep = args.sessions.split(",")
        sessions = [s for s in sessions if s[0].session in keep]
    sessions = sessions[: args.limit or None]
    base = {"model_path": str(args.model), "num_kv_slots": 8192, "max_context_len": 4096}
    ref = Engine(EngineConfig(**base, enable_prefix_cache=False))
    names = args.settings.split(",")
    engines = {n: Engine(EngineConfig(**base, **SETTINGS[n])) for n in names}
    tok = ref.tokenizer
    rows: list[dict[str, Any]] = []
    t0 = time.time()
    for s in sessions:
        for eng in engines.values():
            assert args.keep_tree or eng.reset_prefix_cache()
        for c in s:
            ids = encode_chat(tok, c.body["messages"], c.body.get("tools"))
            tick = encode_chat(tok, c.tick["messages"], c.tick.get("tools"))
            answer, _, _ = _collect(ref, ids, max_tokens=args.max_tokens)
            r_rows, _, _ = forced_rows(ref, ids, answer)
            t_rows, _, _ = forced_rows(ref, tick, answer)
            row: dict[str, Any] = {"session": c.session, "kind": c.kind, "turn": c.turn,
                                   "prompt": len(ids), "answer": len(answer),
                                   "kl_clock_tick": kl_top1(r_rows, t_rows, answer)[0]}
            for n, eng in engines.items():
                t1 = time.perf_counter()
                g_rows, idx, last = forced_rows(eng, ids, answer)
                kl, top1, same = kl_top1(r_rows[idx], g_rows, [answer[i] for i in idx])
                row[n] = {"kl": kl, "top1": top1, "greedy_identical": same,
                          "answer_rows": len(idx),
                          "cached": last.cached_tokens, "span_reused": last.span_reused_tokens,
                          "wall_s": round(time.perf_counter() - t1, 3)}
            rows.append(row)
            print(f"[{time.time() - t0:5.0f}s] {c.session} t{c.turn} p={len(ids)} tick={row['kl_clock_tick']:.1e} "
                  + " ".join(f"{n}:{row[n]['cached']}/{row[n]['span_reused']} kl={row[n]['kl']:.1e}"
                             for n in engines), flush=True)
    for eng in [ref, *engines.values()]:
        eng.shutdown()
    return {"rows": rows, "settings": names}


def figures(rows: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Per setting: cached and span-reused shares (turns >= 2), KL mean / max, greedy identity."""
    later = [r for r in rows if r["turn"] > 1] or rows
    prompt = sum(r["prompt"] + r["answer"] for r in later)
    out: dict[str, Any] = {}
    for n in names:
        out[n] = {
            "requests": len(rows),
            "cached_share_turn2_on": round(sum(r[n]["cached"] for r in later) / prompt, 4),
            "span_reused_share_turn2_on": round(sum(r[n]["span_reused"] for r in later) / prompt, 4),
            "prefill_tokens_turn2_on": sum(r["prompt"] + r["answer"] - r[n]["cached"] for r in later),
            "kl_mean": sum(r[n]["kl"] for r in rows) / len(rows),
            "kl_max": max(r[n]["kl"] for r in rows),
            "greedy_identical_share": sum(r[n]["greedy_identical"] for r in rows) / len(rows),
        }
    return {"by_setting": out,
            "kl_clock_tick_mean": sum(r["kl_clock_tick"] for r in rows) / len(rows),
            "kl_clock_tick_max": max(r["kl_clock_tick"] for r in rows)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--tau-runs", type=int, default=17)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--swe-turns", type=int, default=5)
    ap.add_argument("--bank-tasks", type=int, default=8)
    ap.add_argument("--limit", type=int, default=0, help="first N sessions only")
    ap.add_argument("--sessions", default="", help="comma-separated session names (default: all)")
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated SETTINGS keys")
    ap.add_argument("--keep-tree", action="store_true",
                    help="keep the prefix cache across sessions (a session's first request may "
                         "reuse another session's K/V, under another template)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    t0 = time.time()
    res = run(args)
    command = "python " + " ".join(shlex.quote(a) for a in [
        "bench/span_bounds.py", *(argv if argv is not None else sys.argv[1:])])
    figs = figures(res["rows"], res["settings"])
    out = {"command": command, "figures": figs, "settings": {n: SETTINGS[n] for n in res["settings"]},
           "setup": {"model": args.model.name, "device": "cpu (fp32)", "max_tokens": args.max_tokens,
                     "wall_s": round(time.time() - t0, 1)},
           "rows": res["rows"]}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(figs, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
