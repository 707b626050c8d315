"""Span reuse off = the engine before span reuse: same outputs, cached tokens, slot usage.

    PYTHONPATH=/path/to/old/checkout python bench/span_off_parity.py OLD.json
    PYTHONPATH=$PWD python bench/span_off_parity.py NEW.json && cmp OLD.json NEW.json

Runs one workload (tiny random Llama from ``tests/tiny_model.py``; page size 2, 48-token
chunks, a 1,200-slot pool so eviction happens; prompts that differ by a changed token and an
inserted one, concurrent requests sharing prefixes) on the ``prefixgate`` found first on
``PYTHONPATH`` and writes every output's tokens and cached tokens and, after each round, the
pool's used slots, the tree's size, the evicted and prefilled token totals. With span reuse
off (``span_reuse=False`` where the field exists) the file must equal the old checkout's.
"""
import asyncio
import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, os.environ.get("PYTHONPATH", ".").split(os.pathsep)[0])

from prefixgate.local_engine.engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from tests.tiny_model import make_tiny_model_dir  # noqa: E402


def workload(eng: Any) -> list[Any]:
    """Eight rounds: a prompt with a changed and an inserted token, then two concurrent
    requests sharing its first 150 / 120 tokens; the pool's state after each round."""
    base = list(range(1000, 1300))

    async def one(p: list[int], mt: int) -> list[Any]:
        params = SamplingParams(max_tokens=mt, temperature=0, ignore_eos=True)
        return [(o.new_token_ids, o.cached_tokens) async for o in eng.generate(p, params)]

    async def rounds() -> list[Any]:
        res: list[Any] = []
        for i in range(8):
            p = list(base)
            p[10 + i] = 5 + i
            p.insert(100, 9)
            p = p[: 200 + 10 * i] + [i, i + 1]
            res.append(await one(p, 3 + i % 4))
            res.append(await asyncio.gather(one(p[:150] + [7] * 20, 5), one(p[:120] + [8] * 30, 6)))
            st = eng.stats()
            res.append((eng.pool.used_slots, eng.cache.total_size, st["evicted_slots_total"],
                        st["prefill_tokens_total"]))
        return res

    return asyncio.run(rounds())


def main() -> int:
    d = make_tiny_model_dir(Path("/tmp/prefixgate_tiny_parity"))
    off = {"span_reuse": False} if "span_reuse" in inspect.signature(EngineConfig).parameters else {}
    eng = Engine(EngineConfig(model_path=str(d), num_kv_slots=1200, max_context_len=1024,
                              chunk_size=48, page_size=2, **off))
    try:
        out = workload(eng)
    finally:
        eng.shutdown()
    Path(sys.argv[1]).write_text(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
