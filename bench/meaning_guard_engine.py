"""The meaning guard's verdicts on our engine with SmolLM2 (issue 36, item 3): note hoisting
stays off; a move that provably changes nothing the model reads is turned on.

The proxy has no move that changes nothing the model reads, so this part drives the guard's own
book (:class:`prefixgate.cache.guard.verdicts.GuardBook`, the rule and the comparison the proxy
uses: :func:`prefixgate.cache.guard.decisions.decision_of`, ``changed``) with pairs measured from
real engine answers, as the proxy's trial would take them:

- corpus: the tau-bench sessions of ``bench/answer_stability.py`` (policy cut to 900 characters,
  tool results to 400, the clock written three ways in turn; read in place), turns 1..``turns``;
- per request: the original, then the original again (the floor) with each variant still
  trialling, sent to the engine (in-process ``prefixgate.local_engine``, greedy, ``max_tokens``
  = the guard's 16) -> ``add_pair(move, changed(orig, variant), changed(orig, repeat))``;
  ``hoist_volatile``'s variant only where the pass applies (the rewriter with the move on, the
  note at the OpenAI default placement, session memory carried as the proxy does);
- the control move ``reserialise``: the same body with the keys of the body and of every message
  written in reverse order (what a client's JSON library may do). The engine renders its chat
  template from the parsed messages, so the token ids are identical — checked on every request
  (``ids_identical``), which is the proof that it changes nothing the model reads; its pairs
  are measured like the others' all the same.

Each move is fed, request by request, until its verdict is reached (at most the guard's
``max_pairs``, 200, or the corpus's end: then it is still ``trialling``). Expected: ``hoist_volatile``
off, ``reserialise`` on.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from pathlib import Path
from typing import Any

DEFAULT_MODEL = Path("~/.cache/prefixgate/models/SmolLM2-135M-Instruct").expanduser()
EXPECTED = {"hoist_volatile": "off", "reserialise": "on"}


def reserialise(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with the body's keys and every message's keys in reverse order (same values)."""
    msgs = [dict(reversed(list(m.items()))) for m in body["messages"]]
    return dict(reversed(list({**body, "messages": msgs}.items())))


def answer_doc(text: str) -> dict[str, Any]:
    """The engine's greedy text as a non-streamed Chat Completions answer."""
    return {"object": "chat.completion", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]}


def _cases(runs: int, turns: int, max_tokens: int) -> list[list[Any]]:
    from bench.stability_corpus import tau_cases

    sessions: dict[str, list[Any]] = {}
    for c in tau_cases(runs, turns, max_tokens, random.Random(19)):
        sessions.setdefault(c.session, []).append(c)
    return list(sessions.values())


def run(model: Path, runs: int, turns: int, max_pairs: int = 200) -> dict[str, Any]:
    """Measure the pairs on the engine and feed the guard (module docstring); returns the
    ``engine`` section of ``meaning_guard.json``."""
    from bench.stability_corpus import rewrite_session
    from prefixgate.cache.guard.decisions import changed, decision_of
    from prefixgate.cache.guard.sequential import TestRule
    from prefixgate.cache.guard.verdicts import GuardBook
    from prefixgate.cache.state.shared_state import LocalState
    from prefixgate.config.schema import GuardSettings
    from prefixgate.local_engine.engine import Engine, EngineConfig, SamplingParams
    from prefixgate.local_engine.server.chat import encode_chat

    gs = GuardSettings()
    rule = TestRule(gs.margin, gs.confidence, gs.look_every, min(gs.max_pairs, max_pairs))
    book = GuardBook(LocalState(), rule, gs.verdict_ttl_s)
    loop = asyncio.new_event_loop()
    eng = Engine(EngineConfig(model_path=str(model), num_kv_slots=65536, max_context_len=4096))
    params = SamplingParams(max_tokens=gs.max_tokens, temperature=0.0)
    pairs: dict[str, list[tuple[bool, bool]]] = {m: [] for m in EXPECTED}
    verdicts: dict[str, Any] = {}
    identical = total = 0
    t0 = time.monotonic()
    try:
        for session in _cases(runs, turns, gs.max_tokens):
            if len(verdicts) == len(EXPECTED) and all(
                    v.state != "trialling" for v in verdicts.values()):
                break
            for orig, sent, summary in rewrite_session(session, "openai", "auto",
                                                       hoist_volatile=True):
                open_moves = [m for m in EXPECTED
                              if m not in verdicts or verdicts[m].state == "trialling"]
                if "hoist_volatile" not in summary and "hoist_volatile" in open_moves:
                    open_moves.remove("hoist_volatile")
                if not open_moves:
                    continue
                ids = {"orig": encode_chat(eng.tokenizer, orig["messages"], orig.get("tools"))}
                ctl = reserialise(orig)
                ids["reserialise"] = encode_chat(eng.tokenizer, ctl["messages"], ctl.get("tools"))
                if "hoist_volatile" in open_moves:
                    ids["hoist_volatile"] = encode_chat(eng.tokenizer, sent["messages"],
                                                        sent.get("tools"))
                total += 1
                identical += ids["reserialise"] == ids["orig"]
                # the original first, alone; then its repeat and the variants together (the
                # repeat reads the original's prefix from the engine's cache, as a backend's
                # second send would)
                first = eng.generate_batch([ids["orig"]], params)
                rest = eng.generate_batch([ids["orig"], *(ids[m] for m in open_moves)], params)
                texts = [eng.tokenizer.decode(t, skip_special_tokens=True) for t in first + rest]
                d = [decision_of(answer_doc(t), "openai", gs.first_tokens) for t in texts]
                floor = changed(d[0], d[1])
                for move, variant in zip(open_moves, d[2:]):
                    pairs[move].append((changed(d[0], variant), floor))
                    verdicts[move] = loop.run_until_complete(book.add_pair(
                        "engine", "default", move, changed(d[0], variant), floor))
                print(f"[{time.monotonic() - t0:5.0f}s] request {total}: "
                      + ", ".join(f"{m} {v.header()}" for m, v in verdicts.items()), flush=True)
    finally:
        eng.shutdown()
        loop.close()
    moves = {m: {"verdict": v.state, "expected": EXPECTED[m], "right": v.state == EXPECTED[m],
                 "pairs": v.pairs, "move_rate": round(v.move_rate, 3),
                 "floor_rate": round(v.floor_rate, 3), "reason": v.reason,
                 "pairs_measured": len(pairs[m]),
                 "changed_measured": sum(a for a, _ in pairs[m]),
                 "floor_changed_measured": sum(b for _, b in pairs[m])}
             for m, v in verdicts.items()}
    return {"moves": moves, "requests_measured": total,
            "reserialise_ids_identical": f"{identical}/{total}",
            "how": "GuardBook driven directly with pairs measured from real engine answers (the "
                   "proxy has no move that changes nothing the model reads; module docstring of "
                   "bench/meaning_guard_engine.py)",
            "setup": {"model": model.name, "device": "cpu (fp32)", "greedy": True,
                      "max_tokens": gs.max_tokens, "first_tokens": gs.first_tokens,
                      "tau_runs": runs, "turns": turns}}


def main(argv: list[str] | None = None) -> int:
    """Print the engine section alone (``bench/meaning_guard.py`` writes it with the rest)."""
    import json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--runs", type=int, default=17)
    ap.add_argument("--turns", type=int, default=6)
    args = ap.parse_args(argv)
    print(json.dumps(run(args.model, args.runs, args.turns), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
