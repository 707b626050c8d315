"""Cost and correctness of the automatic session id (issue 19, item 4).

The system prompt: tau-bench airline's real policy (``../shared/data/traces/``), repeated past
64 KB (:data:`prefixgate.proxy.pipeline.session_key.SESSION_TEXT_CHARS` characters), with a
request-UUID line and a clock line as agent templates write them. A 13-turn loop (the issue's)
sends a new UUID and clock on every turn; the first user message carries a trace id.

Figures: microseconds per :func:`session_id_for` call — ``cold`` (empty memo: every line that
holds a digit is scanned), ``warm`` (the same conversation's next turns, 260 calls with a new
UUID, clock and trace id each: only the changed lines are scanned; p50 and p95), ``new_conversation`` (same system prompt, another first user message) — as the
median and max of the calls; and the sessions the 13 turns make under the old rule (digits
masked, nothing else) and the new one. Machine: whatever runs it (2 shared cores here).

    .venv/bin/python bench/session_key_cost.py
Writes ``bench/results/session_key_cost.json`` as ``{"command": ..., "figures": {...}}``.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.result_file import command, write_json  # noqa: E402
from prefixgate.proxy.pipeline import session_key  # noqa: E402
from prefixgate.proxy.pipeline.session_key import SESSION_TEXT_CHARS, session_id_for  # noqa: E402

TRACE = REPO.parent / "shared" / "data" / "traces" / "tau_bench_airline_gpt4o.json"
TURNS = 13
TIMED = 260
HEADERS = {"authorization": "Bearer bench"}


def _policy() -> str:
    runs = json.loads(TRACE.read_text())
    return str(runs[0]["traj"][0]["content"])


def _system(policy: str, k: int) -> str:
    head = (f"Request id: {uuid.uuid4()}\nThe current time is 2024-05-15 15:{k:02d}:07 EST.\n"
            f"Turn {k + 1} of the session.\n")
    text = head + policy
    while len(text) < SESSION_TEXT_CHARS:  # whole copies: past 64 K, the key's own cut applies
        text += "\n" + policy
    return text


def _body(system: str, user: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "system", "content": system},
                                       {"role": "user", "content": user}]}


def _old_rule(body: dict[str, Any]) -> str:
    """The rule before issue 19: digits of the system text masked, nothing else."""
    h = lambda t: hashlib.sha256(t.encode()).hexdigest()[:16]  # noqa: E731
    system = body["messages"][0]["content"].translate(str.maketrans("123456789", "000000000"))
    return h("|".join((h("Bearer bench"), h(system), h(body["messages"][1]["content"]))))


def _timed(body: dict[str, Any]) -> tuple[str, float]:
    t0 = time.perf_counter()
    sid = session_id_for(HEADERS, body)
    return sid, (time.perf_counter() - t0) * 1e6


def main() -> None:
    policy = _policy()
    user = "I want to change my flight. My user id is mia_li_3668 (trace {}).".format
    bodies = [_body(_system(policy, k), user(uuid.uuid4().hex)) for k in range(TURNS)]
    session_key._SYSTEM_MEMO.table.clear()
    session_key._USER_MEMO.table.clear()
    cold_sid, cold_us = _timed(bodies[0])
    warm = [_timed(b) for b in bodies[1:]]
    timing = [us for _ in range(TIMED // TURNS) for _, us in
              (_timed(_body(_system(policy, k), user(uuid.uuid4().hex))) for k in range(TURNS))]
    others = [_timed(_body(_system(policy, k), f"Cancel reservation {k}X{k}")) for k in range(TURNS)]
    figures = {
        "system_prompt_chars": len(bodies[0]["messages"][0]["content"]),
        "system_prompt_lines": bodies[0]["messages"][0]["content"].count("\n") + 1,
        "cold_us": round(cold_us, 1),
        "warm_calls": len(timing),
        "warm_us_p50": round(statistics.median(timing), 1),
        "warm_us_p95": round(statistics.quantiles(timing, n=20)[-1], 1),
        "new_conversation_us_p50": round(statistics.median(us for _, us in others), 1),
        "turns": TURNS,
        "sessions_old_rule": len({_old_rule(b) for b in bodies}),
        "sessions_new_rule": len({cold_sid} | {sid for sid, _ in warm}),
        "other_conversations_distinct": len({sid for sid, _ in others} - {cold_sid}),
    }
    out = {"command": command(__file__, []), "figures": figures}
    write_json(REPO / "bench" / "results" / "session_key_cost.json", out)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
