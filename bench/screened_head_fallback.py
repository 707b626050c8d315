"""How often the screened LM head proves its argmax on a real model, and what it gives otherwise.

    .venv/bin/python bench/screened_head_fallback.py [--max-tokens 48] [--threads 2]

SmolLM2-135M-Instruct, fp32 engine on CPU, greedy: 8 tool-call chats and 8 open chats
(``bench/tool_draft_prompts.py``, ``bench/engine_speculative.open_messages``), run 8 at a time,
plain decode and speculative decode (``ngram+suffix+tools``, k = 6: verify steps of up to 7
rows per request). ``screened_head.ScreenedHead`` counts the rows it screened and proved
(``rows``), the rows that got the full head because a step held a row it could not prove
(``full_rows``: a near tie between the best two candidates, module docstring step 5) and the
candidates rescored. The same prompts then run with the argmax head detached (the full head on
every step): the token ids must be equal.

Writes ``bench/results/screened_head_fallback.json`` (``command``, ``figures``, ``setup``).
No timings: a count of steps and rows.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.decode_timing import run_batch, spec_off  # noqa: E402
from bench.engine_speculative import MODEL_DIR, open_messages  # noqa: E402
from bench.result_file import command, load_average, write_json  # noqa: E402

OUT = REPO / "bench" / "results" / "screened_head_fallback.json"


def main() -> None:
    """Run the prompts in both modes with and without the argmax head (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    import torch

    from bench.tool_draft_prompts import FRAME, tool_call_chats
    from prefixgate.local_engine.engine import Engine, EngineConfig
    from prefixgate.local_engine.sched.api_types import SamplingParams
    from prefixgate.local_engine.server.chat import encode_chat

    torch.set_num_threads(args.threads)
    eng = Engine(EngineConfig(model_path=str(MODEL_DIR), num_kv_slots=16384, max_context_len=2048,
                              speculative="ngram+suffix+tools", num_speculative_tokens=6,
                              spec_max_batch_tokens=32))
    tok = eng.tokenizer
    frame = tok.encode(FRAME, add_special_tokens=False)
    prompts = ([encode_chat(tok, m, t) + frame for m, t in tool_call_chats(8)]
               + [encode_chat(tok, m) for m in open_messages(8)])
    greedy = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    head = eng.model._argmax_head
    assert head is not None, "no screened head on this machine (fbgemm / oneDNN missing)"
    figures: dict[str, Any] = {}
    for mode in ("plain", "spec"):
        ids: dict[str, list[list[int]]] = {}
        for name, argmax_head in (("screened", head), ("full", None)):
            eng.model._argmax_head = argmax_head
            before = (head.rows, head.full_rows, head.candidates, head.calls)
            out = []
            for group in (prompts[:8], prompts[8:]):
                if mode == "plain":
                    with spec_off(eng):
                        rows = run_batch(eng, group, greedy, keep_ids=True)
                else:
                    rows = run_batch(eng, group, greedy, keep_ids=True)
                out += [r["ids"] for r in rows]
            ids[name] = out
            if name == "screened":
                rows_, full_, cand_, calls_ = (a - b for a, b in zip(
                    (head.rows, head.full_rows, head.candidates, head.calls), before))
                figures[mode] = {"head_calls": calls_, "rows_proven": rows_,
                                 "rows_full_head": full_,
                                 "full_head_row_share": round(full_ / max(1, rows_ + full_), 4),
                                 "candidates_per_proven_row": round(cand_ / max(1, rows_), 2),
                                 "tokens": sum(len(x) for x in out)}
        figures[mode]["same_ids_as_full_head"] = ids["screened"] == ids["full"]
    eng.shutdown()
    result = {"command": command(__file__),
              "figures": figures,
              "setup": {"model": MODEL_DIR.name, "threads": args.threads,
                        "max_tokens": args.max_tokens, "prompts": "8 tool-call + 8 open, 8 at once",
                        "cpu": platform.processor() or platform.machine(),
                        "load_avg": load_average()}}
    write_json(args.out, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
