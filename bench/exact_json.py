"""Cost of parsing request bodies with exact numbers (prefixgate/proxy/core/exactjson.py) against plain orjson.

Bodies of ~1 MB and ~10 MB (chat turns of random words, ``temperature: 0.7``), in three forms:
compact (what orjson / JS / httpx>=0.28 clients send: the fast path's one extra ``dumps`` +
compare), spaced (``json.dumps`` defaults: a float is present and the bytes differ, so the exact
parser runs), and compact with a 30-digit integer (the exact parser runs). Best of 5, ms.

    .venv/bin/python bench/exact_json.py
Writes ``bench/results/exact_json.json`` as ``{"command": ..., "figures": {...}}``.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.result_file import command, write_json
from prefixgate.proxy.core import exactjson

WORDS = "the quick brown fox jumps over the lazy dog 1.5 price: 2.50, v1.10 2024-05-01".split()


def _body(n_msgs: int, rng: random.Random) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 100, "temperature": 0.7, "messages": [
        {"role": "user" if i % 2 == 0 else "assistant",
         "content": " ".join(rng.choice(WORDS) for _ in range(40))} for i in range(n_msgs)]}


def _best_ms(fn: Callable[[bytes], Any], raw: bytes, k: int = 5) -> float:
    times = []
    for _ in range(k):
        t = time.perf_counter()
        fn(raw)
        times.append(time.perf_counter() - t)
    return round(min(times) * 1000, 2)


def main() -> None:
    rng = random.Random(0)
    figures: dict[str, Any] = {}
    for label, n in (("1mb", 4000), ("10mb", 40000)):
        body = _body(n, rng)
        compact = orjson.dumps(body)
        spaced = json.dumps(body).encode()
        big = compact[:-1] + b',"order_id":123456789012345678901234567890}'
        figures[label] = {
            "bytes": len(compact),
            "orjson_ms": _best_ms(orjson.loads, compact),
            "exact_compact_ms": _best_ms(exactjson.loads, compact),
            "exact_spaced_with_float_ms": _best_ms(exactjson.loads, spaced),
            "exact_big_int_ms": _best_ms(exactjson.loads, big),
        }
    out = {"command": command(__file__, []), "figures": figures}
    write_json(REPO / "bench" / "results" / "exact_json.json", out)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
