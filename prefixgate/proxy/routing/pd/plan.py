"""``prefixgate plan``'s model: colocate or split prefill and decode, and with how many instances.

DistServe (Zhong et al., OSDI 2024, §3) sizes prefill and decode apart from a queueing model;
this is its simplest form, fed with one route's measured load from the ledger:

- **load** (``load_from_rows``): arrival rate ``lam`` (requests/s: ``(n - 1) / (last ts -
  first ts)``), each request's uncached prompt tokens ``u = prompt - cached`` and its output
  tokens, the prefill rate ``r_p`` (tokens/s: Σ uncached tokens / Σ ``prefill_ms`` over rows that
  report it and did not run split: a split row's ``prefill_ms`` is the decode instance's, whose
  prompt came over the P/D link; the engine reports those tokens apart from ``cached_tokens``,
  issue 34 item 13, so they count as uncached load here) and the undisturbed decode step
  ``t_d`` (s: the p50 of ``tpot_ms``).
- **prefill** is an M/G/1 queue per prefill instance: service ``S = u / r_p``; mean wait
  (Pollaczek–Khinchine) ``W(l) = l·E[S²] / (2·(1 - l·E[S]))`` for an instance arrival rate
  ``l`` (infinite once ``l·E[S] >= 1``).
- **split** ``(n_p, n_d)``: ``TTFT = E[S] + W(lam / n_p) + x·E[u] + o`` (``x`` s per KV token
  moved, ``o`` the split's orchestration); ``TPOT = t_d`` (no prefill in the decode batch);
  each decode instance holds ``lam / n_d · E[out] · t_d`` running requests (Little's law),
  at most ``max_batch``.
- **colocated** ``n``: ``TTFT = E[S] + W(lam / n)`` (our scheduler runs prefill chunks first);
  prefill takes ``rho = lam / n · E[S]`` of each instance's time, which stretches every decode
  step: ``TPOT = t_d / (1 - rho)``.

``plan`` tries ``n = 1 .. max_instances`` and recommends the first ``n`` at which an option meets
both SLOs (mean TTFT and mean TPOT): colocated when it does (no transfer, one pool), else the
split with the lowest TTFT. Means only: tail ITL (a long prefill landing in a decode batch,
``bench/results/pd_split.json``) is not modelled, which favours colocation.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from prefixgate.cache.savings.pd_decisions import pd_decision

__all__ = ["SPLIT_OVERHEAD_S", "TRANSFER_S_PER_TOKEN", "Option", "Plan", "RouteLoad", "colocated",
           "load_from_rows", "mg1_wait", "plan", "split"]

TRANSFER_S_PER_TOKEN = 0.000032
"""Default ``x``: 128 ms for 4,000 tokens of SmolLM2-135M fp32 KV (176 MiB) over gloo on
loopback, gather + send + import, on a quiet box (``bench/results/pd_split.json``,
``handoff_ms_4k``; 780 ms on the same box under a load average of 12-23)."""
SPLIT_OVERHEAD_S = 0.004
"""Default ``o``: what a split adds to TTFT beyond its transfer, measured (the split's TTFT
penalty p50 minus its transfer p50 at 256 tokens, ``bench/results/pd_split.json``: an extra
HTTP hop and the prefill answer; 3-4 ms)."""


@dataclass(frozen=True)
class RouteLoad:
    """One route's measured load: ``lam`` requests/s, ``uncached`` and ``output`` tokens per
    request (equal lengths), ``prefill_tps`` tokens/s, ``decode_step_s`` seconds."""

    lam: float
    uncached: list[int]
    output: list[int]
    prefill_tps: float
    decode_step_s: float

    @property
    def service_s(self) -> list[float]:
        """Each request's prefill seconds ``u / r_p``."""
        return [u / self.prefill_tps for u in self.uncached]


@dataclass(frozen=True)
class Option:
    """One deployment's predicted mean ``ttft_s`` / ``tpot_s`` (``inf``: the queue never
    drains) and whether it meets the SLOs; ``prefill`` 0 means colocated ``decode`` instances."""

    prefill: int
    decode: int
    ttft_s: float
    tpot_s: float
    meets_slo: bool

    @property
    def kind(self) -> str:
        """``split`` or ``colocate``."""
        return "split" if self.prefill else "colocate"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, milliseconds (``None`` for an unbounded figure)."""
        def ms(v: float) -> float | None:
            return None if math.isinf(v) else round(v * 1000.0, 1)
        return {"kind": self.kind, "prefill": self.prefill, "decode": self.decode,
                "ttft_ms": ms(self.ttft_s), "tpot_ms": ms(self.tpot_s),
                "meets_slo": self.meets_slo}


@dataclass
class Plan:
    """``recommendation`` (``colocate`` | ``split`` | ``none``: nothing meets the SLOs within
    ``max_instances``), the ``chosen`` option, the best of the other kind at the same size
    (``alternative``) and the ``load`` the model used."""

    recommendation: str
    chosen: Option | None
    alternative: Option | None
    load: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"recommendation": self.recommendation,
                "chosen": self.chosen.to_dict() if self.chosen else None,
                "alternative": self.alternative.to_dict() if self.alternative else None,
                "load": self.load}


def mg1_wait(lam: float, es: float, es2: float) -> float:
    """Mean M/G/1 queueing delay (s) at arrival rate ``lam`` (1/s) with service moments ``es``
    (s) and ``es2`` (s²); ``inf`` when the utilisation ``lam·es`` reaches 1."""
    rho = lam * es
    if rho >= 1.0:
        return math.inf
    return lam * es2 / (2.0 * (1.0 - rho))


def _moments(load: RouteLoad) -> tuple[float, float]:
    s = load.service_s
    return statistics.fmean(s), statistics.fmean(x * x for x in s)


def split(load: RouteLoad, n_p: int, n_d: int, ttft_slo_s: float, tpot_slo_s: float,
          transfer_s_per_token: float = TRANSFER_S_PER_TOKEN, overhead_s: float = SPLIT_OVERHEAD_S,
          max_batch: int = 256) -> Option:
    """The split deployment ``n_p`` prefill + ``n_d`` decode instances (module docstring).
    Raises ``ValueError`` for fewer than one instance of either."""
    if n_p < 1 or n_d < 1:
        raise ValueError("a split needs at least one prefill and one decode instance")
    es, es2 = _moments(load)
    ttft = es + mg1_wait(load.lam / n_p, es, es2) + transfer_s_per_token * statistics.fmean(
        load.uncached) + overhead_s
    running = load.lam / n_d * statistics.fmean(load.output) * load.decode_step_s
    tpot = load.decode_step_s if running <= max_batch else math.inf
    return Option(n_p, n_d, ttft, tpot, ttft <= ttft_slo_s and tpot <= tpot_slo_s)


def colocated(load: RouteLoad, n: int, ttft_slo_s: float, tpot_slo_s: float) -> Option:
    """``n`` colocated instances (module docstring). Raises ``ValueError`` for ``n < 1``."""
    if n < 1:
        raise ValueError("at least one instance")
    es, es2 = _moments(load)
    ttft = es + mg1_wait(load.lam / n, es, es2)
    rho = load.lam / n * es
    tpot = math.inf if rho >= 1.0 else load.decode_step_s / (1.0 - rho)
    return Option(0, n, ttft, tpot, ttft <= ttft_slo_s and tpot <= tpot_slo_s)


def plan(load: RouteLoad, ttft_slo_s: float, tpot_slo_s: float, max_instances: int = 16,
         transfer_s_per_token: float = TRANSFER_S_PER_TOKEN,
         overhead_s: float = SPLIT_OVERHEAD_S, max_batch: int = 256) -> Plan:
    """The smallest deployment meeting both SLOs (module docstring); ties go to colocation."""
    info = {"requests": len(load.uncached), "rate_per_s": round(load.lam, 4),
            "uncached_tokens_mean": round(statistics.fmean(load.uncached), 1),
            "output_tokens_mean": round(statistics.fmean(load.output), 1),
            "prefill_tokens_per_s": round(load.prefill_tps, 1),
            "decode_step_ms": round(load.decode_step_s * 1000.0, 2),
            "ttft_slo_ms": ttft_slo_s * 1000.0, "tpot_slo_ms": tpot_slo_s * 1000.0}
    best: tuple[Option, Option | None] | None = None
    for n in range(1, max_instances + 1):
        colo = colocated(load, n, ttft_slo_s, tpot_slo_s)
        splits = [split(load, p, n - p, ttft_slo_s, tpot_slo_s, transfer_s_per_token,
                        overhead_s, max_batch) for p in range(1, n)]
        best_split = min(splits, key=lambda o: (not o.meets_slo, o.ttft_s), default=None)
        if colo.meets_slo:
            return Plan("colocate", colo, best_split, info)
        if best_split is not None and best_split.meets_slo:
            return Plan("split", best_split, colo, info)
        best = (colo, best_split)
    return Plan("none", best[0] if best else None, best[1] if best else None, info)


def _was_split(row: dict[str, Any]) -> bool:
    """Whether the row's request ran split (``pd_decisions.pd_decision`` of its deployment)."""
    got = pd_decision(row.get("deployment"))
    return got is not None and got[0] == "split"


def load_from_rows(rows: list[dict[str, Any]], prefill_tps: float | None = None,
                   decode_step_s: float | None = None) -> RouteLoad:
    """A ``RouteLoad`` from ledger rows (``Ledger.rows()``; failed rows and rows without
    ``prompt_tokens`` / ``output_tokens`` are skipped). ``prefill_tps`` / ``decode_step_s``
    override what the rows measure. Raises ``ValueError`` when fewer than two usable rows, no
    time between them, or no row measures a figure that was not given."""
    ok = [r for r in rows if r.get("status", "ok") == "ok" and r.get("prompt_tokens") is not None
          and r.get("output_tokens") is not None]
    if len(ok) < 2:
        raise ValueError(f"{len(ok)} usable ledger rows: the model needs at least two")
    ts = [float(r["ts"]) for r in ok]
    span = max(ts) - min(ts)
    if span <= 0:
        raise ValueError("the rows span no time: no arrival rate")
    unc = [max(0, int(r["prompt_tokens"]) - int(r.get("cached_tokens") or 0)) for r in ok]
    if prefill_tps is None:  # a split row's prefill_ms is the decode instance's: no prefill
        timed = [(u, float(r["prefill_ms"])) for u, r in zip(unc, ok)
                 if r.get("prefill_ms") and u > 0 and not _was_split(r)]
        if not timed:
            raise ValueError("no row reports prefill_ms: give the prefill rate")
        prefill_tps = sum(u for u, _ in timed) / (sum(ms for _, ms in timed) / 1000.0)
    if decode_step_s is None:
        tpots = [float(r["tpot_ms"]) for r in ok if r.get("tpot_ms")]
        if not tpots:
            raise ValueError("no row reports tpot_ms: give the decode step")
        decode_step_s = statistics.median(tpots) / 1000.0
    return RouteLoad((len(ok) - 1) / span, unc, [int(r["output_tokens"]) for r in ok],
                     prefill_tps, decode_step_s)

