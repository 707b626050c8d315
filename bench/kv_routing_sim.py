"""The simulated part of ``bench/kv_routing.py``: exact routing from (lagged) KV events.

The workload and replica model are ``bench/routing_affinity.py``'s (16 FIFO prefill servers
with LRU prefix caches, 200 tau-bench-shaped sessions of 8 turns, priced with the engine's
measured prefill cost). What is new is how the router learns what each replica holds: the
``kv_events`` policy sees every replica's stores and evictions only ``lag_ms`` after they
happen (the event path), rounds them down to whole 16-token blocks, and decides with the
proxy's own code — :func:`prefixgate.proxy.routing.balance.choose` in ``exact`` mode under
its load guard, :meth:`Balancer.place` for the placement. ``oracle``: every turn finds its
previous prompt cached (the one-replica bound) on the least loaded replica.

The saturated case: a system prompt twice as long, cached at the start on replica 0 only, so
exact routing wants every new session there; the load guard must make it yield.
"""

from __future__ import annotations

import collections
import heapq
import random
from dataclasses import replace
from typing import Any

from bench.routing_affinity import Replica, SimConfig, prefill_cost
from bench.serving_client import percentile
from prefixgate.config.routing import AffinitySettings
from prefixgate.proxy.routing.balance import Balancer, choose

BLOCK = 16


class LaggedView:
    """What the router's index says a replica holds: its stores and evictions, ``lag_ms``
    late."""

    def __init__(self, lag_ms: float) -> None:
        self.lag_ms = lag_ms
        self.pending: list[tuple[float, int, str, int | None]] = []
        self.held: dict[str, int] = {}
        self._n = 0

    def event(self, t: float, key: str, tokens: int | None) -> None:
        """A store (``tokens``) or an eviction (None) at ``t``."""
        self._n += 1
        heapq.heappush(self.pending, (t + self.lag_ms, self._n, key, tokens))

    def at(self, t: float) -> dict[str, int]:
        """The view at ``t`` (events older than the lag applied)."""
        while self.pending and self.pending[0][0] <= t:
            _, _, key, tokens = heapq.heappop(self.pending)
            if tokens is None:
                self.held.pop(key, None)
            else:
                self.held[key] = tokens
        return self.held


def _blocks(n: int) -> int:
    return n - n % BLOCK


def simulate(policy: str, cfg: SimConfig, lag_ms: float = 20.0,
             hot_system_on: int | None = None) -> dict[str, Any]:
    """Run the workload under ``policy`` (``round_robin``, ``kv_events``, ``oracle``);
    ``hot_system_on``: the saturated case (the system prompt cached on that replica only)."""
    rng = random.Random(cfg.seed)
    prompt_at = [cfg.system_tokens + cfg.first_user_tokens + k * cfg.turn_tokens
                 for k in range(cfg.turns)]
    cold_work_ms = sum(prompt_at) * cfg.sessions * cfg.prefill_ms_per_token
    horizon_ms = cold_work_ms / (cfg.load * cfg.replicas)
    gap = horizon_ms / cfg.turns
    events: list[tuple[float, int, int]] = []
    for s in range(cfg.sessions):
        start = rng.uniform(0, gap)
        for k in range(cfg.turns):
            heapq.heappush(events, (start + k * gap + rng.uniform(-0.2, 0.2) * gap, s, k))
    reps = [Replica() for _ in range(cfg.replicas)]
    views = [LaggedView(lag_ms) for _ in reps]
    if hot_system_on is not None:
        reps[hot_system_on].lru["system"] = cfg.system_tokens
        views[hot_system_on].held["system"] = cfg.system_tokens
    names = [f"r{i}" for i in range(cfg.replicas)]
    balancer = Balancer(now=lambda: 0.0)
    settings = AffinitySettings(mode="exact")
    inflight: list[list[float]] = [[] for _ in reps]
    ttft, cached_sum, prompt_sum = [], 0, 0
    served = collections.Counter[int]()
    turn = 0
    while events:
        t, s, k = heapq.heappop(events)
        for fl in inflight:
            fl[:] = [f for f in fl if f > t]
        loads = [len(fl) for fl in inflight]
        key = f"session-{s}"
        prompt = prompt_at[k]
        if policy == "round_robin":
            i = turn % cfg.replicas
        elif policy == "oracle":
            i = min(range(cfg.replicas), key=lambda j: (loads[j], (j - turn) % cfg.replicas))
        else:
            matches = []
            for v in views:
                held = v.at(t)
                matches.append(_blocks(min(prompt - 1, max(held.get("system", 0) if "system" in held
                                                           else 0, held.get(key, 0)))))
            new_key = not balancer.known(key, settings)
            placed = balancer.place(key, names, settings)
            c = choose(names, loads, key, settings, matches=matches, placed=placed,
                       new_key=new_key)
            if c.why == "cache_match" and c.index != placed:
                balancer.follow(key, names[c.index])
            i = c.index
        turn += 1
        rep = reps[i]
        cached = prompt_at[k - 1] if (policy == "oracle" and k) else rep.cached(key, cfg)
        cached = _blocks(min(cached, prompt - 1))
        service = (prompt - cached) * cfg.prefill_ms_per_token + cached * cfg.cached_ms_per_token
        begin = max(t, rep.free_at)
        rep.free_at = begin + service
        inflight[i].append(rep.free_at)
        before = set(rep.lru)
        rep.store(key, prompt, cfg)
        views[i].event(rep.free_at, key, prompt)
        views[i].event(rep.free_at, "system", cfg.system_tokens)
        for gone in before - set(rep.lru):
            views[i].event(rep.free_at, gone, None)
        ttft.append(rep.free_at - t)
        cached_sum, prompt_sum = cached_sum + cached, prompt_sum + prompt
        served[i] += 1
    loads = [served[i] for i in range(cfg.replicas)]
    return {"hit_rate": round(cached_sum / prompt_sum, 3),
            "ttft_p50_ms": _r(percentile(ttft, 50)), "ttft_p90_ms": _r(percentile(ttft, 90)),
            "max_min_load": round(max(loads) / min(loads), 2) if min(loads) else None,
            "served_per_replica": loads}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def run_sim(lag_ms: float = 20.0) -> dict[str, Any]:
    """The issue's ``sim`` figures plus the per-policy detail and the saturated case."""
    cold, cached, source = prefill_cost()
    cfg = SimConfig(prefill_ms_per_token=round(cold, 3), cached_ms_per_token=round(cached, 4))
    per = {p: simulate(p, cfg, lag_ms) for p in ("round_robin", "kv_events", "oracle")}
    hot_cfg = replace(cfg, system_tokens=2 * cfg.system_tokens)
    hot = simulate("kv_events", hot_cfg, lag_ms, hot_system_on=0)
    hot_oracle = simulate("oracle", hot_cfg, lag_ms)
    mean = sum(hot["served_per_replica"]) / len(hot["served_per_replica"])
    figures = {"hit_rate": per["kv_events"]["hit_rate"],
               "oracle_hit_rate": per["oracle"]["hit_rate"],
               "ttft_p90_ratio_vs_round_robin": round(
                   per["round_robin"]["ttft_p90_ms"] / per["kv_events"]["ttft_p90_ms"], 2),
               "max_min_load": per["kv_events"]["max_min_load"]}
    detail = {"per_policy": per, "event_lag_ms": lag_ms, "block_size": BLOCK,
              "saturated": {"hit_rate": hot["hit_rate"], "oracle_hit_rate": hot_oracle["hit_rate"],
                            "hot_replica_share_of_mean": round(hot["served_per_replica"][0] / mean, 2),
                            "max_min_load": hot["max_min_load"],
                            "served_per_replica": hot["served_per_replica"],
                            "system_tokens": hot_cfg.system_tokens},
              "config": {**cfg.__dict__, "cost_source": source}}
    return {"figures": figures, "detail": detail}
