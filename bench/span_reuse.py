"""Span reuse (issue 33): does reusing KV across a changed clock or id answer like a full recompute?

    nice python bench/span_reuse.py [--quick] [--max-tokens 24] [--out FILE]

Corpus: ``bench/answer_stability.py``'s (tau-bench airline sessions whose system prompt carries a
live clock, a per-request id or a constant clock; the SWE-agent session with a clock and a trace
id on top; tau2 banking retrieval sessions), built by its own functions with the same seed: a
session's requests in order, the clock advanced between them, each body rewritten with the
shipped defaults (``RewriteSettings()``: nothing the model reads is moved; the moves ship
``guarded``, off without a meaning-guard verdict) as the proxy sends it.

Three in-process engines (``prefixgate.local_engine.engine.Engine``, SmolLM2-135M-Instruct fp32
CPU, one request at a time, nothing else in flight):

* ``on``   — span reuse on (the shipped default: ``EngineConfig()`` bounds);
* ``off``  — span reuse off, prefix cache on: what the engine reused before (prefix only);
* ``full`` — no prefix cache: the exact reference (every position computed from its own prompt).

Per request ``P`` (token ids of the sent body), in order:

1. ``full``: greedy answer ``A`` (``--max-tokens``), then the teacher-forced rows of ``P + A``
   (``SamplingParams.prompt_logprobs``): the reference log-softmax over the answer positions
   (positions ``len(P)-1 .. len(P)+len(A)-2``, each predicting the next answer token);
2. ``full``: the same with the clock advanced (the request's ``tick`` body): the floor — how far
   the answer distribution moves when only the clock's value changes (``kl_clock_tick``);
3. ``off``: ``P + A`` as a prompt (max_tokens 1): its cached tokens and TTFT, prefix only;
4. ``on``:  ``P + A`` with prompt_logprobs: cached and span-reused tokens, TTFT, and the rows of
   the answer positions computed on top of the reused K/V; KL(full || on) per position, nats;
5. ``on``:  greedy answer of ``P`` alone — now a prefix hit on the K/V step 4 left in the tree
   (the span-reused K/V): the answer a client gets with span reuse on, compared with ``A``.

The cached tokens, prefill tokens and TTFT of steps 3 and 4 are measured on the same ``P + A``
prompts (the ``len(A)`` answer tokens are fresh in both arms, so the ratios lean towards 1, never
away); shares and prefill counts are over ``P``'s tokens (``min(cached, len(P))``). TTFT is the
in-process time from submit to the first output (no queue: one request at a time), ms.

Adversarial cases (:func:`adversarial_cases`), each a pair of requests ``(a, b)`` sent in order
to ``on`` after the corpus (with ``b`` measured as above): a changed span right before the
answer; a 200-token changed span; many small spans (8 ids through the system prompt); a span at
the very start of the system prompt. Each must be refused by the gate (``span_reused_tokens``
0: a normal prefix match) or within the bounds (greedy identical, its mean KL within
:data:`KL_MAX`, the bound on any one request of the corpus).

Writes ``bench/results/span_reuse.json``: ``{"command", "commit", "load_avg_1m_start_end",
"figures": {"requests", "span_reused_requests", "cached_share_turn3_on",
"cached_share_turn3_off", "greedy_identical_share", "top1_agreement", "kl_mean", "kl_max",
"kl_max_position", "kl_clock_tick_mean", "prefill_tokens_ratio", "ttft_p50_ratio",
"ttft_p50_ms_on", "ttft_p50_ms_off", "goals": {name: bool}}, "adversarial": [...], "rows":
[...], "setup"}``. ``kl_mean``: mean over requests of each request's mean KL over its answer
positions (nats/token); ``kl_max``: the largest of those per-request means;
``kl_max_position``: the largest single position's KL; ``kl_clock_tick_mean``: the floor's
``kl_mean`` over the same requests. Ratios are span reuse / prefix only over the requests from
the third of each session on (the turns of ``cached_share_turn3_on``); ``kl_by_turn`` splits the
KL figures between the first request of each session (which reuses another session's K/V: the
same policy and tools under another clock, id or template) and the later ones (their own
session's), ``worst`` lists the five requests of largest mean KL. ``--span-bounds S,T,A``
sets the ``on`` engine's gate (most spans, most tokens of one span, shortest reused run) to
measure another one. ``--refigure FILE`` recomputes the figures of a results file's rows (no engine). ``--quick``: 3 sessions
and 2 adversarial cases (a smoke run: 9.5 min at load 9-10 on 2 shared cores); the full run
(28 requests, 4 adversarial pairs): 19 min measured at load 15-18 on 2 shared cores, each
request 3 full prefills and 2 greedy decodes (``setup.wall_s``, with the load average).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.answer_stability import (  # noqa: E402
    DEFAULT_MODEL,
    Case,
    passage_cases,
    rewrite_session,
    swe_cases,
    tau_cases,
)

OUT = REPO / "bench" / "results" / "span_reuse.json"
KL_MEAN_MAX = 1e-4
"""Goal: the mean over requests of each one's mean teacher-forced KL, nats/token (issue 33)."""
KL_MAX = 1e-3
"""Goal: the largest per-request mean KL, nats/token."""
GOALS = {"cached_share_turn3_on": (">=", 0.78), "greedy_identical_share": (">=", 0.99),
         "kl_mean": ("<=", KL_MEAN_MAX), "kl_max": ("<=", KL_MAX),
         "prefill_tokens_ratio": ("<=", 0.35), "ttft_p50_ratio": ("<=", 0.5)}
"""Issue 33's goals on ``figures``."""
NUM_KV_SLOTS = 24576
"""KV slots per engine (~1.1 GB each at fp32 for SmolLM2-135M): a few sessions' turns live."""


# -- the teacher-forced comparison (pure, torch only) ----------------------------------------


def answer_positions(prompt_len: int, answer_len: int) -> list[int]:
    """Positions of ``prompt + answer`` whose next-token rows predict the answer's tokens:
    ``prompt_len - 1 .. prompt_len + answer_len - 2`` (empty for an empty answer)."""
    return list(range(prompt_len - 1, prompt_len - 1 + answer_len))


def kl_rows(ref: Any, other: Any) -> list[float]:
    """Per-row KL(ref || other) in nats of two ``[n, vocab]`` log-softmax tensors (float64
    arithmetic; rows of equal count)."""
    import torch

    p = ref.to(torch.float64)
    q = other.to(torch.float64)
    return [max(0.0, float(v)) for v in (p.exp() * (p - q)).sum(dim=-1)]


def rows_at(logprobs: Any, positions: list[int]) -> tuple[Any, list[int]]:
    """``(rows [m, vocab], kept)``: the rows of ``positions`` a ``PromptLogprobs`` holds, and
    the indexes (into ``positions``) it held them for (a position whose K/V was reused has no
    row)."""
    import torch

    got, kept = [], []
    for i, pos in enumerate(positions):
        r = logprobs.row(pos) if logprobs is not None else None
        if r is not None:
            got.append(r)
            kept.append(i)
    return (torch.stack(got) if got else None), kept


def compare(ref: Any, other: Any, ref_pos: list[int], other_pos: list[int],
            answer: list[int]) -> dict[str, Any]:
    """KL(ref || other) and top-1 agreement over the answer positions both computed:
    ``{"kl_mean", "kl_max", "top1", "positions", "missing"}`` (``kl_*`` None when none)."""
    r_rows, r_kept = rows_at(ref, ref_pos)
    o_rows, o_kept = rows_at(other, other_pos)
    both = sorted(set(r_kept) & set(o_kept))
    if not both or r_rows is None or o_rows is None:
        return {"kl_mean": None, "kl_max": None, "top1": None, "positions": 0,
                "missing": len(answer)}
    ri = [r_kept.index(i) for i in both]
    oi = [o_kept.index(i) for i in both]
    kls = kl_rows(r_rows[ri], o_rows[oi])
    top = o_rows[oi].argmax(dim=-1).tolist()
    agree = sum(1 for t, i in zip(top, both) if t == answer[i])
    return {"kl_mean": sum(kls) / len(kls), "kl_max": max(kls), "top1": agree / len(both),
            "positions": len(both), "missing": len(answer) - len(both)}


# -- the engines -----------------------------------------------------------------------------


@dataclass
class Result:
    """One request's outcome: completion tokens, usage, in-process TTFT (ms), prompt rows."""

    tokens: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    cached: int = 0
    span_reused: int = 0
    ttft_ms: float = 0.0
    logprobs: Any = None


def run_one(engine: Any, ids: list[int], max_tokens: int, logprobs_from: int | None = None
            ) -> Result:
    """Run one greedy request to completion on ``engine`` (nothing else in flight);
    ``logprobs_from``: return the prompt rows of the positions from this one on."""
    from prefixgate.local_engine.engine import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0,
                            prompt_logprobs=logprobs_from is not None,
                            prompt_logprobs_start=logprobs_from or 0)

    async def go() -> Result:
        res = Result()
        t0 = time.perf_counter()
        async for out in engine.generate(list(ids), params):
            if not res.ttft_ms:
                res.ttft_ms = (time.perf_counter() - t0) * 1000
            res.tokens += out.new_token_ids
            res.prompt_tokens, res.cached = out.prompt_tokens, out.cached_tokens
            res.span_reused = getattr(out, "span_reused_tokens", 0) or 0
            if getattr(out, "prompt_logprobs", None) is not None:
                res.logprobs = out.prompt_logprobs
        return res

    return asyncio.run(go())


class Engines:
    """The three engines of the module docstring and the chat encoder."""

    def __init__(self, model: Path, bounds: tuple[int, int, int] | None = None) -> None:
        from prefixgate.local_engine.engine import Engine, EngineConfig

        def make(**kw: Any) -> Any:
            return Engine(EngineConfig(model_path=str(model), num_kv_slots=NUM_KV_SLOTS,
                                       max_context_len=4096, **kw))

        gate = {} if bounds is None else dict(zip(
            ("span_reuse_max_spans", "span_reuse_max_span_tokens", "span_reuse_min_anchor_tokens"),
            bounds))
        self.on = make(span_reuse=True, **gate)
        self.off = make(span_reuse=False)
        self.full = make(enable_prefix_cache=False, span_reuse=False)
        self.tok = self.on.tokenizer
        cfg = self.on.cfg
        self.bounds = {"max_spans": cfg.span_reuse_max_spans,
                       "max_span_tokens": cfg.span_reuse_max_span_tokens,
                       "min_anchor_tokens": cfg.span_reuse_min_anchor_tokens}

    def ids(self, body: dict[str, Any]) -> list[int]:
        """The body's prompt token ids, as the engine's server encodes a Chat request."""
        from prefixgate.local_engine.server.chat import encode_chat

        return list(encode_chat(self.tok, body["messages"], body.get("tools")))

    def shutdown(self) -> None:
        for e in (self.on, self.off, self.full):
            e.shutdown()


def measure(eng: Engines, ids: list[int], tick_ids: list[int] | None, max_tokens: int
            ) -> dict[str, Any]:
    """Steps 1-5 of the module docstring for one request: its row (no token ids, no text)."""
    full = run_one(eng.full, ids, max_tokens)
    answer = full.tokens
    tf = ids + answer
    pos = answer_positions(len(ids), len(answer))
    ref = run_one(eng.full, tf, 1, logprobs_from=pos[0] if pos else len(ids))
    row: dict[str, Any] = {"prompt_tokens": len(ids), "answer_tokens": len(answer)}
    if tick_ids is not None:
        tick = run_one(eng.full, tick_ids + answer, 1, logprobs_from=len(tick_ids) - 1)
        floor = compare(ref.logprobs, tick.logprobs, pos,
                        answer_positions(len(tick_ids), len(answer)), answer)
        row["kl_clock_tick"] = floor["kl_mean"]
    off = run_one(eng.off, tf, 1)
    on = run_one(eng.on, tf, 1, logprobs_from=pos[0] if pos else len(ids))
    got = compare(ref.logprobs, on.logprobs, pos, pos, answer)
    again = run_one(eng.on, ids, max_tokens)
    row.update({
        "cached_off": min(off.cached, len(ids)), "cached_on": min(on.cached, len(ids)),
        "span_reused": on.span_reused, "ttft_ms_off": round(off.ttft_ms, 2),
        "ttft_ms_on": round(on.ttft_ms, 2), "greedy_identical": again.tokens == answer,
        "kl_mean": got["kl_mean"], "kl_max": got["kl_max"], "top1": got["top1"],
        "kl_positions": got["positions"], "kl_missing": got["missing"]})
    return row


# -- the corpus and the adversarial cases ----------------------------------------------------


def sessions(args: argparse.Namespace) -> list[list[Case]]:
    """The answer-stability sessions (module docstring), first ``--sessions`` of them."""
    import random

    rng = random.Random(19)  # answer_stability.corpus's seed and order
    cases = (tau_cases(args.tau_runs, args.turns, args.max_tokens, rng)
             + swe_cases(args.swe_turns, args.max_tokens, rng)
             + passage_cases(args.bank_tasks, args.max_tokens, rng))
    by: dict[str, list[Case]] = {}
    for c in cases:
        by.setdefault(c.session, []).append(c)
    out = list(by.values())
    return out[:args.sessions] if args.sessions else out


def sent_bodies(session: list[Case]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Per request ``(body, tick body)`` as the proxy sends them with the shipped defaults."""
    ticks = [Case(c.session, c.kind, c.turn, c.tick, c.tick, c.clock) for c in session]
    sent = rewrite_session(session, "openai", "auto")
    sent_ticks = rewrite_session(ticks, "openai", "auto")
    return [(s[1], t[1]) for s, t in zip(sent, sent_ticks)]


def _ids_line(k: int) -> str:
    """A per-request id line (``ref-3: 5c...``; request ``b`` of a pair numbers its lines from
    100: its labels are a token longer, its hex digits others)."""
    return f"ref-{k}: " + "".join("0123456789abcdef"[(k * 7 + i * 13) % 16] for i in range(12))


def adversarial_cases(base: dict[str, Any]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Pairs ``(a, b)`` built from one corpus body (its system prompt and messages) to break
    span reuse (module docstring), by name."""
    msgs = base["messages"]
    system, rest = msgs[0]["content"], msgs[1:]

    def body(sys_text: str, tail: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return {**base, "messages": [{"role": "system", "content": sys_text}, *(tail or rest)]}

    last = dict(rest[-1]) if rest and isinstance(rest[-1].get("content"), str) else {
        "role": "user", "content": "Please go on."}
    before = [*rest[:-1], {**last, "content": last["content"] + "\n(sent 10:31:07)"}]
    after = [*rest[:-1], {**last, "content": last["content"] + "\n(sent 10:32:44)"}]
    words = system.split()
    filler_a = " ".join(f"clause {i} applies to fare class {chr(65 + i % 26)}." for i in range(40))
    filler_b = " ".join(f"rule {i} never covers cabin {chr(90 - i % 26)} upgrades." for i in range(40))
    half = len(words) // 2
    big_a = " ".join(words[:half]) + "\n" + filler_a + "\n" + " ".join(words[half:])
    big_b = " ".join(words[:half]) + "\n" + filler_b + "\n" + " ".join(words[half:])
    step = max(1, len(words) // 8)
    many_a = "\n".join(" ".join(words[i:i + step]) + "\n" + _ids_line(k)
                       for k, i in enumerate(range(0, len(words), step)))
    many_b = "\n".join(" ".join(words[i:i + step]) + "\n" + _ids_line(k + 100)
                       for k, i in enumerate(range(0, len(words), step)))
    return {
        "span_right_before_the_answer": (body(system, before), body(system, after)),
        "span_of_200_tokens": (body(big_a), body(big_b)),
        "many_small_spans": (body(many_a), body(many_b)),
        "span_at_the_very_start": (body("[req 7f3a9c01] " + system),
                                   body("[req 0b42e6d9] " + system)),
    }


def adversarial(eng: Engines, base: dict[str, Any], names: list[str] | None,
                max_tokens: int) -> list[dict[str, Any]]:
    """Each adversarial pair: ``a`` sent to ``on`` (and ``off``), then ``b`` measured; its
    verdict ``refused`` / ``within_bounds`` / ``out_of_bounds``."""
    out = []
    for name, (a, b) in adversarial_cases(base).items():
        if names is not None and name not in names:
            continue
        ids_a, ids_b = eng.ids(a), eng.ids(b)
        run_one(eng.on, ids_a, 1)
        run_one(eng.off, ids_a, 1)
        row = {"case": name, "changed_tokens_a_b": changed_window(ids_a, ids_b),
               **measure(eng, ids_b, None, max_tokens)}
        row["verdict"] = verdict(row)
        out.append(row)
        print(f"adversarial {name}: {row['verdict']} span={row['span_reused']} "
              f"kl={row['kl_mean']}", flush=True)
    return out


def changed_window(a: list[int], b: list[int]) -> list[int]:
    """``[first differing position, tokens after it in a, in b]`` (common prefix and suffix
    taken off): the size of the change."""
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    j = 0
    while j < min(len(a), len(b)) - i and a[-1 - j] == b[-1 - j]:
        j += 1
    return [i, len(a) - i - j, len(b) - i - j]


def verdict(row: dict[str, Any]) -> str:
    """``refused`` (no span reuse), ``within_bounds`` (greedy identical and its mean KL within
    :data:`KL_MAX`, the bound on any one request of the corpus) or ``out_of_bounds``."""
    if not row["span_reused"]:
        return "refused"
    ok = row["greedy_identical"] and row["kl_mean"] is not None and row["kl_mean"] <= KL_MAX
    return "within_bounds" if ok else "out_of_bounds"


# -- figures ---------------------------------------------------------------------------------


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b else None


def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``figures`` object (module docstring) from :func:`measure` rows carrying ``turn``."""
    late = [r for r in rows if r["turn"] >= 2]
    kl = [r for r in rows if r["kl_mean"] is not None]
    tick = [r["kl_clock_tick"] for r in kl if r.get("kl_clock_tick") is not None]
    prompt = sum(r["prompt_tokens"] for r in late)
    pre_on = sum(r["prompt_tokens"] - r["cached_on"] for r in late)
    pre_off = sum(r["prompt_tokens"] - r["cached_off"] for r in late)
    t_on = statistics.median(r["ttft_ms_on"] for r in late) if late else None
    t_off = statistics.median(r["ttft_ms_off"] for r in late) if late else None
    figs: dict[str, Any] = {
        "requests": len(rows), "late_requests": len(late),
        "span_reused_requests": sum(1 for r in rows if r["span_reused"]),
        "span_reused_tokens": sum(r["span_reused"] for r in rows),
        "cached_share_turn3_on": _ratio(sum(r["cached_on"] for r in late), prompt),
        "cached_share_turn3_off": _ratio(sum(r["cached_off"] for r in late), prompt),
        "greedy_identical_share": _ratio(sum(r["greedy_identical"] for r in rows), len(rows)),
        "top1_agreement": _ratio(sum(r["top1"] for r in kl), len(kl)),
        "kl_mean": statistics.fmean(r["kl_mean"] for r in kl) if kl else None,
        "kl_max": max((r["kl_mean"] for r in kl), default=None),
        "kl_max_position": max((r["kl_max"] for r in kl), default=None),
        "kl_clock_tick_mean": statistics.fmean(tick) if tick else None,
        "prefill_tokens_on": pre_on, "prefill_tokens_off": pre_off,
        "prefill_tokens_ratio": _ratio(pre_on, pre_off),
        "ttft_p50_ms_on": t_on, "ttft_p50_ms_off": t_off,
        "ttft_p50_ratio": _ratio(t_on, t_off) if t_on is not None and t_off else None,
    }
    figs["goals"] = {k: (figs[k] is not None and (figs[k] >= v if op == ">=" else figs[k] <= v))
                     for k, (op, v) in GOALS.items()}
    figs["kl_by_turn"] = {name: _kl_of([r for r in kl if pick(r["turn"])])
                          for name, pick in (("first_request_of_a_session", lambda t: t == 0),
                                             ("later_requests", lambda t: t >= 1))}
    worst = sorted(kl, key=lambda r: -r["kl_mean"])[:5]
    figs["worst"] = [{k: r.get(k) for k in ("session", "kind", "turn", "span_reused", "kl_mean",
                                            "kl_max", "kl_clock_tick", "greedy_identical")}
                     for r in worst]
    return figs


def _kl_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"requests", "span_reused_requests", "kl_mean", "kl_max", "kl_clock_tick_mean"}`` of
    rows with a KL: the first request of a session reuses another session's K/V (the same
    system prompt and tools, another clock / id / template), the later ones their own."""
    tick = [r["kl_clock_tick"] for r in rows if r.get("kl_clock_tick") is not None]
    return {"requests": len(rows), "span_reused_requests": sum(1 for r in rows if r["span_reused"]),
            "kl_mean": statistics.fmean(r["kl_mean"] for r in rows) if rows else None,
            "kl_max": max((r["kl_mean"] for r in rows), default=None),
            "kl_clock_tick_mean": statistics.fmean(tick) if tick else None}


def _commit() -> str:
    try:
        sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--",
                                "prefixgate", "bench"], capture_output=True, text=True).stdout
        return sha + ("+dirty" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--tau-runs", type=int, default=6)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--swe-turns", type=int, default=4)
    ap.add_argument("--bank-tasks", type=int, default=0)
    ap.add_argument("--sessions", type=int, default=0, help="first N sessions only (0: all)")
    ap.add_argument("--quick", action="store_true", help="3 sessions, 2 adversarial cases")
    ap.add_argument("--span-bounds", default=None, metavar="SPANS,SPAN_TOKENS,MIN_ANCHOR",
                    help="the on engine's gate (default: EngineConfig's, the shipped one)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--refigure", type=Path, default=None,
                    help="recompute the figures of a results file's rows in place (no engine)")
    args = ap.parse_args(argv)
    if args.refigure:
        doc = json.loads(args.refigure.read_text())
        doc["figures"] = {**figures(doc["rows"]),
                          "adversarial_ok": all(a["verdict"] != "out_of_bounds"
                                                for a in doc["adversarial"])}
        args.refigure.write_text(json.dumps(doc, indent=2) + "\n")
        print(json.dumps(doc["figures"], indent=2))
        return 0
    if args.quick:
        args.sessions, args.tau_runs, args.swe_turns = 3, 3, 3
    load0, t0 = os.getloadavg()[0], time.time()
    corpus = sessions(args)  # before the engines load: bad data paths fail at once
    bounds = tuple(int(v) for v in args.span_bounds.split(",")) if args.span_bounds else None
    if bounds is not None and len(bounds) != 3:
        ap.error("--span-bounds takes three integers: SPANS,SPAN_TOKENS,MIN_ANCHOR")
    eng = Engines(args.model, bounds)  # type: ignore[arg-type]
    rows: list[dict[str, Any]] = []
    for s in corpus:
        for c, (body, tick) in zip(s, sent_bodies(s)):
            row = {"session": c.session, "kind": c.kind, "turn": c.turn,
                   **measure(eng, eng.ids(body), eng.ids(tick), args.max_tokens)}
            rows.append(row)
            print(f"[{time.time() - t0:5.0f}s] {c.session} t{c.turn} P={row['prompt_tokens']} "
                  f"cached on/off={row['cached_on']}/{row['cached_off']} "
                  f"span={row['span_reused']} same={int(row['greedy_identical'])} "
                  f"kl={row['kl_mean']} tick={row.get('kl_clock_tick')}", flush=True)
    base = sent_bodies(corpus[0])[-1][0]
    names = ["span_right_before_the_answer", "span_of_200_tokens"] if args.quick else None
    adv = adversarial(eng, base, names, args.max_tokens)
    eng.shutdown()
    command = "python " + " ".join(shlex.quote(a) for a in [
        "bench/span_reuse.py", *(argv if argv is not None else sys.argv[1:])])
    figs = figures(rows)
    figs["adversarial_ok"] = all(a["verdict"] != "out_of_bounds" for a in adv)
    out = {"command": command, "commit": _commit(),
           "load_avg_1m_start_end": [round(load0, 2), round(os.getloadavg()[0], 2)],
           "figures": figs, "adversarial": adv, "rows": rows,
           "setup": {"model": args.model.name, "device": "cpu (fp32)", "greedy": True,
                     "max_tokens": args.max_tokens, "wall_s": round(time.time() - t0, 1),
                     "sessions": len(corpus), "span_bounds": eng.bounds,
                     "engines": "in-process: on (span reuse), off (prefix cache only), full "
                                "(no prefix cache); one request at a time"}}
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({"figures": figs, "adversarial": [(a["case"], a["verdict"]) for a in adv]},
                     indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
