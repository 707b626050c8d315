"""The note search of ``bench/answer_stability.py`` (issue 36, item 1): where and how the hoisted
note is written, measured by teacher-forced KL at equal prefix reuse.

Every candidate starts from the OpenAI ``end`` rewrite of a request (the moves on: the clock /
id lines out of the system prompt, the note as a new trailing user message holding the moved
lines as the client wrote them); where ``hoist_volatile`` moved something, the note message is
taken off (:func:`split_note`) and written again at a placement in a wording
(:func:`candidate`); where it did not, the candidate is that rewrite unchanged.

Placements (:data:`PLACEMENTS`), each after the part of the prompt the next request repeats
(the note of the previous request is gone from it, so its prefix is reused up to there):

* ``end`` — a new trailing user message (the rewriter's ``end``);
* ``in_last`` — appended to the last message after a blank line, whatever its role (a user
  turn, as the rewriter's ``last_user`` / ``reminder`` do; a tool result too, whose text the
  rewriter never edits: a tool result reaches the backend as the tool wrote it, DESIGN.md
  "Meaning is kept"). The rewriter's ``inline`` placement is ``in_last/values`` after a user
  turn and ``end/values`` after a tool result (``bench/note_inline_check.py`` checks the
  token identity and takes its figures from these two);
* ``tool_pair`` — a synthetic tool exchange at the end: an assistant call of
  :data:`CLOCK_TOOL` (no arguments) and its tool result holding the note;
* ``system_end`` — a new trailing system message (the rewriter's ``system_end``).

Near misses (:data:`NEAR_MISSES`, wording ``line`` only), before the end of what the next
request repeats, so that part is re-read: ``before_last`` — a new user message before the last
message; ``prepend_last`` — at the start of the last message, before its text;
``system_tail`` — appended to the end of the (edited) system prompt, before the tools' and the
history's tokens.

Wordings (:data:`WORDINGS`) of the moved lines: ``line`` (as the client wrote them: the
rewriter's note today), ``kv`` (bare ``key: value`` lines, :func:`kv_line`), ``reminder`` (the
``<system-reminder>`` block of the rewriter's ``reminder``), ``json`` (one JSON object of the
``kv`` pairs), ``values`` (the values alone on one bracketed line, ``[X | req_1]``).
"""

from __future__ import annotations

import json
import re
from typing import Any

PLACEMENTS = ("end", "in_last", "tool_pair", "system_end")
"""The placements tried in every wording (module docstring)."""
NEAR_MISSES = ("before_last/line", "prepend_last/line", "system_tail/line")
"""Placements before the repeated part's end, tried in one wording: what moving the note away
from the answer buys in KL and costs in reuse."""
WORDINGS = ("line", "kv", "reminder", "json", "values")
CLOCK_TOOL = "get_request_context"
"""The name of :func:`candidate`'s synthetic tool (``tool_pair``)."""
_KV = re.compile(r"^(?:the )?(?P<key>[A-Za-z][A-Za-z ]{0,40}?)(?: is |: ?)(?P<value>.+?)\.?$", re.I)


def names() -> list[str]:
    """Every candidate's name, ``<placement>/<wording>``, in search order."""
    return [f"{p}/{w}" for p in PLACEMENTS for w in WORDINGS] + list(NEAR_MISSES)


def split_note(body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``(body without its note, the note)`` of an OpenAI ``end`` rewrite where
    ``hoist_volatile`` moved something (its note is the trailing user message).
    Raises ValueError when the last message is not that note."""
    last = body["messages"][-1]
    if last.get("role") != "user" or not isinstance(last.get("content"), str):
        raise ValueError("the end rewrite's last message is not its note")
    return dict(body, messages=list(body["messages"][:-1])), last["content"]


def kv_line(line: str) -> tuple[str, str] | None:
    """``(key, value)`` of a moved line written as a statement or a header: ``The current time
    is X.`` -> ``("current_time", "X")``, ``Request ID: req_1`` -> ``("request_id", "req_1")``;
    None for any other line (kept as it is)."""
    m = _KV.match(line.strip())
    if not m:
        return None
    return m.group("key").strip().lower().replace(" ", "_"), m.group("value").strip()


def worded(note: str, wording: str) -> str:
    """The note's moved lines in ``wording`` (module docstring)."""
    lines = [x for x in note.split("\n") if x.strip()]
    if wording == "line":
        return "\n".join(lines)
    if wording == "reminder":
        return "<system-reminder>\n" + "\n".join(lines) + "\n</system-reminder>"
    pairs = [kv_line(x) for x in lines]
    if wording == "kv":
        return "\n".join(f"{p[0]}: {p[1]}" if p else x for p, x in zip(pairs, lines))
    if wording == "json":
        obj = {p[0]: p[1] for p in pairs if p}
        rest = [x for p, x in zip(pairs, lines) if not p]
        return json.dumps(obj) + ("\n" + "\n".join(rest) if rest else "")
    if wording == "values":  # the rewriter's own ``inline`` line, placeholder entries after it
        from prefixgate.rewriter.analysis.note_placement import NOTE_HEADER, values_line

        cut = lines.index(NOTE_HEADER) if NOTE_HEADER in lines else len(lines)
        return "\n".join([values_line(lines[:cut]), *lines[cut:]] if cut else lines)
    raise ValueError(f"unknown wording {wording!r}")


def candidate(bare: dict[str, Any], note: str, name: str) -> dict[str, Any]:
    """``bare`` (a Chat body without its note) with ``note`` written as candidate ``name``
    (``<placement>/<wording>``, :func:`names`); a new body, ``bare`` untouched."""
    placement, wording = name.split("/")
    text = worded(note, wording)
    msgs = [dict(m) for m in bare["messages"]]
    if placement == "end":
        msgs.append({"role": "user", "content": text})
    elif placement == "in_last":
        msgs[-1]["content"] = f"{msgs[-1].get('content') or ''}\n\n{text}"
    elif placement == "tool_pair":
        msgs += [{"role": "assistant", "content": None, "tool_calls": [
                     {"id": "call_context", "type": "function",
                      "function": {"name": CLOCK_TOOL, "arguments": "{}"}}]},
                 {"role": "tool", "tool_call_id": "call_context", "content": text}]
    elif placement == "system_end":
        msgs.append({"role": "system", "content": text})
    elif placement == "before_last":
        msgs.insert(len(msgs) - 1, {"role": "user", "content": text})
    elif placement == "prepend_last":
        msgs[-1]["content"] = f"{text}\n\n{msgs[-1].get('content') or ''}"
    elif placement == "system_tail":
        first = next(i for i, m in enumerate(msgs) if m.get("role") in ("system", "developer"))
        msgs[first]["content"] = f"{msgs[first]['content']}\n{text}"
    else:
        raise ValueError(f"unknown placement {placement!r}")
    return dict(bare, messages=msgs)


def _summary(per_request: list[dict[str, Any]]) -> dict[str, Any]:
    from bench.teacher_forced import summary

    got = summary(per_request)
    return {"kl_mean": got["kl_mean"], "top1_agreement": got["top1_agreement"],
            "nll_delta": got["nll_delta"]}


def _share(rows: list[dict[str, Any]], key: str) -> float | None:
    xs = [r["reuse"][key] for r in rows if r["turn"] >= 2 and key in r["reuse"]]
    return round(sum(x[0] for x in xs) / sum(x[1] for x in xs), 3) if xs else None


def figures(rows: list[dict[str, Any]], margin: float) -> dict[str, Any]:
    """``figures.note_search`` of ``bench/answer_stability.py`` from its rows: per candidate
    its teacher-forced figures over the requests where the note exists (``kl_mean``,
    ``top1_agreement``, ``nll_delta``; ``changed``: requests whose greedy answer under the
    candidate is not the original's, token for token — some answer position's top-1 is not the
    original's token), and its ``turn3_on_cached_share`` over every request; the rewriter's own
    OpenAI placements on the same requests (``rewriter``); ``chosen``: among the candidates
    whose cached share from turn 3 on is within ``margin`` of the best, the lowest ``kl_mean``;
    ``kl_ratio_to_reminder``: its ``kl_mean`` over the rewriter's ``reminder`` placement's
    (issue 36's goal: at most 0.5)."""
    noted = [r for r in rows if r["search"]]
    cands = {n: {**_summary([r["search"][n] for r in noted]),
                 "changed": sum(1 for r in noted if r["search"][n]["changed"]),
                 "turn3_on_cached_share": _share(rows, f"search:{n}")} for n in names()}
    rewriter = {k: {**_summary([r["variants"][k] for r in noted]),
                    "turn3_on_cached_share": _share(rows, k)}
                for k in rows[0]["variants"] if k.startswith("openai/") and k != "openai/defaults"}
    shares = [c["turn3_on_cached_share"] for c in cands.values() if c["turn3_on_cached_share"] is not None]
    best = max(shares) if shares else None
    kept = [n for n, c in cands.items() if best is not None and c["kl_mean"] is not None
            and (c["turn3_on_cached_share"] or 0) >= best - margin]
    chosen = min(kept, key=lambda n: (cands[n]["kl_mean"], names().index(n))) if kept else None
    ref = rewriter.get("openai/reminder", {}).get("kl_mean")
    ratio = round(cands[chosen]["kl_mean"] / ref, 3) if chosen and ref else None
    return {"requests": len(noted), "candidates": cands, "rewriter": rewriter,
            "best_turn3_on_cached_share": best, "reusable": kept, "chosen": chosen,
            "kl_ratio_to_reminder": ratio, "goal_half_of_reminder": ratio is not None and ratio <= 0.5}
