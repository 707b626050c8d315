"""Per-call cost of the screened LM head against the full fp32 head, on SmolLM2-135M's head.

    .venv/bin/python bench/screened_head_cost.py [--threads 2] [--reps 30] [--old PATH]

The head matrix is the model's tied embedding (49152 × 576, read from its safetensors); the
hidden rows are Gaussian with two channels scaled ×40 and ×15 (a final RMSNorm's outliers).
For 1, 8 and 24 rows: the median ms of ``reps`` calls of the oneDNN full head
(``cpu_linear.PackedLinear``), of ``screened_head.ScreenedHead`` and, with ``--old``, of
another version of the module (a file path: e.g. the one before a change), interleaved call by
call. Writes ``bench/results/screened_head_cost.json`` (and prints it).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.result_file import command, load_average, write_json  # noqa: E402

MODEL = Path(os.environ.get("PREFIXGATE_MODEL_DIR",
                            "~/.cache/prefixgate/models/SmolLM2-135M-Instruct")).expanduser()


def main() -> None:
    """Time the heads (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--old", default="")
    args = ap.parse_args()
    import torch
    from safetensors.torch import load_file

    from prefixgate.local_engine.model.quant import screened_head
    from prefixgate.local_engine.model.quant.cpu_linear import PackedLinear

    torch.set_num_threads(args.threads)
    w = load_file(str(MODEL / "model.safetensors"))["model.embed_tokens.weight"].float()
    full = PackedLinear(w, None)
    heads: dict[str, Any] = {"full": full, "screened": screened_head.ScreenedHead(w, full)}
    if args.old:
        spec = importlib.util.spec_from_file_location("screened_head_old", args.old)
        assert spec is not None and spec.loader is not None
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
        heads["screened_old"] = old.ScreenedHead(w, full)
    out: dict[str, Any] = {}
    for rows in (1, 8, 24):
        g = torch.Generator().manual_seed(rows)
        x = torch.randn(rows, w.shape[1], generator=g)
        x[:, 3] *= 40.0
        x[:, 17] *= 15.0
        times: dict[str, list[float]] = {k: [] for k in heads}
        for _ in range(args.reps):
            for name, head in heads.items():
                t = time.perf_counter()
                head(x)
                times[name].append((time.perf_counter() - t) * 1000)
        out[str(rows)] = {k: round(statistics.median(v), 3) for k, v in times.items()}
    counts = {k: {"rows": h.rows, "full_rows": h.full_rows} for k, h in heads.items() if k != "full"}
    doc = {"command": command(__file__), "median_ms": out, "counts": counts, "load_avg": load_average()}
    write_json(REPO / "bench" / "results" / "screened_head_cost.json", doc)
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
