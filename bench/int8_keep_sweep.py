"""Which products to keep in fp32 so int8 keeps greedy answers (issue 27): agreement per policy.

    .venv/bin/python bench/int8_keep_sweep.py [--prompts 60] [--max-len 500] [--configs JSON]

SmolLM2-135M-Instruct fp32 against ``quant.quantize_model`` under each keep policy (kept decoder
layers, kinds kept in every layer, outlier channels; the LM head always kept), on the int8
benchmark's prompts (``engine_speculative.agreement_prompts``: tau-bench conversation prefixes
ending before an assistant turn, last ``--max-len`` tokens). Per policy: ``first_token_agreement``
(greedy top-1 of the last position equal to fp32's, the figure ``engine_speculative.py``
reports), ``teacher_forced_agreement`` (every position of every prompt), the disagreeing
prompts, and the weight bytes read per decode token (int8 products 1 byte a weight, kept ones
4; the head's int8 screen counted as int8). Writes ``bench/results/int8_keep_sweep.json``.
Agreement does not depend on the box's load; no timings here (decode speed:
``engine_speculative.py --only int8``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.result_file import command, load_average, utc_now, write_json  # noqa: E402

OUT = REPO / "bench" / "results" / "int8_keep_sweep.json"
DEFAULT_CONFIGS = [
    {"layers": "edge:2", "outliers": 24},
    {"layers": "edge:2", "outliers": 64},
    {"layers": "edge:4", "outliers": 24},
    {"layers": "edge:6", "outliers": 24},
    {"layers": "edge:2", "kinds": ["qkv"], "outliers": 24},
    {"layers": [0, 8, 9, 18, 28, 29], "outliers": 24},
]


def main() -> None:
    """Measure and write the JSON (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=60)
    ap.add_argument("--max-len", type=int, default=500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", default="", help="JSON list of policies (default: the sweep)")
    ap.add_argument("--append", action="store_true", help="add rows to the existing JSON")
    args = ap.parse_args()
    import torch
    from transformers import AutoTokenizer

    from bench.engine_speculative import MODEL_DIR, agreement_prompts
    from prefixgate.local_engine.model.llama import load_model
    from prefixgate.local_engine.model.quant import cpu_linear
    from prefixgate.local_engine.model.quant.int8 import KINDS, quantize_model
    from prefixgate.local_engine.model.quant.sensitivity import agreement, edge_layers, prefill

    torch.set_num_threads(args.threads)
    configs = json.loads(args.configs) if args.configs else DEFAULT_CONFIGS
    t0 = time.time()
    prompts = agreement_prompts(AutoTokenizer.from_pretrained(str(MODEL_DIR)), args.prompts, args.max_len)

    def fp32() -> Any:
        return load_model(str(MODEL_DIR), torch.device("cpu"), torch.float32)

    def tops(model: Any) -> list[Any]:
        return [prefill(model, p).argmax(-1) for p in prompts]

    ref_model = fp32()
    sizes = {k: w.numel() for k, w in zip(KINDS, (ref_model.decoder_layers()[0]._w[i] for i in (1, 3, 5, 6)))}
    cpu_linear.pack_model(ref_model)  # the fp32 engine's products (oneDNN pre-packed)
    cache = Path(tempfile.gettempdir()) / f"int8_keep_sweep_ref_{args.prompts}_{args.max_len}.pt"
    if cache.exists():  # the fp32 side of an earlier invocation (same prompts)
        ref_top, margins = torch.load(cache)
    else:
        ref_top, margins = [], []
        for p in prompts:  # keep argmaxes only: a prompt's logits are ~100 MB
            logits = prefill(ref_model, p)
            ref_top.append(logits.argmax(-1))
            top2 = logits[-1].topk(2).values
            margins.append(round(float(top2[0] - top2[1]), 3))
        torch.save((ref_top, margins), cache)
    n_layers = len(ref_model.decoder_layers())
    head = ref_model.head_weight().numel()
    del ref_model
    rows: list[dict[str, Any]] = []
    old = json.loads(OUT.read_text()) if args.append and OUT.exists() else {"rows": [], "runs": []}

    def write() -> None:  # after every policy: a long sweep cut short keeps what it measured
        result = {
            "rows": old["rows"] + rows,
            "runs": old["runs"] + [{"command": command(__file__, prefix=".venv/bin/python"),
                                    "at": utc_now(),
                                    "wall_s": round(time.time() - t0, 1), "loadavg": load_average()}],
            "setup": {**old.get("setup", {}), "model": "SmolLM2-135M-Instruct fp32 (converted from its Q4_1 GGUF)",
                      "prompts": len(prompts), "positions": sum(len(p) for p in prompts),
                      f"fp32_top1_minus_top2_logit_at_last_position_{len(prompts)}_prompts": margins,
                      "int8_mb_all_layers_plus_head": round((sum(sizes.values()) * n_layers + head) / 1e6, 1),
                      "fp32_mb": round(4 * (sum(sizes.values()) * n_layers + head) / 1e6, 1)},
        }
        write_json(OUT, result)

    for cfg in configs:
        spec = cfg["layers"]
        layers = edge_layers(n_layers, int(spec.split(":")[1])) if isinstance(spec, str) else list(spec)
        kinds = tuple(cfg.get("kinds", ()))
        t1 = time.time()
        model = quantize_model(fp32(), "int8", layers, True, int(cfg["outliers"]), kinds)
        got = tops(model)
        kept = sum(sizes[k] for k in KINDS for i in range(n_layers) if i in layers or k in kinds)
        total = sum(sizes.values()) * n_layers
        rows.append({"policy": {"layers": layers, "kinds": list(kinds), "outliers": cfg["outliers"]},
                     "prompts": len(prompts), "max_len": args.max_len,
                     **agreement(ref_top, got),
                     "weight_mb_per_token": round((total - kept + 4 * kept + head) / 1e6, 1),
                     "wall_s": round(time.time() - t1, 1)})
        print(json.dumps(rows[-1]), flush=True)
        write()


if __name__ == "__main__":
    main()
