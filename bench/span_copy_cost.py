"""Span reuse: the cost of copying (and re-rotating) reused K/V against prefilling those tokens.

    nice -n 10 .venv/bin/python bench/span_copy_cost.py [--tokens 256,512,1024] [--repeat 5]

For ``n`` tokens on SmolLM2-135M-Instruct (fp32 CPU, 30 layers, 3 KV heads x 64): the median
wall time of ``SpanReuse.apply`` copying ``n`` slots on every layer unshifted and shifted (keys
re-rotated), against a prefill of ``n`` tokens (a request with ``no_prefix_cache``, one token
sampled). Writes ``bench/results/span_copy_cost.json`` with the command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_MODEL = Path("~/.cache/prefixgate/models/SmolLM2-135M-Instruct").expanduser()
OUT = REPO / "bench" / "results" / "span_copy_cost.json"


def median_s(fn: Any, repeat: int) -> float:
    """Median wall time of ``fn()`` over ``repeat`` runs after one warm-up run."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    from prefixgate.local_engine.engine import Engine, EngineConfig, SamplingParams
    from prefixgate.local_engine.sched.span_reuse import SpanCopy

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--tokens", default="256,512,1024")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    eng = Engine(EngineConfig(model_path=str(args.model), num_kv_slots=4096, max_context_len=2048))
    span = eng.scheduler.kv.span
    assert span is not None
    rows = []
    for n in (int(x) for x in args.tokens.split(",")):
        plain = SpanCopy(list(range(n)), list(range(2048, 2048 + n)), [0] * n)
        moved = SpanCopy(plain.src, plain.dst, [3] * n)
        copy_s = median_s(lambda c=plain: span.apply(eng.pool, c), args.repeat)
        rot_s = median_s(lambda c=moved: span.apply(eng.pool, c), args.repeat)
        ids = [1000 + (i * 37) % 20000 for i in range(n)]

        async def prefill(ids: list[int] = ids) -> None:
            params = SamplingParams(max_tokens=1, temperature=0.0, no_prefix_cache=True)
            async for _ in eng.generate(ids, params):
                pass

        prefill_s = median_s(lambda: asyncio.run(prefill()), args.repeat)
        rows.append({"tokens": n, "copy_ms": round(copy_s * 1e3, 2), "copy_rerotated_ms": round(rot_s * 1e3, 2),
                     "prefill_ms": round(prefill_s * 1e3, 1),
                     "copy_share_of_prefill": round(rot_s / prefill_s, 4)})
        print(rows[-1], flush=True)
    eng.shutdown()
    command = "python " + " ".join(shlex.quote(a) for a in [
        "bench/span_copy_cost.py", *(argv if argv is not None else sys.argv[1:])])
    args.out.write_text(json.dumps({"command": command, "rows": rows, "setup": {
        "model": args.model.name, "device": "cpu (fp32), 2 cores shared with other jobs",
        "repeat": args.repeat, "timing": "median wall time; prefill = one request, one token sampled"}},
        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
