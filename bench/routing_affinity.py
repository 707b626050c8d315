"""Prefix affinity across replicas (issue 10): round-robin vs least-load vs prefixgate vs oracle.

(a) ``live``: 3 real engine replicas (SmolLM2-135M, one thread each, ``python -m prefixgate.local_engine``)
    behind the proxy as one deployment group, under concurrent multi-turn tau-bench airline
    sessions (system prompt and turns cut short to fit 2 shared cores). Each routing mode gets
    fresh replicas (cold caches). Per mode: cached share (cached / prompt tokens, from the
    engines' own usage), TTFT p50 / p95 through the proxy (queueing included: the engines
    count from arrival), max/min requests served per replica, rejected requests (non-200).
    The oracle is one replica holding every session's cache (cached share only).
(b) ``simulated``: a discrete-event simulation of 16 replicas x 200 sessions, each replica a
    FIFO prefill server with an LRU prefix cache, priced with the engine's measured prefill
    cost per token (``bench/results/engine_prefix.json``, cold 2048-token prompt) at 70 %
    load (offered prefill work without any cache / capacity). The routing decisions are the
    proxy's own code (:mod:`prefixgate.proxy.routing.balance`).

Run: ``nice python bench/routing_affinity.py`` (``--only sim`` / ``--only live``);
writes ``bench/results/routing_affinity.json`` in the issue's shape.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import heapq
import json
import os
import random
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.result_file import command as result_command  # noqa: E402
from bench.result_file import write_json  # noqa: E402
from bench.serving_client import EngineProcess, percentile  # noqa: E402
from prefixgate.cache.ledger.store import Ledger  # noqa: E402
from prefixgate.config.loader import parse_policy  # noqa: E402
from prefixgate.config.routing import AffinitySettings  # noqa: E402
from prefixgate.proxy.app import build_app
from prefixgate.proxy.routing.balance import Balancer, choose  # noqa: E402
from tests.servers import serve_app  # noqa: E402
from tests.tiny_model import model_dir  # noqa: E402

# the shared data beside the checkout (PREFIXGATE_SHARED_DIR names it from a worktree elsewhere)
SHARED = Path(os.environ.get("PREFIXGATE_SHARED_DIR", ROOT.parent / "shared"))
TRACE = SHARED / "data" / "traces" / "tau_bench_airline_gpt4o.json"
RESULT = ROOT / "bench" / "results" / "routing_affinity.json"
PREFIX_RESULT = ROOT / "bench" / "results" / "engine_prefix.json"

# ---------------------------------------------------------------- live ----------------------

SYSTEM_CHARS = 1200   # tau-bench's airline policy, cut (~250 tokens)
TURN_CHARS = 200      # each user / assistant message, cut


def sessions_from_trace(n: int, turns: int) -> list[list[list[dict[str, str]]]]:
    """``n`` sessions, each a list of ``turns`` requests' messages (system + the conversation
    up to the k-th user message), from the tau-bench airline trace."""
    out = []
    for episode in json.loads(TRACE.read_text())[:n]:
        traj = episode["traj"]
        system = {"role": "system", "content": traj[0]["content"][:SYSTEM_CHARS]}
        msgs: list[dict[str, str]] = []
        for m in traj[1:]:
            if m.get("role") not in ("user", "assistant") or not isinstance(m.get("content"), str):
                continue
            text = m["content"][:TURN_CHARS] or "..."
            if msgs and msgs[-1]["role"] == m["role"]:
                msgs[-1]["content"] += "\n" + text
            else:
                msgs.append({"role": m["role"], "content": text})
        user_ends = [i + 1 for i, m in enumerate(msgs) if m["role"] == "user"][:turns]
        out.append([[system, *msgs[:end]] for end in user_ends])
    return out


def run_live_mode(mode: str, replicas: int, sessions: list[list[list[dict[str, str]]]],
                  tmp: Path, max_tokens: int) -> dict[str, Any]:
    """One routing mode on fresh replicas; the figures of the issue's ``live`` block."""
    with ExitStack() as stack:
        engines = [stack.enter_context(EngineProcess(
            model_dir(), threads=1, extra_args=["--max-context-len", "2048", "--threads", "1"],
            log_path=tmp / f"engine-{mode}-{i}.log")) for i in range(replicas)]
        policy = parse_policy({
            "backends": {"fleet": {"kind": "openai_compat", "timeout_s": 300,
                                   "affinity": {"mode": mode if mode != "oracle" else "prefix"},
                                   "deployments": [{"base_url": e.base_url + "/v1",
                                                    "name": f"r{i}"}
                                                   for i, e in enumerate(engines)]}},
            "routes": [{"match": "*", "backend": "fleet"}],
            "ledger": {"path": str(tmp / f"ledger-{mode}.sqlite")}})
        ledger = Ledger(policy.ledger.path)
        url = stack.enter_context(serve_app(build_app(policy, ledger=ledger, rewrite_fn=None,
                                                      analyze=False)))
        statuses: list[int] = []

        def session(turns: list[list[dict[str, str]]]) -> None:
            with httpx.Client(timeout=600) as client:
                for msgs in turns:
                    with client.stream("POST", url + "/v1/chat/completions", json={
                            "model": "smollm2", "messages": msgs, "max_tokens": max_tokens,
                            "temperature": 0, "stream": True,
                            "stream_options": {"include_usage": True}}) as r:
                        for _ in r.iter_bytes():
                            pass
                        statuses.append(r.status_code)

        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(len(sessions)) as pool:
            list(pool.map(session, sessions))
        wall = time.monotonic() - t0
        rows = ledger.rows()
    ok = [r for r in rows if r["status"] == "ok"]
    prompt = sum(r["prompt_tokens"] or 0 for r in ok)
    cached = sum(r["cached_tokens"] or 0 for r in ok)
    ttft = [r["ttft_ms"] for r in ok if r["ttft_ms"] is not None]
    served = collections.Counter(r["deployment"] for r in ok)
    loads = [served.get(f"r{i}", 0) for i in range(replicas)]
    return {"cached_share": round(cached / prompt, 3) if prompt else None,
            "ttft_p50_ms": _r(percentile(ttft, 50)), "ttft_p95_ms": _r(percentile(ttft, 95)),
            "max_min_load": round(max(loads) / min(loads), 2) if min(loads) else None,
            "served_per_replica": loads, "requests": len(rows),
            "rejected": sum(1 for s in statuses if s != 200), "wall_s": round(wall, 1)}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


LIVE_MODES = (("round_robin", "round_robin", 3), ("least_load", "least_load", 3),
              ("prefix", "prefixgate", 3), ("oracle", "oracle", 1))


def run_live(n_sessions: int, turns: int, max_tokens: int, only: list[str] | None = None,
             old: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``live`` block; ``only``: the modes to run, the others kept from ``old``."""
    sessions = sessions_from_trace(n_sessions, turns)
    out: dict[str, Any] = dict(old or {})
    with tempfile.TemporaryDirectory() as d:
        for mode, name, replicas in LIVE_MODES:
            if only and name not in only:
                continue
            print(f"live: {name} ...", flush=True)
            out[name] = run_live_mode(mode, replicas, sessions, Path(d), max_tokens)
            print(f"live: {name} {out[name]}", flush=True)
            if name == "oracle":
                out["oracle"] = {"cached_share": out["oracle"]["cached_share"],
                                 "ttft_p50_ms_one_replica": out["oracle"]["ttft_p50_ms"]}
    return out


# ---------------------------------------------------------------- simulation ----------------


@dataclass
class SimConfig:
    """Workload of the simulation (tokens, ms). ``prefill_ms_per_token``: the engine's cold
    prefill cost; ``cached_ms_per_token``: what a cached token still costs (the warm
    prompt's extra over its uncached suffix in the same file, per cached token)."""

    replicas: int = 16
    sessions: int = 200
    turns: int = 8
    system_tokens: int = 1500      # shared by every session (one agent, as in tau-bench)
    first_user_tokens: int = 200
    turn_tokens: int = 250         # assistant + tool results + user, added each turn
    cache_tokens: int = 60_000     # KV slots per replica
    load: float = 0.70
    prefill_ms_per_token: float = 3.0
    cached_ms_per_token: float = 0.05
    seed: int = 7


@dataclass
class Replica:
    """FIFO prefill server with an LRU cache of session prefixes (and the shared system)."""

    free_at: float = 0.0
    queue: int = 0
    lru: collections.OrderedDict[str, int] = field(default_factory=collections.OrderedDict)

    def cached(self, session: str, cfg: SimConfig) -> int:
        system = cfg.system_tokens if "system" in self.lru else 0
        return max(system, self.lru.get(session, 0))

    def store(self, session: str, tokens: int, cfg: SimConfig) -> None:
        for key, n in (("system", cfg.system_tokens), (session, tokens)):
            self.lru.pop(key, None)
            self.lru[key] = n
        while sum(v for k, v in self.lru.items() if k != "system") + cfg.system_tokens > (
                cfg.cache_tokens) and len(self.lru) > 2:
            oldest = next(k for k in self.lru if k not in ("system", session))
            del self.lru[oldest]


def simulate(policy: str, cfg: SimConfig) -> dict[str, Any]:
    """Run the workload under ``policy`` (round_robin, least_load, prefixgate, oracle)."""
    rng = random.Random(cfg.seed)
    prompt_at = [cfg.system_tokens + cfg.first_user_tokens + k * cfg.turn_tokens
                 for k in range(cfg.turns)]
    cold_work_ms = sum(prompt_at) * cfg.sessions * cfg.prefill_ms_per_token
    horizon_ms = cold_work_ms / (cfg.load * cfg.replicas)
    gap = horizon_ms / cfg.turns
    events: list[tuple[float, int, int]] = []  # (arrival ms, session, turn)
    for s in range(cfg.sessions):
        start = rng.uniform(0, gap)
        for k in range(cfg.turns):
            heapq.heappush(events, (start + k * gap + rng.uniform(-0.2, 0.2) * gap, s, k))
    reps = [Replica() for _ in range(cfg.replicas)]
    names = [f"r{i}" for i in range(cfg.replicas)]
    balancer = Balancer(now=lambda: 0.0)
    settings = AffinitySettings(mode="prefix")
    inflight: list[list[float]] = [[] for _ in reps]  # finish times of requests in system
    ttft, cached_sum, prompt_sum = [], 0, 0
    served = collections.Counter[int]()
    turn = 0
    while events:
        t, s, k = heapq.heappop(events)
        for fl in inflight:
            fl[:] = [f for f in fl if f > t]
        loads = [len(fl) for fl in inflight]
        key = f"session-{s}"
        if policy == "round_robin":
            i = turn % cfg.replicas
        elif policy in ("least_load", "oracle"):
            i = min(range(cfg.replicas), key=lambda j: (loads[j], (j - turn) % cfg.replicas))
        else:
            placed = balancer.place(key, names, settings)
            i = choose(names, loads, key, settings, placed=placed).index
        turn += 1
        rep = reps[i]
        prompt = prompt_at[k]
        cached = prompt_at[k - 1] if (policy == "oracle" and k) else rep.cached(key, cfg)
        cached = min(cached, prompt - 1)
        service = (prompt - cached) * cfg.prefill_ms_per_token + cached * cfg.cached_ms_per_token
        begin = max(t, rep.free_at)
        rep.free_at = begin + service
        inflight[i].append(rep.free_at)
        rep.store(key, prompt, cfg)
        ttft.append(rep.free_at - t)
        cached_sum, prompt_sum = cached_sum + cached, prompt_sum + prompt
        served[i] += 1
    loads = [served[i] for i in range(cfg.replicas)]
    return {"cached_share": round(cached_sum / prompt_sum, 3),
            "ttft_p50_ms": _r(percentile(ttft, 50)), "ttft_p90_ms": _r(percentile(ttft, 90)),
            "max_min_load": round(max(loads) / min(loads), 2)}


def prefill_cost() -> tuple[float, float, str]:
    """(cold ms per token, ms per cached token, where from) out of engine_prefix.json."""
    fig = json.loads(PREFIX_RESULT.read_text())["figures"]["prefix"]["2048"]
    cold = fig["cold_ttft_ms"] / 2048
    cached = max(0.0, fig["warm_ttft_ms"] - fig["suffix_only_ttft_ms"]) / 2048
    return cold, cached, "bench/results/engine_prefix.json prefix.2048 (cold_ttft_ms / 2048; " \
        "(warm - suffix_only) / 2048 per cached token)"


def run_sim() -> dict[str, Any]:
    cold, cached, source = prefill_cost()
    cfg = SimConfig(prefill_ms_per_token=round(cold, 3), cached_ms_per_token=round(cached, 4))
    per = {p: simulate(p, cfg) for p in ("round_robin", "least_load", "prefixgate", "oracle")}
    ratio = per["round_robin"]["ttft_p90_ms"] / per["prefixgate"]["ttft_p90_ms"]
    return {"ttft_p90_ratio_vs_round_robin": round(ratio, 2),
            "max_min_load": per["prefixgate"]["max_min_load"], "per_policy": per,
            "config": {**cfg.__dict__, "cost_source": source}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["live", "sim"], default=None)
    ap.add_argument("--sessions", type=int, default=6)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--modes", default="", help="live modes to re-run, comma-separated "
                    "(round_robin,least_load,prefixgate,oracle); the rest are kept")
    args = ap.parse_args()
    old = json.loads(RESULT.read_text()) if RESULT.exists() else {}
    figures = dict(old.get("figures", {}))
    if args.only in (None, "sim"):
        figures["simulated"] = run_sim()
        print(json.dumps(figures["simulated"], indent=1), flush=True)
    if args.only in (None, "live"):
        modes = [m for m in args.modes.split(",") if m]
        figures["live"] = run_live(args.sessions, args.turns, args.max_tokens, modes,
                                   figures.get("live") if modes else None)
    command = result_command(__file__, prefix="nice python")
    if (args.modes or args.only) and old.get("command"):  # what is kept came from before
        command = f"{old['command']}; then {command}"
    out: dict[str, Any] = {"command": command,
                           "figures": figures,
                           "goals": {"cached_share_vs_oracle": "within 0.05",
                                     "ttft_p90_ratio_vs_round_robin": ">= 3",
                                     "max_min_load": "<= 1.5"}}
    write_json(RESULT, out, indent=1)
    print(json.dumps(figures.get("live", {}), indent=1))


if __name__ == "__main__":
    main()
