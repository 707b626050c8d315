"""Fan-out on our local engine: N requests sharing a new prefix, at once vs first-writer gated.

    .venv/bin/python bench/fanout_engine.py [--n 4,8] [--prefix-tokens 512]

SmolLM2-135M-Instruct in-process (CPU, greedy, ``max_tokens=1``). For each N, a fresh shared
prefix (token ids of text, salted so no run hits another's cache) plus a different 16-token
suffix per request:

* ``at_once``: all N submitted together (what the engine's scheduler does with a fan-out alone:
  whether later requests reuse the first's prefix depends on when they are admitted);
* ``gated``: the first alone until its first output (the proxy's ``fanout`` gate), then the
  other N-1 together.

Figures: prefill tokens computed (prompt - cached, the engine's counters), the fan-out's wall
time to the last first token, and the first request's TTFT. Writes
``bench/results/fanout_engine.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.result_file import command, load_average, write_json  # noqa: E402

DEFAULT_MODEL = Path("~/.cache/prefixgate/models/SmolLM2-135M-Instruct").expanduser()
SUFFIX = 16


def tokens(tok: Any, n: int, salt: int) -> list[int]:
    """``n`` token ids of text, different per ``salt``."""
    out: list[int] = []
    i = 0
    while len(out) < n:
        out.extend(tok.encode(f"Record {salt}-{i}: the worker reads shard {i * 7 % 13} of "
                              f"batch {salt} and reports totals.", add_special_tokens=False))
        i += 1
    return out[:n]


async def first_token(eng: Any, prompt: list[int]) -> tuple[float, int]:
    """``(seconds to the first output, cached tokens)`` of one request."""
    from prefixgate.local_engine.engine import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    async for out in eng.generate(prompt, params):
        return time.perf_counter() - t0, int(out.cached_tokens)
    raise RuntimeError("no output")


async def fan_out(eng: Any, prompts: list[list[int]], gated: bool) -> dict[str, Any]:
    """Run one fan-out; prefill tokens from the engine's counters."""
    before = eng.stats()["prefill_tokens_total"]
    t0 = time.perf_counter()
    if gated:
        first = [await first_token(eng, prompts[0])]
        rest = await asyncio.gather(*(first_token(eng, p) for p in prompts[1:]))
        results = first + list(rest)
    else:
        results = list(await asyncio.gather(*(first_token(eng, p) for p in prompts)))
    wall = time.perf_counter() - t0
    return {"prefill_tokens": eng.stats()["prefill_tokens_total"] - before,
            "cached_tokens": sum(c for _, c in results), "wall_s": round(wall, 3),
            "first_ttft_s": round(results[0][0], 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="4,8")
    ap.add_argument("--prefix-tokens", type=int, default=512)
    ap.add_argument("--model", type=Path,
                    default=Path(os.environ.get("PREFIXGATE_MODEL_DIR", DEFAULT_MODEL)))
    args = ap.parse_args(argv)
    from prefixgate.local_engine.engine import Engine, EngineConfig

    eng = Engine(EngineConfig(model_path=str(args.model), num_kv_slots=32768,
                              max_context_len=2048))
    tok = eng.tokenizer
    asyncio.run(first_token(eng, tokens(tok, 16, 999)))  # warm-up
    rows: dict[str, Any] = {}
    salt = 0
    for n in (int(x) for x in args.n.split(",")):
        row: dict[str, Any] = {}
        for mode in ("at_once", "gated"):
            salt += 1
            prefix = tokens(tok, args.prefix_tokens, salt * 100)
            prompts = [prefix + tokens(tok, SUFFIX, salt * 100 + 1 + i) for i in range(n)]
            row[mode] = asyncio.run(fan_out(eng, prompts, mode == "gated"))
        cut = 1 - row["gated"]["prefill_tokens"] / row["at_once"]["prefill_tokens"]
        row["prefill_cut"] = round(cut, 4)
        row["added_wall_s"] = round(row["gated"]["wall_s"] - row["at_once"]["wall_s"], 3)
        rows[str(n)] = row
        print(n, row, flush=True)
    eng.shutdown()
    result = {
        "command": command(__file__, argv),
        "figures": {"by_n": rows},
        "setup": {"model": args.model.name, "device": "cpu", "prefix_tokens": args.prefix_tokens,
                  "suffix_tokens": SUFFIX, "load_avg_1m": load_average()[0]},
    }
    write_json(REPO / "bench/results/fanout_engine.json", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
