"""What the proxy adds, side by side in one run: direct, prefixgate, LiteLLM (issue 10).

    python bench/proxy_overhead.py [--requests 300] [--wrk-seconds 10] [--rounds 3]
        [--profile-seconds 8] [--no-litellm] [--no-workers] [--out bench/results/proxy_overhead.json]

One fake upstream (``bench/fake_upstream.py``, its own process: a canned ``chat.completion`` or
SSE answer at once) and, each in its own process on loopback, one worker each:

- ``direct``: the client talks to the upstream itself;
- ``small_off`` / ``agent_off``: ``prefixgate serve`` with ``rewrite.enabled: false``, a 1 KB
  body and the tau-bench airline agent request closest to 29 KB (tools + history, from
  ``../shared/data/traces/``), both compact JSON as the OpenAI SDK sends them;
- ``agent_on``: another ``prefixgate serve`` with the shipped rewrite passes on, 29 KB body;
- ``floor_small`` / ``floor_agent``: ``bench/relay_floor.py``, a bare relay on prefixgate's
  stack (uvicorn + uvloop + httptools, one aiohttp session, no framework, no body parsing):
  what any proxy built on it adds here, the floor under prefixgate's figures (1 KB and 29 KB;
  also ``wrk`` throughput of the 1 KB body);
- ``litellm``: the LiteLLM proxy (``litellm[proxy]`` in its own venv, made on first use under
  ``~/.cache/prefixgate/litellm-venv``; a ``master_key``, no database, no callbacks, one
  worker), the 1 KB body.

Figures (ms, req/s):

- ``added_p50_ms`` / ``added_p99_ms``: sequential non-streamed requests on one keep-alive
  connection, ``--requests`` per target, the targets interleaved request by request in a
  seeded shuffled order (so drift, and the previous target's after-answer work, hit all
  alike); each figure = the target's percentile minus direct's, same body;
- ``first_chunk_added_ms``: streamed requests, time to the first body chunk, p50 minus direct's;
- ``throughput_rps``: ``wrk -t1 -c32 -d<s>`` POSTing the body (Debian ``wrk``).

Rounds (issue 25): the whole set of figures is measured ``--rounds`` times, one round after
another; each figure is the median over the rounds and ``spread`` gives its median / min / max.
``workers_scaling``: ``wrk`` throughput of ``--workers 2`` servers next to the one-worker ones
(1 KB rewrite off, 29 KB rewrite on), in the same rounds, with what 2 shared cores allow and
why. ``profile_top``: :mod:`hot_path_profile`'s top entries (py-spy under ``wrk``), per case.

Output: ``{"command", "figures": {"added_p50_ms": {"small_off", "agent_off", "agent_on",
"litellm"}, "added_p99_ms": {...}, "first_chunk_added_ms": {"small_off", "litellm"},
"throughput_rps": {"direct", "small_off", "agent_on", "litellm"}}, "spread": {same keys:
{"median", "min", "max"}}, "goals", "workers_scaling", "profile_top", "setup": {...},
"runs": [...]}``. ``runs`` keeps every run written to ``--out``, oldest first: each one's
command, time, commit, ``--label``, load average (1 / 5 / 15 min, at its start and end:
``os.getloadavg``) and its figures (the previous file's runs are carried over).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.hot_path_profile import profile_all  # noqa: E402
from bench.proxy_targets import (  # noqa: E402
    LITELLM_VENV,
    SMALL,
    agent_body,
    sequential,
    start_floor,
    start_litellm,
    start_prefixgate,
    start_upstream,
    wire,
    wrk,
)
from bench.result_file import command, commit, load_average, read_json, utc_now, write_json  # noqa: E402
from prefixgate.cache.savings.report import percentile  # noqa: E402

GOALS = {("added_p50_ms", "small_off"): 1.0, ("added_p50_ms", "agent_off"): 1.5,
         ("added_p50_ms", "agent_on"): 2.0, ("first_chunk_added_ms", "small_off"): 1.0,
         ("throughput_rps", "small_off"): 1500.0, ("throughput_rps", "agent_on"): 800.0}
"""Issue 25's goals (issue 10's, agent_on tightened from 3.0 to 2.0 ms): latencies at most,
throughputs at least (and >= 50x LiteLLM's rps)."""


def goals(figures: dict[str, dict[str, float | None]]) -> dict[str, Any]:
    """Each goal with what was measured and whether it is met."""
    out: dict[str, Any] = {}
    for (fig, key), goal in GOALS.items():
        got = figures[fig][key]
        met = got is not None and (got >= goal if fig == "throughput_rps" else got <= goal)
        out[f"{fig}.{key}"] = {"goal": goal, "measured": got, "met": met}
    rps = figures["throughput_rps"]
    if rps.get("litellm") and rps.get("small_off"):
        ratio = rps["small_off"] / rps["litellm"]  # type: ignore[operator]
        out["throughput_vs_litellm"] = {"goal": 50.0, "measured": round(ratio, 1),
                                        "met": ratio >= 50.0}
    return out


def spread(values: list[float]) -> dict[str, float]:
    """``{"median", "min", "max"}`` of one figure over the rounds (rounded)."""
    vs = sorted(values)
    return {"median": round(percentile(vs, 50), 3), "min": round(vs[0], 3),
            "max": round(vs[-1], 3)}


def one_round(seq: dict[str, tuple[str, bytes]], first: dict[str, tuple[str, bytes]],
              rps_targets: dict[str, tuple[str, bytes]], args: argparse.Namespace, tmp: Path
              ) -> dict[str, dict[str, float | None]]:
    """One round's figures: latencies interleaved request by request, then one ``wrk`` run
    per throughput target (module docstring)."""
    lat = sequential(seq, args.requests, stream=False)
    fc = sequential(first, args.requests // 2, stream=True)
    rps = {k: wrk(url, body, args.wrk_seconds, tmp) for k, (url, body) in rps_targets.items()}

    def added(q: float) -> dict[str, float | None]:
        base = {"small_off": "direct_small", "agent_off": "direct_agent",
                "agent_on": "direct_agent", "litellm": "direct_small",
                "floor_small": "direct_small", "floor_agent": "direct_agent"}
        return {k: (round(percentile(lat[k], q) - percentile(lat[b], q), 3) if k in lat else None)
                for k, b in base.items()}

    return {
        "added_p50_ms": added(50), "added_p99_ms": added(99),
        "first_chunk_added_ms": {
            k: (round(percentile(fc[k], 50) - percentile(fc["direct"], 50), 3)
                if k in fc else None) for k in ("small_off", "litellm")},
        "throughput_rps": {k: (round(rps[k], 1) if k in rps else None)
                           for k in ("direct", "small_off", "agent_on", "litellm",
                                     "floor_small")},
        "workers_rps": {**{f"w1_{k}": round(rps[k], 1) for k in ("small_off", "agent_on")},
                        **{k: round(v, 1) for k, v in rps.items() if k.startswith("w2_")}},
        "direct_p50_ms": {"small": round(percentile(lat["direct_small"], 50), 3),
                          "agent": round(percentile(lat["direct_agent"], 50), 3)},
    }


def combine(rounds: list[dict[str, dict[str, float | None]]]
            ) -> tuple[dict[str, dict[str, float | None]], dict[str, dict[str, Any]]]:
    """(the medians over the rounds in the figures' shape, each figure's spread)."""
    medians: dict[str, dict[str, float | None]] = {}
    spreads: dict[str, dict[str, Any]] = {}
    for fig in rounds[0]:
        medians[fig], spreads[fig] = {}, {}
        for key in rounds[0][fig]:
            vals = [r[fig][key] for r in rounds if r[fig].get(key) is not None]
            if not vals:
                medians[fig][key] = spreads[fig][key] = None
                continue
            sp = spread(vals)  # type: ignore[arg-type]
            medians[fig][key], spreads[fig][key] = sp["median"], sp
    return medians, spreads


WORKERS_WHY = {
    "scaled": (
        "2 workers on 2 CPUs shared with the client (wrk) and the fake upstream: one worker is "
        "one process, so one GIL — its event loop, its rewrite threads and its after-answer "
        "analysis take turns on one core while wrk and the raw-asyncio upstream leave most of the "
        "second core idle; a second worker is a second GIL on that core. The rewrite-on case can "
        "pass 2x: in one process the loop waits for the GIL its own threads hold (rewrite, "
        "analysis), two processes halve that contention. Measured on a quiet box (load average "
        "in setup); with other jobs on the cores the second worker has no core to take."),
    "flat": (
        "2 workers on 2 CPUs that also run the client (wrk), the fake upstream and other jobs "
        "(load average in setup): one worker already keeps about one core busy and the other "
        "core is taken by wrk, the upstream and the other jobs, so a second worker mostly "
        "competes for the same cores; the >= 1.8x goal needs a core free for it."),
}
"""Why ``--workers 2`` gave what it gave, by whether it reached 1.8x (``workers_scaling``)."""


def workers_scaling(medians: dict[str, dict[str, float | None]],
                    spreads: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Throughput of ``--workers 1`` (the throughput figures' servers, same round) vs
    ``--workers 2`` (1 KB rewrite off, 29 KB rewrite on)."""
    w = medians.get("workers_rps", {})
    out: dict[str, Any] = {"rps": w, "spread": spreads.get("workers_rps", {}),
                           "cpus": os.cpu_count()}
    for case in ("small_off", "agent_on"):
        one_w, two_w = w.get(f"w1_{case}"), w.get(f"w2_{case}")
        out[f"ratio_{case}"] = round(two_w / one_w, 2) if one_w and two_w else None
    ratios = [out["ratio_small_off"], out["ratio_agent_on"]]
    out["why"] = WORKERS_WHY["scaled" if all(r and r >= 1.8 for r in ratios) else "flat"]
    return out


def main() -> None:
    """Run the benchmark (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--wrk-seconds", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile-seconds", type=int, default=8, help="0: no profile_top")
    ap.add_argument("--no-litellm", action="store_true")
    ap.add_argument("--no-workers", action="store_true", help="skip workers_scaling")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "proxy_overhead.json"))
    ap.add_argument("--label", default="", help="what this run measures (kept in runs)")
    args = ap.parse_args()
    load_start, started = load_average(), utc_now()
    tmp = Path(tempfile.mkdtemp(prefix="pg-overhead-"))
    small, agent = wire(SMALL), wire(agent_body())
    small_stream = wire({**SMALL, "stream": True})
    procs: list[subprocess.Popen[bytes]] = []
    t0 = time.perf_counter()
    lite_why = None
    try:
        up_proc, up = start_upstream()
        procs.append(up_proc)
        off_proc, off = start_prefixgate(up, tmp, "off", rewrite=False)
        procs.append(off_proc)
        on_proc, on = start_prefixgate(up, tmp, "on", rewrite=True)
        procs.append(on_proc)
        lite = None
        if not args.no_litellm:
            try:
                lite_proc, lite = start_litellm(up, tmp)
                procs.append(lite_proc)
            except (RuntimeError, subprocess.CalledProcessError, OSError) as e:
                lite_why = f"LiteLLM could not be started: {e}"
        floor_proc, floor = start_floor(up)
        procs.append(floor_proc)
        seq = {"direct_small": (up, small), "small_off": (off, small),
               "direct_agent": (up, agent), "agent_off": (off, agent), "agent_on": (on, agent),
               "floor_small": (floor, small), "floor_agent": (floor, agent)}
        first = {"direct": (up, small_stream), "small_off": (off, small_stream)}
        rps_targets = {"direct": (up, small), "small_off": (off, small), "agent_on": (on, agent),
                       "floor_small": (floor, small)}
        if lite:
            seq["litellm"] = (lite, small)
            first["litellm"] = (lite, small_stream)
            rps_targets["litellm"] = (lite, small)
        if not args.no_workers:
            w2_off_proc, w2_off = start_prefixgate(up, tmp, "w2off", rewrite=False, workers=2)
            procs.append(w2_off_proc)
            w2_on_proc, w2_on = start_prefixgate(up, tmp, "w2on", rewrite=True, workers=2)
            procs.append(w2_on_proc)
            rps_targets |= {"w2_small_off": (w2_off, small), "w2_agent_on": (w2_on, agent)}
            for url, body in ((w2_off, small), (w2_on, agent)):
                wrk(url, body, 2, tmp)  # warm both workers' imports and token counters
        wrk(on, agent, 2, tmp)
        rounds = [one_round(seq, first, rps_targets, args, tmp) for _ in range(args.rounds)]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
    medians, spreads = combine(rounds)
    figures = {k: medians[k] for k in ("added_p50_ms", "added_p99_ms", "first_chunk_added_ms",
                                       "throughput_rps")}
    profile = None
    if args.profile_seconds > 0:
        profile = profile_all(args.profile_seconds, 12, tmp)
    cmd = command(__file__)
    load = {"start": load_start, "end": load_average()}
    run = {"command": cmd, "started": started, "commit": commit(), "label": args.label,
           "load_average": load, "figures": figures,
           "ratio_vs_litellm": goals(figures).get("throughput_vs_litellm", {}).get("measured"),
           "workers_rps": medians.get("workers_rps")}
    doc = {"command": cmd,
           "figures": figures,
           "spread": {k: spreads[k] for k in figures},
           "goals": goals(figures),
           "workers_scaling": None if args.no_workers else workers_scaling(medians, spreads),
           "profile_top": profile,
           "setup": {"requests": args.requests, "rounds": args.rounds,
                     "wrk": f"wrk -t1 -c32 -d{args.wrk_seconds}s",
                     "body_bytes": {"small": len(small), "agent": len(agent)},
                     "bodies": "compact JSON as the OpenAI SDK sends it; agent = the tau-bench "
                               "airline request closest to 29 KB",
                     "direct_p50_ms": medians["direct_p50_ms"],
                     "figures_are": "the median over the rounds; spread: median / min / max of "
                                    "the rounds, which run one after another (targets "
                                    "interleaved request by request within a round)",
                     "prefixgate": "prefixgate serve, 1 worker, default policy limits, ledger "
                                   "on disk (batched writer), aiohttp upstream client",
                     "litellm": (None if args.no_litellm else
                                 lite_why or _litellm_version()),
                     "wall_s": round(time.perf_counter() - t0, 1),
                     "load_average": load,
                     "machine": f"{os.cpu_count()} CPUs shared with other jobs; loopback; "
                                "client, proxies, upstream and wrk on the same cores"}}
    doc["runs"] = [*_previous_runs(Path(args.out)), run]
    write_json(args.out, doc)
    print(json.dumps(doc, indent=2))


def _previous_runs(path: Path) -> list[dict[str, Any]]:
    """The runs kept in ``path`` (none when it is missing or unreadable); a file written
    before runs were kept gives its one run (command, figures, setup's load if any)."""
    old = read_json(path)
    runs = old.get("runs")
    if isinstance(runs, list):
        return list(runs)
    if "figures" not in old:
        return []
    return [{"command": old.get("command"), "label": "written before runs were kept",
             "load_average": (old.get("setup") or {}).get("load_average"),
             "figures": old["figures"],
             "ratio_vs_litellm": (old.get("goals") or {}).get("throughput_vs_litellm", {})
             .get("measured"),
             "workers_rps": (old.get("workers_scaling") or {}).get("rps")}]


def _litellm_version() -> str:
    out = subprocess.run([str(LITELLM_VENV / "bin" / "pip"), "show", "litellm"],
                         capture_output=True, text=True).stdout
    m = re.search(r"Version: (\S+)", out)
    return f"litellm {m.group(1) if m else '?'} proxy, 1 worker, no DB, no callbacks"


if __name__ == "__main__":
    main()
