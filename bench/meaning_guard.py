"""Show the meaning guard works (issue 36, item 3): verdicts behind scripted upstreams and our
engine, what they cost, and the cached share they buy.

    nice -n 10 .venv/bin/python bench/meaning_guard.py [--quick] [--no-engine] [--out FILE]

Scenario (:mod:`bench.guard_replay`): the real proxy app (``build_app``; the shipped defaults —
every move ``guarded``, the guard's settings — except the route's ``meaning_guard_budget``, which a
hosted route needs before any trial runs: :data:`BUDGET`) in front of each scripted upstream of
:mod:`bench.guard_upstreams` (``unaffected``, ``affected``, ``noisy``; OpenAI's prefix-cache rule
behind ``cached_tokens``). ``--sessions`` tau-bench airline runs are replayed through it as
clients, one session after another, each request streamed, the system prompt's clock advancing
6..90 s a request; trials run in the background, and while ``hoist_volatile`` is trialling the
client gives the upstream 0.25 s of quiet before its next request (an agent's think time:
a trial arriving while one runs is skipped, :meth:`bench.guard_replay.Rig.replay`); at the end the run waits until the upstream
has been quiet for 1.5 s. Then, per backend:

- each move's verdict from the guard's snapshot (``ProxyState.meaning_guard.snapshot()``, the
  last answer's ``x-prefixgate-guard`` header without one): state, pairs, move rate vs floor; the expected verdict: for
  ``hoist_volatile`` ``on`` / ``off`` / ``on`` (by construction of the upstream), for any other
  move that reached a verdict, from the upstream's own deterministic answer function over the
  replayed requests with that move on vs off (:func:`true_change_rate`: ``on`` below the margin);
- ``decided_at``: the first client answer whose header shows ``hoist_volatile`` decided; the
  sessions that start after it are "once decided";
- ``cached_share_turn3_on``: cached / prompt tokens of the client requests from each session's
  third request on (``turn >= 2``), in the sessions once decided, as the upstream's usage says;
- ``moves_applied_after_verdict``: client requests after ``decided_at`` whose ``x-prefixgate-edits``
  names a move the guard turned off, or that the upstream saw hoisted;
- trials: calls the upstream classed as trials (non-streamed, temperature 0, ``max_tokens`` <=
  16), their tokens and USD at gpt-4o-mini's input price, against the budget;
  ``trial_answers_to_clients``: client answers whose id is a trial call's (or no call's).

Comparisons behind ``unaffected``: every move forced ``on`` and forced ``off`` (no guard, no
trials). ``tight_budget``: ``unaffected`` with a budget of 9 requests a day (3 trials): the
upstream must see at most 9 trial calls. The engine part: :mod:`bench.meaning_guard_engine`.

Writes ``bench/results/meaning_guard.json``: ``{"command", "commit", "load_average", "at",
"figures": {"verdicts_right", "verdicts_total", "max_pairs_to_verdict", "budget_exceeded",
"trial_answers_to_clients", "cached_share_unaffected_turn3_on",
"cached_share_unaffected_forced_on_turn3_on", "cached_share_unaffected_forced_off_turn3_on",
"affected_moves_applied_after_verdict"}, "goals", "backends": {name: {...}}, "engine", "setup"}``.
``--quick``: 12 sessions, no engine part. The engine part is the slow one (SmolLM2 on CPU):
``--no-engine`` keeps the file's ``engine`` section, ``--engine-only`` runs it alone and keeps
the backends (each section carries its own command). Measured on the shared 2-core box: the
proxy part 4.5 min, the engine part 4.4 min at load 2-3 and 10.7 min at load 7.5 (``setup.wall_s``,
``engine.wall_s``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.guard_replay import MOVES, Rig, Sent, applied_passes, forced, guard_states, rig, tau_sessions  # noqa: E402
from bench.guard_upstreams import answer_index  # noqa: E402
from bench.result_file import provenance, read_json, write_json  # noqa: E402

OUT = REPO / "bench" / "results" / "meaning_guard.json"
PREFIX = "nice -n 10 .venv/bin/python"
BUDGET = {"requests_per_day": 1500, "tokens_per_day": 12_000_000, "usd_per_day": 3.0}
"""The scripted routes' trial budget: room for 200 pairs (600 sends of ~6k tokens) of two moves."""
TIGHT = {"requests_per_day": 9, "tokens_per_day": 12_000_000, "usd_per_day": 3.0}
USD_PER_MTOK = 0.15
"""gpt-4o-mini's uncached input price (the trials' cost here; output is at most 16 tokens)."""
EXPECTED_HOIST = {"unaffected": "on", "affected": "off", "noisy": "on"}
GOALS = {"verdicts_right": ("==", "verdicts_total"), "max_pairs_to_verdict": ("<=", 200),
         "budget_exceeded": ("==", 0), "trial_answers_to_clients": ("==", 0),
         "cached_share_unaffected_turn3_on": (">=", 0.78),
         "affected_moves_applied_after_verdict": ("==", 0)}


def share(sent: list[Sent]) -> float | None:
    """Cached / prompt tokens of ``sent`` (None when empty)."""
    prompt = sum(s.prompt_tokens for s in sent)
    return round(sum(s.cached_tokens for s in sent) / prompt, 4) if prompt else None


def last_states(r: Rig) -> dict[str, tuple[str, int]]:
    """Each move's (state, pairs) as the last client answer's header shows it."""
    for s in reversed(r.sent):
        if s.guard:
            return guard_states(s.guard)
    return {}


def true_change_rate(sessions: list[list[dict[str, Any]]], behaviour: str, move: str
                     ) -> float | None:
    """The share of requests where ``move`` applies whose deterministic answer (the upstream's
    function, no noise) differs with the move on vs off (every other move off; session memory
    carried per arm as the proxy does). None when the move never applies."""
    from prefixgate.config.schema import RewriteSettings
    from prefixgate.rewriter.pipeline import rewrite_request, session_updates
    from prefixgate.rewriter.types import Context

    beh = "unaffected" if behaviour == "noisy" else behaviour
    applied = diff = 0
    for bodies in sessions:
        mem_on: dict[str, Any] = {}
        mem_off: dict[str, Any] = {}
        for body in bodies:
            arms = []
            for mode, mem in (("on", mem_on), ("off", mem_off)):
                settings = RewriteSettings(**{**forced("off"), move: mode})
                res = rewrite_request(body, "openai", Context(settings, model="gpt-4o-mini",
                                                              provider="openai", session=dict(mem)))
                mem.update(session_updates(res))
                arms.append(res)
            if any(e.pass_name == move and e.applied for e in arms[0].edits):
                applied += 1
                diff += answer_index(arms[0].body, beh) != answer_index(arms[1].body, beh)  # type: ignore[arg-type]
    return round(diff / applied, 3) if applied else None


def backend_detail(behaviour: str, r: Rig, sessions: list[list[dict[str, Any]]], margin: float,
                   budget: dict[str, Any]) -> dict[str, Any]:
    """The per-backend section (module docstring)."""
    states = last_states(r)
    health = r.verdicts()
    decided_at = next((i for i, s in enumerate(r.sent)
                       if guard_states(s.guard).get("hoist_volatile", ("trialling", 0))[0]
                       != "trialling"), None)
    moves: dict[str, Any] = {}
    for move in MOVES:
        state, pairs = states.get(move, ("trialling", 0))
        row = health.get(move, {})
        entry: dict[str, Any] = {"verdict": row.get("state", state),
                                 "pairs": int(row.get("pairs", pairs)),
                                 "move_rate": row.get("move_rate"), "floor_rate": row.get("floor_rate"),
                                 "reason": row.get("reason")}
        if move == "hoist_volatile":
            entry["expected"] = EXPECTED_HOIST[behaviour]
        elif entry["verdict"] != "trialling":
            rate = true_change_rate(sessions, behaviour, move)
            entry["true_change_rate"] = rate
            entry["expected"] = "on" if rate is not None and rate < margin else "off"
        if "expected" in entry:
            entry["right"] = entry["verdict"] == entry["expected"]
        moves[move] = entry
    off_moves = [m for m, e in moves.items() if e["verdict"] == "off"]
    after = r.sent[decided_at + 1:] if decided_at is not None else []
    applied_after = sum(1 for s in after
                        if applied_passes(s.edits) & set(off_moves)
                        or (moves["hoist_volatile"]["verdict"] == "off"
                            and (c := r.upstream.call_of(s.answer_id)) is not None and c.hoisted))
    first_decided_session = (r.sent[decided_at].session + 1) if decided_at is not None else None
    late = [s for s in r.sent if s.turn >= 2 and first_decided_session is not None
            and s.session >= first_decided_session]
    counts = r.upstream.counts()
    trial_tokens = counts["trial_prompt_tokens"] + counts["trial_completion_tokens"]
    trial_usd = round(counts["trial_prompt_tokens"] * USD_PER_MTOK / 1e6, 4)
    return {
        "moves": moves, "decided_at_request": decided_at,
        "sessions_once_decided": (len(sessions) - first_decided_session)
        if first_decided_session is not None else 0,
        "cached_share_turn3_on": share(late),
        "cached_share_turn3_on_all_sessions": share([s for s in r.sent if s.turn >= 2]),
        "moves_applied_after_verdict": applied_after if off_moves else None,
        "client_requests": len(r.sent), "client_errors": sum(s.status != 200 for s in r.sent),
        "upstream": counts,
        "trials": {"requests": counts["trial_calls"], "tokens": trial_tokens, "usd": trial_usd,
                   "budget": budget,
                   "exceeded": counts["trial_calls"] > budget["requests_per_day"]
                   or trial_tokens > budget["tokens_per_day"] or trial_usd > budget["usd_per_day"]},
        "trial_answers_to_clients": r.trial_answers_to_clients()}


def scenario(behaviour: str, sessions: list[list[dict[str, Any]]], tmp: Path, margin: float,
             budget: dict[str, Any] | None = None, rewrite: dict[str, Any] | None = None
             ) -> dict[str, Any]:
    """One replay (module docstring) and its section."""
    t0 = time.monotonic()
    with rig(behaviour, tmp / f"{behaviour}-{time.monotonic_ns()}", budget=budget,
             rewrite=rewrite) as r:
        r.replay(sessions, behaviour, think=True)
        r.settle()
        out = backend_detail(behaviour, r, sessions, margin, budget or {
            "requests_per_day": 0, "tokens_per_day": 0, "usd_per_day": 0.0})
    out["wall_s"] = round(time.monotonic() - t0, 1)
    print(f"{behaviour} {'forced ' + str(rewrite) if rewrite else ''}: "
          + json.dumps({k: out[k] for k in ("decided_at_request", "cached_share_turn3_on",
                                            "moves_applied_after_verdict", "trials")})
          + " " + json.dumps({m: (e["verdict"], e["pairs"]) for m, e in out["moves"].items()}),
          flush=True)
    return out


def figures(backends: dict[str, Any], engine: dict[str, Any] | None) -> dict[str, Any]:
    """The headline figures (module docstring) from the sections."""
    judged = [e for name in ("unaffected", "affected", "noisy")
              for e in backends[name]["moves"].values() if "expected" in e]
    judged += list((engine or {}).get("moves", {}).values())
    decided = [e for e in judged if e["verdict"] != "trialling"]
    return {
        "verdicts_right": sum(e["verdict"] == e["expected"] for e in judged),
        "verdicts_total": len(judged),
        "verdicts_undecided": len(judged) - len(decided),
        "max_pairs_to_verdict": max((e["pairs"] for e in decided), default=None),
        "budget_exceeded": sum(b["trials"]["exceeded"] for b in backends.values()),
        "trial_answers_to_clients": sum(b["trial_answers_to_clients"] for b in backends.values()),
        "cached_share_unaffected_turn3_on": backends["unaffected"]["cached_share_turn3_on"],
        "cached_share_unaffected_forced_on_turn3_on":
            backends["unaffected_forced_on"]["cached_share_turn3_on_all_sessions"],
        "cached_share_unaffected_forced_off_turn3_on":
            backends["unaffected_forced_off"]["cached_share_turn3_on_all_sessions"],
        "affected_moves_applied_after_verdict": backends["affected"]["moves_applied_after_verdict"],
        "tight_budget_trial_requests": backends["tight_budget"]["trials"]["requests"],
        "tight_budget_requests_per_day": TIGHT["requests_per_day"]}


def goals(fig: dict[str, Any]) -> dict[str, Any]:
    """Each goal of issue 36 met or not."""
    out = {}
    for key, (op, target) in GOALS.items():
        want = fig[target] if isinstance(target, str) else target
        got = fig[key]
        ok = got is not None and (got == want if op == "==" else got <= want if op == "<="
                                  else got >= want)
        out[key] = {"goal": f"{op} {want}", "got": got, "met": ok}
    return out


def engine_section(runs: int) -> dict[str, Any]:
    """The engine part (:mod:`bench.meaning_guard_engine`), with its own provenance."""
    from bench.meaning_guard_engine import DEFAULT_MODEL, run

    t0 = time.monotonic()
    engine = run(DEFAULT_MODEL, runs, 6)
    engine["wall_s"] = round(time.monotonic() - t0, 1)
    print("engine:", json.dumps(engine["moves"]), flush=True)
    return engine


def main(argv: list[str] | None = None) -> int:
    """Run the scenarios and write the results file."""
    from prefixgate.config.schema import GuardSettings

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=40, help="tau-bench runs replayed per backend")
    ap.add_argument("--quick", action="store_true", help="12 sessions, no engine part")
    ap.add_argument("--no-engine", action="store_true",
                    help="keep the results file's engine section (the engine part is the slow one)")
    ap.add_argument("--engine-only", action="store_true",
                    help="run the engine part alone; keep the file's backends")
    ap.add_argument("--engine-runs", type=int, default=17, help="tau runs of the engine corpus")
    ap.add_argument("--engine-json", type=Path, default=None,
                    help="the engine section from this file (bench/meaning_guard_engine.py's "
                         "output) instead of running it; with --engine-command, how it was made")
    ap.add_argument("--engine-command", default="nice -n 10 .venv/bin/python "
                    "bench/meaning_guard_engine.py")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    prev = read_json(args.out)
    n = 12 if args.quick else args.sessions
    margin = GuardSettings().margin
    t0 = time.monotonic()
    if args.engine_only:
        engine = {**engine_section(args.engine_runs), **provenance(__file__, argv, prefix=PREFIX)}
        doc = {**prev, "engine": engine}
        doc["figures"] = figures(prev["backends"], engine)
        doc["goals"] = goals(doc["figures"])
        write_json(args.out, doc)
        print(json.dumps({"figures": doc["figures"], "goals": doc["goals"]}, indent=2))
        return 0
    sessions = tau_sessions(n)
    tmp = Path(tempfile.mkdtemp(prefix="pg-guard-"))
    backends = {b: scenario(b, sessions, tmp, margin, BUDGET)
                for b in ("unaffected", "affected", "noisy")}
    backends["unaffected_forced_on"] = scenario("unaffected", sessions, tmp, margin,
                                                rewrite=forced("on"))
    backends["unaffected_forced_off"] = scenario("unaffected", sessions, tmp, margin,
                                                 rewrite=forced("off"))
    backends["tight_budget"] = scenario("unaffected", sessions[:5], tmp, margin, TIGHT)
    if args.engine_json:
        engine = {**json.loads(args.engine_json.read_text()), "command": args.engine_command}
    elif args.no_engine or args.quick:
        engine = prev.get("engine")
    else:
        engine = {**engine_section(args.engine_runs), **provenance(__file__, argv, prefix=PREFIX)}
    fig = figures(backends, engine)
    doc = {**provenance(__file__, argv, prefix=PREFIX), "figures": fig,
           "goals": goals(fig), "backends": backends, "engine": engine,
           "setup": {"sessions": n, "trace": "traces/tau_bench_airline_gpt4o.json (runs 0..n-1)",
                     "budget": BUDGET, "guard": GuardSettings().model_dump(mode="json"),
                     "cache_rules": "openai (128-token blocks from 1,024 tokens)",
                     "client": "streamed, temperature 0, max_tokens 64, one session at a time",
                     "wall_s": round(time.monotonic() - t0, 1)}}
    write_json(args.out, doc)
    print(json.dumps({"figures": fig, "goals": doc["goals"]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
