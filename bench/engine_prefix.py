"""TTFT with and without a cached prefix on the local engine (radix-tree prefix KV reuse).

    .venv/bin/python bench/engine_prefix.py [--quick] [--runs 3] [--sizes 1024,2048,4096] [--threads N]

SmolLM2-135M-Instruct, fp32, CPU (``$PREFIXGATE_MODEL_DIR``). For each prefix size N, each run
uses a fresh N-token prefix (token ids of real text, so no run hits another run's cache) and two
different 64-token suffixes. TTFT = time from ``Engine.generate`` to its first output
(``max_tokens=1``, greedy), in ms; medians of ``--runs``:

- ``cold_ttft_ms``: prefix + suffix A on an empty cache (the whole prompt is prefilled).
- ``warm_ttft_ms``: prefix + suffix B right after, so the N prefix tokens come from the radix
  tree and only the 64 suffix tokens are computed (attending to N + 64 keys).
- ``suffix_only_ttft_ms``: the 64-token suffix alone, uncached (the floor warm can reach).

Goals: warm <= 1.5 x suffix-only (reuse costs little beyond the new tokens) and cold / warm >= 25
at 4k. ``--quick`` (<= ~60 s on an idle 2-core box): only the sizes <= 2048, at most 3 runs.
Writes ``bench/results/engine_prefix.json`` =
``{"command", "figures": {"prefix": {N: {...}}}, "setup"}``.
"""

from __future__ import annotations

import argparse
import asyncio
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

DEFAULT_MODEL = Path("~/.cache/prefixgate/models/SmolLM2-135M-Instruct").expanduser()
SUFFIX = 64


def text_tokens(tok: Any, n: int, salt: int) -> list[int]:
    """``n`` token ids of English-like text, different for every ``salt``."""
    words = ["cache", "prefix", "token", "radix", "tree", "engine", "request", "latency", "decode", "prefill", "memory", "slot", "page", "batch", "schedule", "model", "answer", "agent", "tool", "history", "system", "prompt"]
    out: list[int] = []
    i = salt
    while len(out) < n:
        sentence = " ".join(words[(i * 7 + j * (salt % 5 + 1)) % len(words)] for j in range(12))
        out.extend(tok.encode(f"{salt}-{i}: {sentence}.", add_special_tokens=False))
        i += 1
    return out[:n]


def ttft_ms(eng: Any, prompt: list[int]) -> float:
    """Time to the first output of a 1-token greedy request, ms."""
    from prefixgate.local_engine.engine import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)

    async def run() -> float:
        t0 = time.perf_counter()
        async for _ in eng.generate(prompt, params):
            return (time.perf_counter() - t0) * 1e3
        raise RuntimeError("no output")

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sizes", default="1024,2048,4096")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads for the whole process (default: torch's)")
    ap.add_argument("--model", type=Path,
                    default=Path(os.environ.get("PREFIXGATE_MODEL_DIR", DEFAULT_MODEL)))
    ap.add_argument("--out", type=Path, default=REPO / "bench/results/engine_prefix.json")
    args = ap.parse_args(argv)
    load0 = load_average()[0]  # the machine may be shared: recorded with the figures
    sizes = [int(s) for s in args.sizes.split(",")]
    runs = args.runs
    if args.quick:
        sizes, runs = [s for s in sizes if s <= 2048] or sizes[:1], min(runs, 3)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    from prefixgate.local_engine.engine import Engine, EngineConfig

    eng = Engine(EngineConfig(model_path=str(args.model), num_kv_slots=3 * (max(sizes) + 256),
                              max_context_len=max(sizes) + 256))
    tok = eng.tokenizer
    ttft_ms(eng, text_tokens(tok, 32, 999))  # warm-up
    figures: dict[str, Any] = {"prefix": {}}
    salt = 0
    for n in sizes:
        cold, warm, suffix_only = [], [], []
        for _ in range(runs):
            salt += 1
            prefix = text_tokens(tok, n, salt * 1000)
            suf_a = text_tokens(tok, SUFFIX, salt * 1000 + 1)
            suf_b = text_tokens(tok, SUFFIX, salt * 1000 + 2)
            suf_c = text_tokens(tok, SUFFIX, salt * 1000 + 3)
            cold.append(ttft_ms(eng, prefix + suf_a))
            before = eng.stats()["cache_hit_tokens_total"]
            warm.append(ttft_ms(eng, prefix + suf_b))
            hit = eng.stats()["cache_hit_tokens_total"] - before
            assert hit >= n, f"warm request reused {hit} tokens, expected >= {n}"
            suffix_only.append(ttft_ms(eng, suf_c))
        c, w, s = (statistics.median(x) for x in (cold, warm, suffix_only))
        figures["prefix"][str(n)] = {
            "cold_ttft_ms": round(c, 1), "warm_ttft_ms": round(w, 1),
            "suffix_only_ttft_ms": round(s, 1),
            "cold_over_warm": round(c / w, 1), "warm_over_suffix_only": round(w / s, 2),
            "runs_ms": {"cold": [round(x, 1) for x in cold], "warm": [round(x, 1) for x in warm],
                        "suffix_only": [round(x, 1) for x in suffix_only]},
        }
        print(n, figures["prefix"][str(n)], flush=True)
    eng.shutdown()
    result = {
        "command": command(__file__, argv),
        "figures": figures,
        "setup": {"model": args.model.name, "dtype": "float32", "device": "cpu",
                  "load_avg_1m_start_end": [load0, load_average()[0]],
                  "cpu_count": os.cpu_count(),
                  "suffix_tokens": SUFFIX, "runs": runs, "torch_threads": torch.get_num_threads(),
                  "chunk_size": eng.cfg.chunk_size,
                  "max_num_batched_tokens": eng.cfg.max_num_batched_tokens,
                  "goals": {"warm_over_suffix_only": "<= 1.5", "cold_over_warm_at_4096": ">= 25"}},
    }
    write_json(args.out, result)
    print(json.dumps(result["figures"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
