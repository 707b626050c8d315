"""Span reuse: what a changed span's CONTENT costs at the same size (why the content gate).

    nice -n 10 .venv/bin/python bench/span_content_probe.py [--out FILE]

One real agent prompt (``tau3`` turn 0 of the answer-stability corpus: a tau-bench airline
request whose system prompt holds ``Conversation ID: <uuid>``, 40 tokens at positions 37..76).
The engine's tree holds a variant of it (its last 6 tokens cut, so the tail is computed), then
the prompt itself + its full-recompute greedy answer is teacher-forced with span reuse and the
content gate OFF (``span_reuse_values_only=False``) and ON. Variants: the ID line deleted
(shift +40), replaced by 40 / 20 / 36 / 44 tokens of the prompt's own policy text (shifts 0,
+20, +4, -4), its first 4 tokens replaced by policy words (shift 0), and its uuid's hex
digits replaced by other hex digits (a value change, shift 0). ``kl``: mean teacher-forced
KL(full recompute || span reuse) over the answer, nats/token.

Writes ``bench/results/span_content_probe.json`` with the command.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.span_bounds import _collect, forced_rows, kl_top1  # noqa: E402
from bench.stability_corpus import DEFAULT_MODEL, corpus  # noqa: E402

OUT = REPO / "bench" / "results" / "span_content_probe.json"


def variants(new: list[int], tok: Any) -> dict[str, list[int]]:
    """The cached variants of ``new`` (ID line at 37..76)."""
    filler = new[200:260]
    line = new[37:77]
    hexed = [t for t in line]
    for i, t in enumerate(line):  # swap each hex digit token for another one of equal length
        piece = tok.convert_ids_to_tokens(t)
        if piece and all(c in "0123456789abcdef" for c in piece):
            other = tok.convert_tokens_to_ids("".join("0123456789abcdef"[(int(c, 16) + 7) % 16]
                                                      for c in piece))
            if isinstance(other, int) and other != tok.unk_token_id:
                hexed[i] = other
    return {
        "line deleted (shift +40)": new[:37] + new[77:],
        "line -> 40 policy tokens (shift 0)": new[:37] + filler[:40] + new[77:],
        "line -> 20 policy tokens (shift +20)": new[:37] + filler[:20] + new[77:],
        "line -> 36 policy tokens (shift +4)": new[:37] + filler[:36] + new[77:],
        "line -> 44 policy tokens (shift -4)": new[:37] + filler[:44] + new[77:],
        "4 tokens -> policy words (shift 0)": new[:37] + filler[:4] + new[41:],
        "uuid hex digits changed (shift 0)": new[:37] + hexed + new[77:],
    }


def main(argv: list[str] | None = None) -> int:
    from prefixgate.local_engine.engine import Engine, EngineConfig
    from prefixgate.local_engine.server.chat import encode_chat

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    cargs = argparse.Namespace(tau_runs=4, turns=1, swe_turns=0, bank_tasks=0, max_tokens=24)
    case = {s[0].session: s for s in corpus(cargs)}["tau3"][0]
    base = {"model_path": str(args.model), "num_kv_slots": 8192, "max_context_len": 4096}
    ref = Engine(EngineConfig(**base, enable_prefix_cache=False))
    engines = {"gate_off": Engine(EngineConfig(**base, span_reuse_values_only=False)),
               "gate_on": Engine(EngineConfig(**base))}
    tok = ref.tokenizer
    new = encode_chat(tok, case.body["messages"], case.body.get("tools"))
    answer, _, _ = _collect(ref, new, max_tokens=24)
    r_rows, _, _ = forced_rows(ref, new, answer)
    rows = []
    for name, old in variants(new, tok).items():
        row: dict[str, Any] = {"variant": name}
        for setting, eng in engines.items():
            assert eng.reset_prefix_cache()
            _collect(eng, old[:-6] + [0], max_tokens=1)
            g_rows, idx, last = forced_rows(eng, new, answer)
            kl, top1, _ = kl_top1(r_rows[idx], g_rows, [answer[i] for i in idx])
            row[setting] = {"span_reused": last.span_reused_tokens, "kl": kl, "top1": top1}
        rows.append(row)
        print(row, flush=True)
    for eng in [ref, *engines.values()]:
        eng.shutdown()
    command = "python " + " ".join(shlex.quote(a) for a in [
        "bench/span_content_probe.py", *(argv if argv is not None else sys.argv[1:])])
    args.out.write_text(json.dumps({"command": command, "prompt_tokens": len(new),
                                    "answer_tokens": len(answer), "rows": rows,
                                    "setup": {"model": args.model.name, "device": "cpu (fp32)"}},
                                   indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
