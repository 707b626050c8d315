"""Fan-out simulation: N requests sharing a new prefix, with and without first-writer gating.

Model (Anthropic's prompt-caching guide, "a cache entry only becomes available after the first
response begins"): request ``i`` starts at ``start_i``; it reads the shared prefix (``prefix``
tokens) when a request that wrote it got its first byte at or before ``start_i``, else it writes
it; every request also writes its own ``suffix`` tokens (its breakpoint sits at its end). TTFT is
``base_s + uncached tokens / prefill_tok_s`` (tokens read from cache cost no prefill).

With gating the requests go through :class:`prefixgate.proxy.routing.fanout.GateCore` on the simulated clock:
the writer starts at its arrival, the others at ``min(writer's first byte, hold deadline)``.
Figures: cache-write tokens, and the added wall time (last first byte with gating minus last
first byte without).
"""

from __future__ import annotations

from dataclasses import dataclass

from prefixgate.config.schema import FanoutSettings
from prefixgate.proxy.routing.fanout import GateCore


@dataclass(frozen=True)
class FanoutCase:
    """``n`` requests arriving ``spread_s`` apart in all (evenly), a shared prefix of
    ``prefix`` tokens, ``suffix`` own tokens each; TTFT model ``base_s`` + tokens /
    ``prefill_tok_s``."""

    n: int
    prefix: int = 8000
    suffix: int = 200
    spread_s: float = 0.01
    base_s: float = 0.3
    prefill_tok_s: float = 20000.0

    def ttft(self, uncached: int) -> float:
        """TTFT (s) of a request that prefills ``uncached`` tokens."""
        return self.base_s + uncached / self.prefill_tok_s


@dataclass(frozen=True)
class FanoutResult:
    """``write_tokens``: cache writes in all; ``last_first_byte_s``: when the last request's
    first byte came; ``first_ttft_s``: the first request's TTFT; ``held``: requests held."""

    write_tokens: int
    last_first_byte_s: float
    first_ttft_s: float
    held: int


def simulate(case: FanoutCase, gated: bool,
             settings: FanoutSettings | None = None) -> FanoutResult:
    """Run ``case`` with or without the gate (``settings``: the gate's policy, enabled)."""
    arrivals = [case.spread_s * i / max(1, case.n - 1) for i in range(case.n)]
    core = GateCore(settings or FanoutSettings(enabled=True))
    key = "shared-prefix"
    starts: list[float] = []
    held = 0
    writer_first_byte: float | None = None
    answered = False
    for t in arrivals:
        if not gated:
            starts.append(t)
            continue
        if writer_first_byte is not None and writer_first_byte <= t and not answered:
            core.answered(key, writer_first_byte, ok=True)  # the prefix is warm from here
            answered = True
        deadline = core.arrive(key, t)
        if deadline is None:
            starts.append(t)
            if core.is_writer(key, t):  # its first byte: a cold prefill of everything
                writer_first_byte = t + case.ttft(case.prefix + case.suffix)
        else:
            held += 1
            assert writer_first_byte is not None
            starts.append(min(writer_first_byte, deadline))
    writes, firsts, visible = 0, [], None
    order = sorted(range(case.n), key=lambda i: starts[i])
    for i in order:
        s = starts[i]
        hit = visible is not None and visible <= s
        uncached = case.suffix + (0 if hit else case.prefix)
        writes += uncached
        first = s + case.ttft(uncached)
        firsts.append(first)
        if not hit:
            visible = first if visible is None else min(visible, first)
    return FanoutResult(writes, max(firsts), case.ttft(case.prefix + case.suffix), held)


def figures(case: FanoutCase, settings: FanoutSettings | None = None) -> dict[str, float]:
    """Gated against ungated: write cut as a share of the ideal ``(N-1)/N`` of the shared
    prefix's writes, and added wall time against the first request's TTFT."""
    off, on = simulate(case, False, settings), simulate(case, True, settings)
    cut = 1 - on.write_tokens / off.write_tokens
    ideal = (case.n - 1) / case.n
    return {"n": case.n, "write_tokens_ungated": off.write_tokens,
            "write_tokens_gated": on.write_tokens, "write_cut": round(cut, 4),
            "write_cut_share_of_ideal": round(cut / ideal, 4),
            "added_wall_s": round(on.last_first_byte_s - off.last_first_byte_s, 4),
            "first_ttft_s": round(on.first_ttft_s, 4), "held": on.held}
