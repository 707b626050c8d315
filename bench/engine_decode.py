"""Decode throughput of the local engine at batch 1 / 8 / 32 vs transformers' ``generate``.

    .venv/bin/python bench/engine_decode.py [--quick] [--runs 3] [--new-tokens 128] [--threads N]

SmolLM2-135M-Instruct, fp32, CPU (``$PREFIXGATE_MODEL_DIR``). Each request: a distinct
~100-token chat prompt, greedy, ``--new-tokens`` completion tokens (EOS ignored). Prefix cache
off, so repeated runs recompute their prompts like transformers does. Figures (medians of
``--runs``, all in the same process and run):

- ``batch[B].tokens_per_s``: decode throughput of B concurrent streamed requests
  (``Engine.generate``): tokens emitted after every request has its first token / that window.
  ``end_to_end_tokens_per_s``: all completion tokens / wall time from submission (prefill in).
- ``batch["1"].hf_tokens_per_s``: transformers decode throughput at batch 1, same prompt, same
  threads: ``(N - 1) / (t(generate N tokens) - t(generate 1 token))``; ``hf_end_to_end_...``:
  ``N / t(generate N tokens)``.
- ratios: ``decode_vs_hf_batch1`` (goal >= 1.5), ``batch8_vs_batch1`` (goal >= 5).

``--quick``: 16 new tokens, batches 1 and 8 only, 3 runs (<= ~60 s on an idle 2-core box).
Writes ``bench/results/engine_decode.json`` = ``{"command", "figures", "setup"}``.
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
TOPICS = ["the sea", "radix trees", "a mountain village", "compilers", "autumn rain",
          "the moon landing", "bread baking", "jazz", "chess openings", "glaciers"]


def make_prompts(tok: Any, n: int) -> list[list[int]]:
    """``n`` distinct chat prompts of ~100 tokens each."""
    out = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        msg = (f"Request {i}. Write a long, detailed essay about {topic}. Cover its history, "
               f"how it works, why people care about it, three surprising facts, and a short "
               f"conclusion. Use plain language and full sentences, no lists.")
        ids = tok.apply_chat_template([{"role": "user", "content": msg}],
                                      add_generation_prompt=True, return_dict=False)
        out.append(list(ids))
    return out


def timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_ours(eng: Any, prompts: list[list[int]], params: Any) -> tuple[float, float]:
    """B concurrent streamed requests → (end-to-end tokens/s, decode tokens/s).

    Decode window: from the moment every request has its first token to the last token;
    decode tokens/s = tokens emitted inside that window / its length.
    """
    stamps: list[list[float]] = [[] for _ in prompts]

    async def one(i: int) -> None:
        async for out in eng.generate(prompts[i], params):
            stamps[i].extend([time.perf_counter()] * len(out.new_token_ids))

    async def all_() -> None:
        await asyncio.gather(*(one(i) for i in range(len(prompts))))

    t0 = time.perf_counter()
    asyncio.run(all_())
    t_end = max(s[-1] for s in stamps)
    t_first_all = max(s[0] for s in stamps)
    n_total = sum(len(s) for s in stamps)
    in_window = sum(1 for s in stamps for t in s if t > t_first_all)
    return n_total / (t_end - t0), in_window / max(t_end - t_first_all, 1e-9)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads for the whole process (default: torch's)")
    ap.add_argument("--model", type=Path,
                    default=Path(os.environ.get("PREFIXGATE_MODEL_DIR", DEFAULT_MODEL)))
    ap.add_argument("--out", type=Path, default=REPO / "bench/results/engine_decode.json")
    args = ap.parse_args(argv)
    load0 = load_average()[0]  # the machine may be shared: recorded with the figures
    n_new = 16 if args.quick else args.new_tokens
    batches = [int(b) for b in args.batches.split(",")]
    if args.quick:
        batches = [b for b in batches if b <= 8] or batches[:1]

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    from prefixgate.local_engine.engine import Engine, EngineConfig, SamplingParams

    eng = Engine(EngineConfig(model_path=str(args.model), enable_prefix_cache=False,
                              num_kv_slots=32 * 512, max_context_len=2048))
    prompts = make_prompts(eng.tokenizer, max(batches))
    params = SamplingParams(max_tokens=n_new, temperature=0.0, ignore_eos=True)
    eng.generate_batch([prompts[0]], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up

    hf = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=torch.float32).eval()
    x = torch.tensor([prompts[0]])

    def hf_run() -> None:
        with torch.inference_mode():
            hf.generate(x, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                        pad_token_id=eng.tokenizer.eos_token_id)

    def hf_first() -> None:
        with torch.inference_mode():
            hf.generate(x, max_new_tokens=1, do_sample=False,
                        pad_token_id=eng.tokenizer.eos_token_id)

    hf_run()  # warm-up
    figures: dict[str, Any] = {"batch": {}}
    hf_full: list[float] = []
    hf_ttft: list[float] = []
    ours: dict[int, list[tuple[float, float]]] = {b: [] for b in batches}
    for _ in range(args.runs):  # interleaved, so machine noise hits both sides alike
        hf_full.append(timed(hf_run))
        hf_ttft.append(timed(hf_first))
        for b in batches:
            ours[b].append(run_ours(eng, prompts[:b], params))
    for b in batches:
        figures["batch"][str(b)] = {
            "tokens_per_s": round(statistics.median(d for _, d in ours[b]), 2),
            "end_to_end_tokens_per_s": round(statistics.median(e for e, _ in ours[b]), 2),
        }
    hf_decode = statistics.median((n_new - 1) / max(f - t, 1e-9) for f, t in zip(hf_full, hf_ttft))
    hf_e2e = n_new / statistics.median(hf_full)
    figures["batch"]["1"]["hf_tokens_per_s"] = round(hf_decode, 2)
    figures["batch"]["1"]["hf_end_to_end_tokens_per_s"] = round(hf_e2e, 2)
    b1 = figures["batch"]["1"]["tokens_per_s"]
    figures["decode_vs_hf_batch1"] = round(b1 / hf_decode, 2)
    for b in batches:
        if b != 1:
            figures[f"batch{b}_vs_batch1"] = round(figures["batch"][str(b)]["tokens_per_s"] / b1, 2)
    eng.shutdown()
    result = {
        "command": command(__file__, argv),
        "figures": figures,
        "setup": {"model": args.model.name, "dtype": "float32", "device": "cpu",
                  "load_avg_1m_start_end": [load0, load_average()[0]],
                  "cpu_count": os.cpu_count(),
                  "new_tokens": n_new, "runs": args.runs,
                  "prompt_tokens": [len(p) for p in prompts[:max(batches)]][:4],
                  "torch_threads": torch.get_num_threads(),
                  "goals": {"decode_vs_hf_batch1": ">= 1.5", "batch8_vs_batch1": ">= 5"}},
    }
    write_json(args.out, result)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
