"""Gather the cache-planning figures (issue 12) into ``bench/results/cache_planning.json``.

    .venv/bin/python bench/cache_planning.py

Reads what the three benchmarks recorded (run them first):

* ``bench/results/passage_order.json`` — ``python bench/passage_order.py`` (local engine);
* ``bench/results/ttl_choice.json`` — ``python bench/ttl_choice.py`` (simulator);
* ``bench/results/fanout.json`` — ``python bench/fanout.py`` (simulator);
* ``bench/results/fanout_engine.json`` — ``python bench/fanout_engine.py`` (local engine).

Tool masking (part 4) is not built: its figures are ``null``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.result_file import write_json  # noqa: E402

RESULTS = REPO / "bench/results"


def _load(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / name).read_text())  # type: ignore[no-any-return]


def main() -> int:
    po, ttl, fan = _load("passage_order.json"), _load("ttl_choice.json"), _load("fanout.json")
    eng = _load("fanout_engine.json")
    mask = _load("tool_masking.json")
    result = {
        "command": " && ".join([po["command"], ttl["command"], fan["command"], eng["command"],
                                mask["command"], "python bench/cache_planning.py"]),
        "figures": {
            "passage_order": {
                "min_turn2_cached_share": po["figures"]["min_turn2_cached_share"],
                "max_turn2_cached_share_without_the_pass":
                    po["figures"]["max_turn2_cached_share_baseline"]},
            "ttl": {
                "worst_cost_ratio_vs_best_fixed": ttl["figures"]["worst_cost_ratio_vs_best_fixed"],
                "cost_ratio_by_think_time": {k: v["auto_over_best_fixed"] for k, v in
                                             ttl["figures"]["by_think_time"].items()}},
            "fanout": {
                "write_cut_share_of_ideal_n8": fan["figures"]["write_cut_share_of_ideal_n8"],
                "added_wall_s_n8": fan["figures"]["by_n"]["8"]["added_wall_s"],
                "first_ttft_s": fan["figures"]["by_n"]["8"]["first_ttft_s"],
                "local_engine_prefill_cut_by_gating": {
                    n: r["prefill_cut"] for n, r in eng["figures"]["by_n"].items()}},
            "tool_masking": {k: mask["figures"].get(k) for k in (
                "cached_share_masking", "cached_share_no_pruning", "cached_share_pruning",
                "forced_tool_valid_share")},
        },
        "sources": ["bench/results/passage_order.json", "bench/results/ttl_choice.json",
                    "bench/results/fanout.json", "bench/results/fanout_engine.json",
                    "bench/results/tool_masking.json"],
    }
    write_json(RESULTS / "cache_planning.json", result)
    print(json.dumps(result["figures"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
