"""Record the tau-bench airline cache simulation for Anthropic and OpenAI rules.

Runs ``prefixgate simulate TRACE --provider P --volatile-clock --json`` (all 160 runs, all three
strategies) in-process and writes ``{"command": "...", "figures": {...}}`` to
``bench/results/simulate_tau_airline.json`` (anthropic) and
``bench/results/simulate_tau_airline_openai.json`` (openai).

Usage: ``.venv/bin/python bench/simulate_tau.py [--runs N] [--provider anthropic|openai|both]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.result_file import write_json  # noqa: E402
from prefixgate.proxy.sim.simulate import SimConfig, Simulator
from prefixgate.proxy.sim.traces import load_trace

TRACE = REPO.parent / "shared" / "data" / "traces" / "tau_bench_airline_gpt4o.json"
OUT = {"anthropic": REPO / "bench" / "results" / "simulate_tau_airline.json",
       "openai": REPO / "bench" / "results" / "simulate_tau_airline_openai.json"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=None, help="first N runs only")
    ap.add_argument("--provider", choices=["anthropic", "openai", "both"], default="both")
    args = ap.parse_args()
    providers = ["anthropic", "openai"] if args.provider == "both" else [args.provider]
    runs = load_trace(TRACE, runs=args.runs)
    for provider in providers:
        figures = Simulator(SimConfig(provider=provider, volatile_clock=True)).run(runs)
        command = ("prefixgate simulate ../shared/data/traces/tau_bench_airline_gpt4o.json "
                   f"--provider {provider} --volatile-clock --json"
                   + (f" --runs {args.runs}" if args.runs else ""))
        write_json(OUT[provider], {"command": command, "figures": figures})
        shares = {k: v["cached_share"] for k, v in figures["strategies"].items()}
        print(f"{provider}: {shares} in {figures['seconds']} s -> {OUT[provider].name}")


if __name__ == "__main__":
    main()
