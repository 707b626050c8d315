"""Answer stability: does prefixgate's rewrite change greedy answers more often than the clock ticking?

    nice -n 10 .venv/bin/python bench/answer_stability.py [--max-tokens 24] [--out FILE]

DESIGN.md, "Meaning at the model level": a rewrite may not change answers more often than the
clock ticking does. Issue 19, item 1: with the hoisted note as a new final user message, 7 of
15 greedy answers were about the time.

Corpus (built from ``../shared/data``, read in place; nothing copied into the repo). Every
request is an OpenAI Chat body; a session's requests are sent in order, one exchange apart, and
the session's clock advances between them by a seeded gap of 6..90 s:

* ``tau_*`` — tau-bench airline runs (``traces/tau_bench_airline_gpt4o.json``, trial 0 of
  ``--tau-runs`` tasks), requests 1..``--turns`` of each run (system + tools + the messages
  before each assistant turn). The policy is cut to :data:`POLICY_CHARS` at a line end, tool
  results to :data:`RESULT_CHARS`; tools: the four the early turns use. The system prompt's
  clock and id are written as agent templates write them, one template per run in turn:
  ``tau_live`` (the policy's own ``The current time is ... EST.`` line showing the request's
  time, and a ``Conversation ID: <uuid>`` constant in the session), ``tau_request_id`` (a header
  ``Current date and time: <ISO 8601>`` / ``Request ID: req_<hex>``, new every request),
  ``tau_constant`` (the trace as recorded: the policy's line, identical on every request).
* ``swe`` — the SWE-agent trajectory (``traces/swe_agent/``, normalised as
  ``tests/trace_requests.py`` does), its first ``--swe-turns`` requests, a ``Current time:
  <RFC 2822>`` / ``Trace ID: <hex>`` header on its system prompt; texts cut as above.
* ``passages_ranked`` / ``passages_unranked`` — tau2 banking knowledge (``rag/``): per task, a
  two-turn session whose system prompt carries a clock line and three documents (the task's
  first two required documents and one other, each cut to :data:`DOC_CHARS`). Ranked: under
  ``Retrieved documents (most relevant first; trust the first one):``, turn 2 re-ranked (the
  first two swapped) — the order carries meaning, so it must be sent as the client sent it.
  Unranked: ``<kb_article id=...>`` elements (an application's own tag name), turn 2 in another
  order — stabilise_passages puts them back in turn 1's order.

Variants of each request, each sent to the local engine (``prefixgate.local_engine``,
SmolLM2-135M-Instruct, fp32 CPU, in-process, radix prefix cache shared by all variants; greedy,
``max_tokens`` = ``--max-tokens``; prompts of about 400..1450 tokens, most 600..1200; identical
token sequences decoded once, the others of one request in one continuous batch — their greedy
tokens equal one-at-a-time decoding, checked on 16 corpus prompts):

* ``original`` — as the client sent it; ``clock_tick`` — the same body with only the clock
  value advanced (by the gap to the session's next request): the noise floor;
* ``<api>/defaults`` — the shipped defaults (``RewriteSettings()``: the passes that move text
  the model reads, ``MOVES_THE_MODEL_READS``, ship ``guarded``, which is off here: the pipeline
  run directly has no meaning-guard verdict, issue 36): the headline figures;
* ``<api>/<placement>`` — the pipeline with those moves switched on (:data:`OPT_IN`;
  ``rewriter.rewrite_request``, provider ``radix``, session memory carried like the proxy) and
  ``hoist_target`` set to each placement, for the
  OpenAI API (the corpus as sent) and for the Anthropic API (the body mapped to Messages by
  prefixgate's own bridge, rewritten, and mapped back for the engine, as the proxy serves an
  Anthropic client from a Chat backend; its original is the same round trip unrewritten);
* the decomposition variants below.

Rules. ``changed``: the completion's text differs from the original's (exact, whitespace at
the ends stripped). ``mentions_note``: the answer matches :data:`NOTE_WORDS` (``note``,
``placeholder``, ``reminder``, ``current time``, ``current values``, ``[see``), or holds this
request's clock value (its time of day ``HH:MM``) or the moved id (its first 8 characters), while
the original answer does not. Goal: ``changed_by_rewrite <= changed_by_clock_tick`` and
``mentions_note == 0``. The default placement of each API (``figures.default_placement``, to be
:data:`prefixgate.config.schema.HOIST_TARGET_BY_API`; ``tests/config/test_hoist_default.py``) is
:func:`winner`: among the placements that keep the prefix reusable (cached share from turn 3 on
within :data:`REUSE_MARGIN` of the API's best — the clock is moved for that), the fewest answers
mentioning the note, then the fewest changed answers. Cached shares are those of the engine's
radix rule (common token prefix with the session's previous request, as sent).

Decomposition (rows, and ``figures.where_hoisted``): ``system_edit_only`` — the OpenAI
``reminder`` rewrite without its note (what editing the system prompt alone does);
``other_passes_only`` — the pipeline with ``hoist_volatile`` off (canonicalize_tools,
stabilise_passages alone).

Writes ``bench/results/answer_stability.json``: ``{"command", "figures": {"requests",
"changed_by_rewrite", "changed_by_clock_tick", "mentions_note", "default_placement": {api:
placement}, "opt_in_moves": {api: figures of its winning placement}, "by_placement":
{"<api>/defaults" | "<api>/<placement>": {"changed_by_rewrite", "mentions_note", "hoisted",
"turn2_cached_share", "turn3_on_cached_share"}}, "by_api", "by_kind", "where_hoisted",
"where_not_hoisted", "passages", "prefix_reuse"}, "setup"}`` (headline figures: the OpenAI API
with the shipped defaults; ``where_*`` and ``passages``: the OpenAI winner with the moves on). Cap: under 30 minutes on 2 shared cores (18 min measured,
other engineers' test runs on the box: ``setup.wall_s``); ``--limit N`` runs the first N sessions
only, ``--from-rows`` prints the figures of saved rows.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.pruning_data import DATA, banking_docs, banking_tasks, tau_airline_runs, tau_airline_tools
from bench.result_file import command, write_json
from tests.trace_requests import SWE_TRACE, normalise_swe_history, swe_tools

DEFAULT_MODEL = Path("~/.cache/prefixgate/models/SmolLM2-135M-Instruct").expanduser()
OUT = REPO / "bench" / "results" / "answer_stability.json"
PLACEMENTS = {"openai": ("end", "last_user", "system_end", "reminder"),
              "anthropic": ("end", "last_user", "reminder")}
POLICY_CHARS = 900
RESULT_CHARS = 400
TEXT_CHARS = 700
SWE_CHARS = (240, 240, 700)
"""SWE-agent cuts: tool results, other messages, system prompt (its turns are long)."""
DOC_CHARS = 360
TAU_TOOLS = ("cancel_reservation", "get_reservation_details", "get_user_details",
             "transfer_to_human_agents")
POLICY_CLOCK = "The current time is 2024-05-15 15:00:00 EST."
EST = timezone(timedelta(hours=-5))
START = datetime(2024, 5, 15, 15, 0, 0, tzinfo=EST)
NOTE_WORDS = re.compile(r"(?i)\bnotes?\b|placeholder|reminder|current time|current values|\[see")
"""Words of an answer that addresses the hoisted note (module docstring, rule ``mentions_note``)."""


@dataclass
class Case:
    """One request of a session: its body at clock ``t`` and with only the clock advanced."""

    session: str
    kind: str
    turn: int
    body: dict[str, Any]
    tick: dict[str, Any]
    clock: str
    moved_id: str = ""


@dataclass
class Clock:
    """A session's clock: ``render(t)`` writes the template's clock value for a time."""

    render: Callable[[datetime], str]
    rng: random.Random
    fixed: bool = False
    """A template whose clock never moves (``tau_constant``): every request shows START; its
    tick variant still shows START advanced by the gap."""
    t: datetime = START

    def advance(self) -> tuple[datetime, datetime]:
        """``(this request's time, the next request's time)``; moves to the next request."""
        gap = timedelta(seconds=self.rng.randint(6, 90))
        now = self.t
        self.t = now if self.fixed else now + gap
        return now, now + gap


def _cut(text: str, n: int) -> str:
    """``text`` cut to at most ``n`` characters, at a line end when one is in the last third."""
    if len(text) <= n:
        return text
    cut = text.rfind("\n", n * 2 // 3, n)
    return text[: cut if cut > 0 else n].rstrip()


def _msg_cut(m: dict[str, Any], cuts: tuple[int, int, int]) -> dict[str, Any]:
    out = dict(m)
    limit = cuts[0] if m.get("role") == "tool" else cuts[1]
    if isinstance(out.get("content"), str):
        out["content"] = _cut(out["content"], limit)
    return {k: v for k, v in out.items() if k in ("role", "content", "tool_calls", "tool_call_id")}


def _requests(traj: list[dict[str, Any]], turns: int,
              cuts: tuple[int, int, int] = (RESULT_CHARS, TEXT_CHARS, POLICY_CHARS)) -> list[list[dict[str, Any]]]:
    """The messages before each of the first ``turns`` assistant turns (system excluded), cut
    to ``cuts`` (tool results, other messages)."""
    out = []
    for i, m in enumerate(traj):
        if m.get("role") == "assistant" and i > 1:
            out.append([_msg_cut(x, cuts) for x in traj[1:i]])
            if len(out) == turns:
                break
    return out


def _hexid(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


def _uuid(rng: random.Random) -> str:
    h = _hexid(rng, 32)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:]}"


def _session(name: str, kind: str, system: Callable[[str, str], str], clock: Clock,
             turns: list[list[dict[str, Any]]], tools: list[dict[str, Any]] | None,
             max_tokens: int, id_len: int = 0) -> list[Case]:
    """A session's cases: ``system(clock value, request id)`` on top of each turn's messages."""
    cases = []
    for k, msgs in enumerate(turns):
        now, nxt = clock.advance()
        rid = _hexid(clock.rng, id_len) if id_len else ""

        def body(t: datetime, rid: str = rid, msgs: list[dict[str, Any]] = msgs) -> dict[str, Any]:
            b: dict[str, Any] = {"model": "local", "max_tokens": max_tokens, "messages": [
                {"role": "system", "content": system(clock.render(t), rid)}, *msgs]}
            if tools:
                b["tools"] = tools
            return b
        cases.append(Case(name, kind, k, body(now), body(nxt), clock.render(now), rid))
    return cases


def _est(t: datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S EST")


def tau_cases(runs: int, turns: int, max_tokens: int, rng: random.Random) -> list[Case]:
    """The tau-bench sessions (module docstring)."""
    tools = [t for t in tau_airline_tools() if t["function"]["name"] in TAU_TOOLS]
    trials = [r for r in tau_airline_runs() if r["trial"] == 0][:runs]
    out: list[Case] = []
    for n, run in enumerate(trials):
        policy = _cut(run["traj"][0]["content"], POLICY_CHARS)
        kind = ("tau_live", "tau_request_id", "tau_constant")[n % 3]
        conv = _uuid(rng)
        if kind == "tau_live":
            def system(v: str, rid: str, policy: str = policy, conv: str = conv) -> str:
                return policy.replace(POLICY_CLOCK, f"The current time is {v}.\nConversation ID: {conv}")
            render: Callable[[datetime], str] = _est
        elif kind == "tau_request_id":
            def system(v: str, rid: str, policy: str = policy) -> str:
                return (f"Current date and time: {v}\nRequest ID: req_{rid}\n\n"
                        + policy.replace(POLICY_CLOCK + "\n\n", ""))
            render = datetime.isoformat
        else:
            def system(v: str, rid: str, policy: str = policy) -> str:
                return policy.replace(POLICY_CLOCK, f"The current time is {v}.")
            render = _est
        out += _session(f"tau{run['task_id']}", kind, system, Clock(render, rng, kind == "tau_constant"),
                        _requests(run["traj"], turns), tools, max_tokens,
                        id_len=24 if kind == "tau_request_id" else 0)
    return out


def swe_cases(turns: int, max_tokens: int, rng: random.Random) -> list[Case]:
    """The SWE-agent session (module docstring)."""
    history = normalise_swe_history(json.loads(SWE_TRACE.read_text())["history"])
    prompt = _cut(history[0]["content"], SWE_CHARS[2])

    def system(v: str, rid: str) -> str:
        return f"Current time: {v}\nTrace ID: {rid}\n\n{prompt}"
    return _session("swe", "swe", system, Clock(format_datetime, rng), _requests(history, turns, SWE_CHARS),
                    swe_tools(history), max_tokens, id_len=32)


def _opening(task: dict[str, Any]) -> str | None:
    m = re.search(r'Start naturally:\*\*\s*"([^"]+)"', task["instructions"])
    return m.group(1) if m else None


def passage_cases(tasks: int, max_tokens: int, rng: random.Random) -> list[Case]:
    """The two-turn retrieval sessions (module docstring), ranked and unranked per task."""
    docs = {d["id"]: d for d in banking_docs()}
    picked, seen = [], set()
    for task in banking_tasks():
        q = _opening(task)
        req = [d for d in task["required_documents"] if d in docs]
        if len(picked) >= tasks:
            break
        if q and len(req) >= 2 and q[:40] not in seen:
            seen.add(q[:40])
            picked.append((task, q, req[:2]))
    others = sorted(docs)
    out: list[Case] = []
    for task, q, req in picked:
        extra = next(d for d in others[rng.randrange(len(others)):] + others if d not in req)
        chosen = [docs[d] for d in (*req, extra)]
        for kind in ("passages_ranked", "passages_unranked"):
            def system(v: str, rid: str, chosen: list[dict[str, str]] = chosen, kind: str = kind,
                       order: list[int] | None = None) -> str:
                return _bank_system(v, chosen, kind, order or [0, 1, 2])
            t1 = [{"role": "user", "content": q}]
            t2 = [*t1, {"role": "assistant", "content": "Thanks for reaching out. Let me look into that."},
                  {"role": "user", "content": "Could you tell me exactly what I should do next?"}]
            clock = Clock(_est, rng)
            first = _session(f"{task['id']}/{kind}", kind, system, clock, [t1], None, max_tokens)
            second = _session(f"{task['id']}/{kind}", kind,
                              lambda v, rid, s=system: s(v, rid, order=[1, 0, 2]), clock, [t2],
                              None, max_tokens)
            second[0].turn = 1
            out += first + second
    return out


def _bank_system(clock: str, docs: list[dict[str, str]], kind: str, order: list[int]) -> str:
    head = ("You are a Rho-Bank customer support agent. Answer only from the documents below, "
            f"briefly.\nThe current time is {clock}.\n\n")
    if kind == "passages_ranked":
        items = "\n".join(f'<document id="{docs[i]["id"]}">{docs[i]["title"]}\n'
                          f'{_cut(docs[i]["content"], DOC_CHARS)}</document>' for i in order)
        return head + "Retrieved documents (most relevant first; trust the first one):\n" + items
    items = "\n".join(f'<kb_article id="{docs[i]["id"]}" title="{docs[i]["title"]}">\n'
                      f'{_cut(docs[i]["content"], DOC_CHARS)}\n</kb_article>' for i in order)
    return head + "Knowledge base articles:\n" + items


def corpus(args: argparse.Namespace) -> list[list[Case]]:
    """Every session's cases, in session order."""
    rng = random.Random(19)
    cases = (tau_cases(args.tau_runs, args.turns, args.max_tokens, rng)
             + swe_cases(args.swe_turns, args.max_tokens, rng)
             + passage_cases(args.bank_tasks, args.max_tokens, rng))
    sessions: dict[str, list[Case]] = {}
    for c in cases:
        sessions.setdefault(c.session, []).append(c)
    return list(sessions.values())


# -- rewriting --------------------------------------------------------------------------------


def _bridge(names: tuple[str, ...], fn: str) -> Callable[..., dict[str, Any]]:
    """prefixgate's own bridge function ``fn``, wherever the proxy package keeps it."""
    for name in names:
        try:
            return getattr(importlib.import_module(name), fn)  # type: ignore[no-any-return]
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"no bridge {fn} in {names}")


def bridges() -> tuple[Callable[..., dict[str, Any]], Callable[..., dict[str, Any]]]:
    """``(Chat -> Messages, Messages -> Chat)`` request bridges."""
    o2a = _bridge(("prefixgate.proxy.bridges.openai_anthropic_request", "prefixgate.proxy.o2a_request"),
                  "request_to_anthropic")
    a2o = _bridge(("prefixgate.proxy.bridges.anthropic_openai_request", "prefixgate.proxy.a2o_request"),
                  "request_to_openai")
    return o2a, a2o


def rewrite_session(cases: list[Case], api: str, placement: str, **switches: bool
                    ) -> list[tuple[dict[str, Any], dict[str, Any], str]]:
    """Per case ``(original as the engine gets it, rewritten as the engine gets it, edits)``;
    ``switches``: other ``RewriteSettings`` (``hoist_volatile=False``: the other passes alone)."""
    from prefixgate.config.schema import RewriteSettings
    from prefixgate.rewriter.pipeline import rewrite_request, session_updates
    from prefixgate.rewriter.types import Context

    o2a, a2o = bridges()
    memory: dict[str, Any] = {}
    settings = RewriteSettings(hoist_target=placement, **switches)  # type: ignore[arg-type]
    out = []
    for c in cases:
        body = o2a(c.body) if api == "anthropic" else c.body
        r = rewrite_request(body, api, Context(settings, model="local", provider="radix",  # type: ignore[arg-type]
                                               session=memory))
        memory.update(session_updates(r))
        orig, sent = (a2o(body), a2o(r.body)) if api == "anthropic" else (body, r.body)
        out.append((orig, sent, r.summary()))
    return out


# -- the engine -------------------------------------------------------------------------------


class Answers:
    """Greedy completions on the local engine, one per distinct token sequence."""

    def __init__(self, model: Path, max_tokens: int) -> None:
        from prefixgate.local_engine.engine import Engine, EngineConfig

        self.eng = Engine(EngineConfig(model_path=str(model), num_kv_slots=65536, max_context_len=4096))
        self.tok = self.eng.tokenizer
        self.max_tokens = max_tokens
        self.memo: dict[tuple[int, ...], str] = {}
        self.prompt_tokens: list[int] = []

    def ids(self, body: dict[str, Any]) -> list[int]:
        from prefixgate.local_engine.server.chat import encode_chat

        return encode_chat(self.tok, body["messages"], body.get("tools"))

    def get(self, bodies: list[dict[str, Any]]) -> list[str]:
        """Answers of ``bodies``: the sequences not decoded before go to the engine together
        (one continuous batch; greedy tokens were checked equal to one-at-a-time decoding)."""
        from prefixgate.local_engine.engine import SamplingParams

        keys = [tuple(self.ids(b)) for b in bodies]
        new = [k for k in dict.fromkeys(keys) if k not in self.memo]
        if new:
            params = SamplingParams(max_tokens=self.max_tokens, temperature=0.0)
            for k, ids in zip(new, self.eng.generate_batch([list(k) for k in new], params)):
                self.prompt_tokens.append(len(k))
                self.memo[k] = self.tok.decode(ids, skip_special_tokens=True)
        return [self.memo[k] for k in keys]


# -- figures ----------------------------------------------------------------------------------


def changed(a: str, b: str) -> bool:
    """Rule ``changed`` (module docstring)."""
    return a.strip() != b.strip()


def mentions(answer: str, case: Case) -> bool:
    """The answer matches the note rule (module docstring) for ``case``'s clock and id."""
    hhmm = re.search(r"\d{1,2}:\d{2}", case.clock)
    return bool(NOTE_WORDS.search(answer) or (hhmm and hhmm.group() in answer)
                or (case.moved_id and case.moved_id[:8] in answer))


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def without_note(body: dict[str, Any], note_turn_added: bool) -> dict[str, Any]:
    """``body`` (a rewritten Chat body) without its hoisted note: the system edit alone."""
    msgs = list(body["messages"])
    if note_turn_added:
        msgs = msgs[:-1]
    else:
        last = dict(msgs[-1])
        if isinstance(last.get("content"), str):
            last["content"] = last["content"].split("\n\n<system-reminder>")[0]
        msgs[-1] = last
    return dict(body, messages=msgs)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every case through the engine; rows with per-variant results and prefix reuse."""
    sessions = corpus(args)
    if args.limit:
        sessions = sessions[:args.limit]
    eng = Answers(args.model, args.max_tokens)
    rows: list[dict[str, Any]] = []
    t0 = time.time()
    for s in sessions:
        rewrites = {f"{api}/defaults": rewrite_session(s, api, "auto") for api in PLACEMENTS}
        rewrites.update({f"{api}/{p}": rewrite_session(s, api, p, **OPT_IN) for api, ps in PLACEMENTS.items()
                         for p in ps})
        others = rewrite_session(s, "openai", "end", **dict(OPT_IN, hoist_volatile=False))
        prev: dict[str, list[int]] = {}
        for k, c in enumerate(s):
            base, sent, summary = rewrites["openai/reminder"][k]
            bare = without_note(sent, len(sent["messages"]) > len(base["messages"])) \
                if "hoist_volatile" in summary else sent
            pairs = [rs[k][:2] for rs in rewrites.values()]
            answers = eng.get([c.body, c.tick, bare, others[k][1], *(b for pair in pairs for b in pair)])
            orig, tick, bare_answer, other_answer = answers[:4]
            row: dict[str, Any] = {"session": c.session, "kind": c.kind, "turn": c.turn,
                                   "original": orig, "clock_tick_changed": changed(orig, tick),
                                   "system_edit_only_changed": changed(orig, bare_answer),
                                   "other_passes_only_changed": changed(orig, other_answer),
                                   "other_passes_edits": others[k][2],
                                   "original_mentions": mentions(orig, c), "variants": {}, "reuse": {}}
            for i, (key, rs) in enumerate(rewrites.items()):
                summary = rs[k][2]
                a_orig, a_sent = answers[4 + 2 * i], answers[5 + 2 * i]
                row["variants"][key] = {
                    "changed": changed(a_orig, a_sent), "hoisted": "hoist_volatile" in summary,
                    "stabilised": "stabilise_passages" in summary, "edits": summary,
                    "mentions_note": mentions(a_sent, c) and not mentions(a_orig, c),
                    **({"answer": a_sent} if changed(a_orig, a_sent) else {})}
            for key, body in (("original", c.body), *((v, rs[k][1]) for v, rs in rewrites.items())):
                ids = eng.ids(body)
                if key in prev:
                    row["reuse"][key] = [common_prefix(prev[key], ids), len(ids)]
                prev[key] = ids
            rows.append(row)
            print(f"[{time.time() - t0:6.0f}s] {c.session} t{c.turn} {c.kind} tick={int(row['clock_tick_changed'])} "
                  + " ".join(f"{v}:{int(x['changed'])}{'m' if x['mentions_note'] else ''}"
                             for v, x in row["variants"].items()), flush=True)
        if args.rows:  # after every session: a cut-off run keeps its rows (``--from-rows``)
            write_json(args.rows, rows, indent=1)
    eng.eng.shutdown()
    return {"rows": rows, "wall_s": round(time.time() - t0, 1), "prompt_tokens": eng.prompt_tokens}


OPT_IN = {"hoist_volatile": True, "stabilise_passages": True}
"""The passes that move text the model reads (``MOVES_THE_MODEL_READS``, off by default),
switched on for the placement variants."""
REUSE_MARGIN = 0.02
"""A placement keeps the prefix reusable when its cached share from turn 3 on is at most this
far below the API's best (:func:`winner`)."""


def winner(by_placement: dict[str, dict[str, Any]], api: str) -> str:
    """The API's default by measurement: among the placements that keep the prefix reusable
    (cached share from turn 3 on within :data:`REUSE_MARGIN` of the best: moving the clock is
    for that), the one with the fewest answers mentioning the note, then the fewest changed
    answers (ties: :data:`PLACEMENTS` order)."""
    keys = [f"{api}/{p}" for p in PLACEMENTS[api]]
    best = max(by_placement[k]["turn3_on_cached_share"] for k in keys)
    kept = [k for k in keys if by_placement[k]["turn3_on_cached_share"] >= best - REUSE_MARGIN]
    return min(kept, key=lambda k: (by_placement[k]["mentions_note"], by_placement[k]["changed_by_rewrite"],
                                    keys.index(k)))


def _share(xs: list[list[int]]) -> float | None:
    return round(sum(x[0] for x in xs) / sum(x[1] for x in xs), 3) if xs else None


def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON figures (module docstring) from :func:`run`'s rows."""
    from prefixgate.config.schema import HOIST_TARGET_BY_API

    keys = list(rows[0]["variants"])

    def count(rs: list[dict[str, Any]], key: str, what: str) -> int:
        return sum(1 for r in rs if r["variants"][key][what])
    def reuse(key: str, turns: Callable[[int], bool]) -> float | None:
        return _share([r["reuse"][key] for r in rows if turns(r["turn"]) and key in r["reuse"]])
    by_placement = {k: {"changed_by_rewrite": count(rows, k, "changed"),
                        "mentions_note": count(rows, k, "mentions_note"),
                        "hoisted": count(rows, k, "hoisted"),
                        "turn2_cached_share": reuse(k, lambda t: t == 1),
                        "turn3_on_cached_share": reuse(k, lambda t: t >= 2)} for k in keys}
    tick = sum(1 for r in rows if r["clock_tick_changed"])
    won = {api: winner(by_placement, api) for api in PLACEMENTS}
    by_api = {api: {"winner": won[api], "configured_default": f"{api}/{HOIST_TARGET_BY_API[api]}",
                    **by_placement[won[api]]} for api in PLACEMENTS}
    d = "openai/defaults"
    h = won["openai"]
    by_kind = {kd: {"requests": len(rs), "changed_by_clock_tick": sum(r["clock_tick_changed"] for r in rs),
                    "changed_by_rewrite": count(rs, d, "changed"), "mentions_note": count(rs, d, "mentions_note"),
                    "changed_by_opt_in_moves": count(rs, h, "changed"),
                    "hoisted_by_opt_in_moves": count(rs, h, "hoisted"),
                    "stabilised_by_opt_in_moves": count(rs, h, "stabilised")}
               for kd in sorted({r["kind"] for r in rows}) for rs in [[r for r in rows if r["kind"] == kd]]}
    hoisted = [r for r in rows if r["variants"][h]["hoisted"]]
    ranked = [r for r in rows if r["kind"] == "passages_ranked" and r["turn"] == 1]
    unranked = [r for r in rows if r["kind"] == "passages_unranked" and r["turn"] == 1]
    return {"requests": len(rows), "changed_by_rewrite": by_placement[d]["changed_by_rewrite"],
            "changed_by_clock_tick": tick, "mentions_note": by_placement[d]["mentions_note"],
            "default_placement": {api: won[api].split("/")[1] for api in PLACEMENTS},
            "opt_in_moves": {api: by_placement[won[api]] for api in PLACEMENTS},
            "by_placement": by_placement, "by_api": by_api, "by_kind": by_kind,
            "where_hoisted": {"requests": len(hoisted), "changed_by_rewrite": count(hoisted, h, "changed"),
                              "changed_by_clock_tick": sum(r["clock_tick_changed"] for r in hoisted),
                              "changed_by_system_edit_alone": sum(r["system_edit_only_changed"] for r in hoisted),
                              "changed_by_other_passes_alone": sum(r["other_passes_only_changed"] for r in hoisted)},
            "where_not_hoisted": {"requests": len(rows) - len(hoisted),
                                  "changed_by_rewrite": count([r for r in rows if r not in hoisted], h, "changed"),
                                  "changed_by_clock_tick": sum(r["clock_tick_changed"] for r in rows
                                                               if r not in hoisted)},
            "passages": {"ranked_turn2_reordered": sum(any(v["stabilised"] for v in r["variants"].values())
                                                       for r in ranked),
                         "ranked_turn2_requests": len(ranked),
                         "unranked_turn2_stabilised": count(unranked, h, "stabilised"),
                         "unranked_turn2_requests": len(unranked),
                         "unranked_turn2_changed": count(unranked, h, "changed"),
                         "unranked_turn2_changed_by_stabilise_alone": sum(r["other_passes_only_changed"]
                                                                         for r in unranked)},
            "prefix_reuse": {"original": {"turn2_cached_share": reuse("original", lambda t: t == 1),
                                          "turn3_on_cached_share": reuse("original", lambda t: t >= 2)}}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--tau-runs", type=int, default=17)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--swe-turns", type=int, default=5)
    ap.add_argument("--bank-tasks", type=int, default=8)
    ap.add_argument("--limit", type=int, default=0, help="first N sessions only (a smoke run)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--rows", type=Path, default=None, help="also write every row here")
    ap.add_argument("--from-rows", type=Path, default=None,
                    help="print the figures of rows written by --rows (no engine run, nothing written)")
    args = ap.parse_args(argv)
    if args.from_rows:
        print(json.dumps(figures(json.loads(args.from_rows.read_text())), indent=2))
        return 0
    res = run(args)
    figs = figures(res["rows"])
    out = {"command": command(__file__, argv), "figures": figs,
           "setup": {"model": args.model.name, "device": "cpu (fp32)", "greedy": True,
                     "max_tokens": args.max_tokens, "wall_s": res["wall_s"],
                     "prompt_tokens": {"min": min(res["prompt_tokens"]), "max": max(res["prompt_tokens"])},
                     "data": str(DATA.relative_to(REPO.parent)) if DATA.is_relative_to(REPO.parent) else str(DATA),
                     "engine": "prefixgate.local_engine in-process, radix prefix cache shared by every variant"}}
    write_json(args.out, out)
    if args.rows:
        write_json(args.rows, res["rows"], indent=1)
    print(json.dumps(figs, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
