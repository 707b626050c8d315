"""Which linear layers, when int8, move greedy top-1 most (issue 27): one layer / kind at a time.

    .venv/bin/python bench/int8_sensitivity.py [--prompts 6] [--max-len 250]

SmolLM2-135M-Instruct fp32 vs the same model with only the named products int8
(``quant.Int8Linear``: per-channel int8 weights, per-token int8 activations), teacher-forced:
every position of each prompt (tau-bench conversation prefixes, ``engine_speculative.
agreement_prompts``) is a greedy top-1 comparison, with the mean KL(fp32 ‖ int8) per position.
Rows: all layers int8 (head fp32), the head alone, each kind (q|k|v, o, gate|up, down) over all
layers, each layer's four products; and weight-only error (dequantized int8 / 4-bit group-32
weights, fp32 activations). Writes ``bench/results/int8_sensitivity.json``.
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

from bench.result_file import command, write_json  # noqa: E402

OUT = REPO / "bench" / "results" / "int8_sensitivity.json"
KINDS = {"qkv": 1, "o": 3, "gate_up": 5, "down": 6}


def main() -> None:
    """Measure and write the JSON (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-len", type=int, default=250)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F
    from transformers import AutoTokenizer

    from bench.engine_speculative import MODEL_DIR, agreement_prompts
    from prefixgate.local_engine.model.llama import load_model
    from prefixgate.local_engine.model.quant.int8 import Int8Linear, linear_any
    from prefixgate.local_engine.model.quant.sensitivity import prefill

    torch.set_num_threads(args.threads)
    t0 = time.time()
    model = load_model(str(MODEL_DIR), torch.device("cpu"), torch.float32)
    prompts = agreement_prompts(AutoTokenizer.from_pretrained(str(MODEL_DIR)), args.prompts, args.max_len)
    ref = [prefill(model, p) for p in prompts]
    layers = model.decoder_layers()
    orig = [lyr._w for lyr in layers]

    def set_layers(sel: set[tuple[int, str]], fn: Any = None) -> None:
        for i, lyr in enumerate(layers):
            w = list(orig[i])
            for kind, j in KINDS.items():
                if fn is not None:
                    w[j] = fn(orig[i][j])
                elif (i, kind) in sel:
                    w[j] = Int8Linear(orig[i][j], orig[i][2] if kind == "qkv" else None)
                    if kind == "qkv":
                        w[2] = None
            lyr._w = tuple(w)  # type: ignore[assignment]
            lyr._mm = F.linear if fn is not None else linear_any

    def score() -> dict[str, float]:
        agree = total = 0
        kl = 0.0
        for p, r in zip(prompts, ref):
            g = prefill(model, p)
            agree += int((g.argmax(-1) == r.argmax(-1)).sum())
            total += len(p)
            kl += float(F.kl_div(g.log_softmax(-1), r.log_softmax(-1), log_target=True, reduction="sum"))
        return {"top1_agreement": round(agree / total, 4), "kl_per_token": round(kl / total, 5)}

    def deq8(w: Any) -> Any:
        s = w.abs().amax(1, keepdim=True) / 127
        return torch.round(w / s).clamp(-127, 127) * s

    def deq4(w: Any, g: int = 32) -> Any:
        o, i = w.shape
        wg = w.view(o, i // g, g)
        mn = wg.amin(-1, keepdim=True)
        sc = ((wg.amax(-1, keepdim=True) - mn) / 15).clamp_min(1e-12)
        return (torch.round((wg - mn) / sc).clamp(0, 15) * sc + mn).view(o, i)

    n = len(layers)
    rows: dict[str, Any] = {}
    set_layers({(i, k) for i in range(n) for k in KINDS})
    rows["all_layers_int8_head_fp32"] = score()
    set_layers(set())
    model._head = Int8Linear(model.head_weight(), None)
    rows["head_only_int8"] = score()
    model._head = None
    for kind in KINDS:
        set_layers({(i, kind) for i in range(n)})
        rows[f"kind_{kind}_int8"] = score()
    per_layer = {}
    for i in range(n):
        set_layers({(i, k) for k in KINDS})
        per_layer[str(i)] = score()
    set_layers(set(), deq8)
    rows["weight_only_int8_fp32_activations"] = score()
    set_layers(set(), deq4)
    rows["weight_only_q4_group32_fp32_activations"] = score()
    ranked = sorted(per_layer, key=lambda k: per_layer[k]["top1_agreement"])
    result = {
        "command": command(__file__, prefix=".venv/bin/python"),
        "rows": rows, "per_layer_int8": per_layer, "most_sensitive_layers": ranked[:6],
        "setup": {"model": "SmolLM2-135M-Instruct fp32 (converted from its Q4_1 GGUF)",
                  "prompts": len(prompts), "positions": sum(len(p) for p in prompts),
                  "threads": args.threads, "wall_s": round(time.time() - t0, 1),
                  "note": "teacher-forced: every prompt position compared; box shared with other "
                          "engineers (2 cores, load > 10): timings not recorded, only agreement"},
    }
    write_json(OUT, result)
    print(json.dumps({"rows": rows, "most_sensitive_layers": ranked[:6]}, indent=2))


if __name__ == "__main__":
    main()
