"""The meaning guard's sequential test on scripted upstreams, by simulation over many seeds.

Each seed runs one trial to its verdict with :func:`prefixgate.cache.guard.sequential.decide`
(the shipped rule: margin 0.15, confidence 0.95, a look every 20 pairs, at most 200). A pair is
three answers at temperature 0 — original, repeat (the floor), variant (the move on) — drawn
from a scripted upstream and compared with :func:`prefixgate.cache.guard.decisions.changed`:

- ``unaffected``: every answer the same (the move changes nothing the model reads) -> want "on";
- ``affected_60`` / ``affected_100``: the variant's answer differs with p = 0.6 / 1.0, the
  repeat never -> want "off" at the first look;
- ``engine_50``: the variant differs with p = 0.5 (SmolLM2 with note hoisting) -> want "off";
- ``nondeterministic``: each of the three answers independently flips to an alternative with
  p = 0.25 whatever the move (both changed rates 0.375, d = 0) -> want "on", never "off";
- ``at_margin_floor0`` / ``at_margin_nondeterministic``: the move changes exactly ``margin``
  more answers than the floor (d = 0.15; the second on the nondeterministic upstream, its
  variant taking a third answer with p = 0.24) -> "on" here is the test's error, want <= 5 %;
- ``within_margin``: d = 0.05 on the nondeterministic upstream (tolerated; informative).

Figures per scenario: the share of seeds ending ``on``, ``off`` (proven worse) and
``not_proven`` (undecided at 200 pairs: off, failing closed), and the mean / max pairs to the
verdict. ``comparator``: the same for the simpler rule the docstring of ``sequential.py`` rejects
(Agresti-Min adjusted Wald interval, alpha / K at every look).

    python bench/guard_sequential.py [--seeds 5000]

writes ``bench/results/guard_sequential.json``.
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Callable
from functools import cache
from statistics import NormalDist
from typing import Any

from bench.result_file import REPO, provenance, write_json
from prefixgate.cache.guard.decisions import changed
from prefixgate.cache.guard.sequential import Decision, PairCounts, TestRule, decide

RULE = TestRule()
OUT = REPO / "bench" / "results" / "guard_sequential.json"

# scenario -> (draw one pair's three answers, the right verdict or None for error-rate rows)
Pair = Callable[[random.Random], tuple[str, str, str]]


def _flip(rng: random.Random, p: float) -> str:
    return "text:b" if rng.random() < p else "text:a"


def _variant(p: float) -> Pair:
    return lambda rng: ("text:a", "text:a", _flip(rng, p))


def _nondeterministic(extra: float) -> Pair:
    def pair(rng: random.Random) -> tuple[str, str, str]:
        orig, repeat, variant = _flip(rng, 0.25), _flip(rng, 0.25), _flip(rng, 0.25)
        return orig, repeat, "text:c" if rng.random() < extra else variant
    return pair


SCENARIOS: dict[str, tuple[Pair, str | None]] = {
    "unaffected": (_variant(0.0), "on"),
    "affected_60": (_variant(0.6), "off"),
    "affected_100": (_variant(1.0), "off"),
    "engine_50": (_variant(0.5), "off"),
    "nondeterministic": (_nondeterministic(0.0), "on"),
    "at_margin_floor0": (_variant(0.15), None),
    "at_margin_nondeterministic": (_nondeterministic(0.24), None),
    "within_margin": (_nondeterministic(0.08), None),
}


@cache
def _shipped(c: PairCounts) -> Decision:
    return decide(c, RULE)


@cache
def _agresti_min(c: PairCounts) -> Decision:
    """The rejected rule: Agresti & Min (2005) adjusted Wald interval (0.5 added to each cell)
    with alpha / K at every look for both tests; same look schedule and fail-closed end."""
    n, b, f = c.pairs, c.move_changed - c.both_changed, c.floor_changed - c.both_changed
    final = n >= RULE.max_pairs
    if n % RULE.look_every and not final:
        return Decision("trialling", n, 0, 0, 1, -1, "")
    z = NormalDist().inv_cdf(1 - (1 - RULE.confidence) / RULE.looks)
    pb, pf = (b + 0.5) / (n + 2), (f + 0.5) / (n + 2)
    d = pb - pf
    half = z * math.sqrt(max((pb + pf - d * d) / (n + 2), 0.0))
    if d + half < RULE.margin:
        return Decision("on", n, 0, 0, d + half, d - half, "")
    if d - half > 0 and (b - f) / n > RULE.margin / 2:
        return Decision("off", n, 0, 0, d + half, d - half, "worse")
    if final:
        return Decision("off", n, 0, 0, d + half, d - half, "not proven")
    return Decision("trialling", n, 0, 0, 1, -1, "")


def run_trial(pair: Pair, rng: random.Random, judge: Callable[[PairCounts], Decision]) -> Decision:
    """One trial to its verdict: pairs drawn from ``pair`` until ``judge`` decides."""
    n = m = f = both = 0
    while True:
        orig, repeat, variant = pair(rng)
        mc, fc = changed(orig, variant), changed(orig, repeat)
        n, m, f, both = n + 1, m + mc, f + fc, both + (mc and fc)
        d = judge(PairCounts(n, m, f, both))
        if d.state != "trialling":
            return d


def summarise(pair: Pair, want: str | None, seeds: int,
              judge: Callable[[PairCounts], Decision]) -> dict[str, Any]:
    """Shares of seeds per ending and pairs to the verdict."""
    ends = {"on": 0, "off": 0, "not_proven": 0}
    pairs: dict[str, list[int]] = {"on": [], "off": []}
    for seed in range(seeds):
        d = run_trial(pair, random.Random(seed), judge)
        ends["not_proven" if "not proven" in d.reason else d.state] += 1
        pairs[d.state].append(d.pairs)
    out: dict[str, Any] = {k: round(v / seeds, 4) for k, v in ends.items()}
    for state, got in pairs.items():
        out[f"mean_pairs_{state}"] = round(sum(got) / len(got), 1) if got else None
        out[f"max_pairs_{state}"] = max(got) if got else None
    if want is not None:
        out["want"] = want
        out["right"] = out["on"] if want == "on" else round(out["off"] + out["not_proven"], 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5000)
    args = ap.parse_args()
    figures = {name: summarise(pair, want, args.seeds, _shipped) for name, (pair, want) in SCENARIOS.items()}
    comparator = {name: summarise(pair, want, args.seeds, _agresti_min)
                  for name, (pair, want) in SCENARIOS.items()}
    doc = {**provenance(__file__), "seeds": args.seeds,
           "rule": {"margin": RULE.margin, "confidence": RULE.confidence,
                    "look_every": RULE.look_every, "max_pairs": RULE.max_pairs,
                    "test": "Tango score; on: Haybittle-Peto spending, off: alpha/K; fail closed"},
           "figures": figures, "comparator_agresti_min_bonferroni": comparator}
    write_json(OUT, doc)
    for name, row in figures.items():
        print(f"{name:28s} {row}")


if __name__ == "__main__":
    main()
