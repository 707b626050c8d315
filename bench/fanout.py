"""Fan-out first-writer gating in simulation: cache-write tokens and added wall time.

    .venv/bin/python bench/fanout.py

N = 4, 8, 16 requests arriving within 10 ms, sharing a new 8,000-token prefix, 200 own tokens
each, TTFT = 0.3 s + uncached tokens / 20,000 tok/s (``prefixgate/proxy/sim/fanout.py``; a cache entry is
readable once its writer's response has begun, Anthropic's rule). Goals: write cut >= 90 % of
the ideal (N-1)/N, added wall time <= the first request's TTFT. Writes
``bench/results/fanout.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.result_file import command, write_json  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from prefixgate.proxy.sim.fanout import FanoutCase, figures

    rows = {str(n): figures(FanoutCase(n)) for n in (4, 8, 16)}
    for n, row in rows.items():
        print(n, row)
    result = {
        "command": command(__file__, argv),
        "figures": {"write_cut_share_of_ideal_n8": rows["8"]["write_cut_share_of_ideal"],
                    "by_n": rows},
        "setup": {"prefix_tokens": 8000, "suffix_tokens": 200, "arrival_spread_s": 0.01,
                  "ttft_model": "0.3 s + uncached / 20000 tok/s",
                  "write_tokens": "all cache writes (shared prefix and each request's own "
                                  "suffix), so the ideal share is at most 8000/8200"},
    }
    write_json(REPO / "bench/results/fanout.json", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
