"""Write TTLs chosen by expected cost against fixed 5m / fixed 1h, in the offline simulator.

    .venv/bin/python bench/ttl_choice.py [--runs 10] [--seeds 0,1,2]

The tau-bench airline trace (``../shared/data/traces/tau_bench_airline_gpt4o.json``) is replayed
under Anthropic's cache rules (``prefixgate simulate --strategy ttl``) with three think-time
distributions between a run's requests: a fixed 30 s, a lognormal with a tail past 5 minutes
(``lognormal:4.5,1.2``: median 90 s, ~16 % of gaps past 5 min), and a human-in-the-loop mix (5 s
before a request that carries a tool result, ``lognormal:5.5,0.8`` — median 245 s, ~40 % past
5 min — before a user turn). Figure per distribution: input cost (USD) of ``ttl-5m``,
``ttl-1h`` and ``ttl-auto`` summed over the seeds, and ``auto / min(5m, 1h)``. Writes
``bench/results/ttl_choice.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.result_file import command, write_json  # noqa: E402

TRACE = REPO.parent / "shared/data/traces/tau_bench_airline_gpt4o.json"
DISTRIBUTIONS = ("fixed:30s", "lognormal:4.5,1.2", "mix:tool=fixed:5s;user=lognormal:5.5,0.8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", type=Path, default=REPO / "bench/results/ttl_choice.json")
    args = ap.parse_args(argv)
    from prefixgate.proxy.sim.simulate import TTL_STRATEGIES, SimConfig, Simulator
    from prefixgate.proxy.sim.think_time import parse
    from prefixgate.proxy.sim.traces import load_trace

    runs = load_trace(TRACE, runs=args.runs)
    seeds = [int(s) for s in args.seeds.split(",")]
    figures: dict[str, Any] = {}
    for spec in DISTRIBUTIONS:
        cost = dict.fromkeys(TTL_STRATEGIES, 0.0)
        share = dict.fromkeys(TTL_STRATEGIES, 0.0)
        for seed in seeds:
            fig = Simulator(SimConfig(provider="anthropic", strategies=TTL_STRATEGIES, seed=seed,
                                      think_time=parse(spec))).run(runs)
            for name, s in fig["strategies"].items():
                cost[name] += s["input_cost_usd"]
                share[name] += s["cached_share"] / len(seeds)
        best_fixed = min(cost["ttl-5m"], cost["ttl-1h"])
        figures[spec] = {"input_cost_usd": {k: round(v, 4) for k, v in cost.items()},
                         "cached_share": {k: round(v, 4) for k, v in share.items()},
                         "auto_over_best_fixed": round(cost["ttl-auto"] / best_fixed, 4)}
        print(spec, figures[spec], flush=True)
    result = {
        "command": command(__file__, argv),
        "figures": {"worst_cost_ratio_vs_best_fixed": max(
            f["auto_over_best_fixed"] for f in figures.values()), "by_think_time": figures},
        "setup": {"trace": "tau_bench_airline_gpt4o.json", "runs": args.runs, "seeds": seeds,
                  "provider": "anthropic", "model": "claude-sonnet-4-5",
                  "cost": "input cost only (output is the same for every strategy)"},
    }
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
