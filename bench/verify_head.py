"""Batch-8 verify cost with the screened LM head (issue 27): TPOT with and without speculation.

    .venv/bin/python bench/verify_head.py [--rounds 2] [--max-tokens 48] [--threads 2]

One fp32 engine (``ngram+suffix+tools`` drafter) on SmolLM2-135M-Instruct; two head modes on the
same engine — ``full`` (oneDNN fp32 head over every logits row, ``model._argmax_head`` detached)
and ``screened`` (``screened_head.ScreenedHead``: int8 screen + exact rescoring of candidates;
greedy steps only). Each mode gets its own step-cost curve (``knee``, spec off) for the
drafting policy (``interleaved_knee``). Prompts: 8 tool-call chats (``bench/tool_draft_prompts.py``, answer opened
with ``<tool_call>``) and 8 open chats, run 8 at a time, greedy. Rounds are interleaved
(round r: every head mode × {speculative, plain}, the order rotated by round) because the box is
shared; per-round TPOT ratios are reported with their spread. Token ids of every run are
compared: the four combinations must give the same outputs.

Results go into ``bench/results/engine_speculative.json`` (``figures.verify_b8`` /
``details.verify_b8``; the rest of the file kept).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.decode_timing import mean_tpot, run_batch, spec_figures, spec_off  # noqa: E402
from bench.engine_speculative import MODEL_DIR, OUT, goals, open_messages  # noqa: E402
from bench.result_file import command, utc_now, write_json  # noqa: E402


def interleaved_knee(eng: Any, heads: dict[str, Any], prompts: list[list[int]], sizes: list[int],
                     reps: int) -> dict[str, dict[int, float]]:
    """Decode step ms per rows per step for each head mode (spec off): the fastest of ``reps``
    runs, head modes alternating run by run (load on the shared box only ever adds time)."""
    from prefixgate.local_engine.sched.api_types import SamplingParams

    p = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    out: dict[str, dict[int, float]] = {h: {} for h in heads}
    for b in sizes:
        for _ in range(reps):
            for name, head in heads.items():
                eng.model._argmax_head = head
                t = eng._timing
                s0, n0 = t["decode_s"], t["decode_tokens"]
                eng.generate_batch([prompts[i % len(prompts)][: 40 + i] for i in range(b)], p)
                ms = (t["decode_s"] - s0) / ((t["decode_tokens"] - n0) / b) * 1000
                out[name][b] = round(min(out[name].get(b, float("inf")), ms), 2)
    return out


def main() -> None:
    """Measure and merge into the speculative benchmark's JSON (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--k", type=int, default=6)
    ap.add_argument("--note", default="")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    import torch

    from bench.tool_draft_prompts import FRAME, tool_call_chats
    from prefixgate.local_engine.engine import Engine, EngineConfig
    from prefixgate.local_engine.sched.api_types import SamplingParams
    from prefixgate.local_engine.server.chat import encode_chat

    torch.set_num_threads(args.threads)
    t0 = time.time()
    eng = Engine(EngineConfig(model_path=str(MODEL_DIR), num_kv_slots=16384, max_context_len=2048,
                              speculative="ngram+suffix+tools", num_speculative_tokens=args.k,
                              spec_max_batch_tokens=32))
    assert eng.spec is not None
    tok = eng.tokenizer
    frame = tok.encode(FRAME, add_special_tokens=False)
    sets = {"tool": [encode_chat(tok, m, t) + frame for m, t in tool_call_chats(8)],
            "open": [encode_chat(tok, m) for m in open_messages(8)]}
    screened = eng.model._argmax_head
    heads = {"full": None, "screened": screened}
    with spec_off(eng):
        eng.generate_batch([sets["open"][0][:30]], SamplingParams(max_tokens=4, temperature=0.0))
        knees = interleaved_knee(eng, heads, sets["tool"] + sets["open"], [1, 8, 16, 24, 32], 3)
    curves = {name: sorted(k.items()) for name, k in knees.items()}
    greedy = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    runs: list[dict[str, Any]] = []
    outputs: dict[str, dict[str, list[list[int]]]] = {s: {} for s in sets}
    combos = [(h, m) for h in heads for m in ("spec", "plain")]
    for r in range(args.rounds):
        order = combos[r % len(combos):] + combos[:r % len(combos)]
        for set_name, prompts in sets.items():
            for head_name, mode in order:
                eng.model._argmax_head = heads[head_name]
                eng.spec.cost_curve = curves[head_name]
                before = eng.stats()
                if mode == "spec":
                    rows = run_batch(eng, prompts, greedy, keep_ids=True)
                    st = spec_figures(eng, before)
                else:
                    with spec_off(eng):
                        rows = run_batch(eng, prompts, greedy, keep_ids=True)
                    st = {}
                outputs[set_name].setdefault(f"{head_name}_{mode}", []).append(
                    [x for row in rows for x in row["ids"]])
                runs.append({"round": r, "prompts": set_name, "head": head_name, "mode": mode,
                             "tpot_ms": round(mean_tpot(rows) * 1000, 2),
                             "mean_accepted_len": st.get("mean_accepted_len"),
                             "tokens": sum(row["tokens"] for row in rows)})
    screened_stats = {"rows": screened.rows, "candidates_per_row": round(
        screened.candidates / max(1, screened.rows), 2),
        "full_head_rows": screened.full_rows} if screened is not None else None
    eng.shutdown()
    ratios: dict[str, Any] = {}
    for set_name in sets:
        for head_name in heads:
            per = []
            for r in range(args.rounds):
                tp = {x["mode"]: x["tpot_ms"] for x in runs if x["round"] == r
                      and x["prompts"] == set_name and x["head"] == head_name}
                per.append(round(tp["plain"] / tp["spec"], 3))
            ratios[f"{set_name}_{head_name}"] = {"per_round": per,
                                                 "median": sorted(per)[len(per) // 2],
                                                 "min": min(per), "max": max(per)}
    identical = all(len({json.dumps(v) for vs in outs.values() for v in vs}) == 1
                    for outs in outputs.values())
    figures = {"tool_tpot_ratio_b8_screened": ratios["tool_screened"]["median"],
               "tool_tpot_ratio_b8_full_head": ratios["tool_full"]["median"],
               "open_tpot_ratio_b8_screened": ratios["open_screened"]["median"],
               "open_tpot_ratio_b8_full_head": ratios["open_full"]["median"],
               "identical_outputs": identical}
    details = {"ratios_plain_over_spec": ratios, "runs": runs, "knee": knees,
               "screened_head": screened_stats, "max_tokens": args.max_tokens}
    out = Path(args.out)
    result = json.loads(out.read_text())
    result["figures"]["verify_b8"], result["details"]["verify_b8"] = figures, details
    result["goals"] = goals(result["figures"])
    result["setup"].setdefault("partial_runs", []).append({
        "command": command(__file__, prefix=".venv/bin/python"),
        "sections": ["verify_b8"], "wall_s": round(time.time() - t0, 1),
        "at": utc_now(), "note": args.note})
    write_json(out, result)
    print(json.dumps({"figures": figures, "ratios": ratios, "screened_head": screened_stats}, indent=2))


if __name__ == "__main__":
    main()
