"""Where ``hoist_volatile``'s note goes: the placements, and the note's text in each.

The note carries what was moved out of the system prompt (a clock line, a request id) to after
the stable prefix. Where it lands decides whether the model treats it as context or answers it
(issue 19, item 1: with the note as a new final user message, 7 of 15 greedy SmolLM2 answers
were about the time). Placements (``settings.hoist_target``):

* ``end`` — OpenAI: a new trailing ``{"role": "user"}`` message after the last user / tool
  message; Anthropic: a text block appended to the last message when it is a user turn (after
  its ``tool_result`` blocks, which stay first).
* ``last_user`` — appended to the newest user message (a string content stays a string: the
  note follows the user's text after a blank line, as its own block in the IR). In an OpenAI
  tool loop that message lies before the tool calls, so everything after it is re-read on
  every request where the note changed.
* ``system_end`` — OpenAI only: a trailing ``system`` message (``developer`` when the client's
  own system message is one). OpenAI Chat accepts system messages anywhere; Anthropic has no
  system message after the first turn, so there it resolves to that API's default.
* ``reminder`` — the note as a marked block, ``<system-reminder>`` ... ``</system-reminder>``
  (the late-context pattern of agents such as Claude Code), inside the latest user-side turn:
  appended to the last message when it is a user turn (Anthropic: after its tool results;
  OpenAI: a string stays a string), or — when the last OpenAI message is a tool result, whose
  text is not ours to edit — a new trailing user message holding only the block.
* ``inline`` — placed as ``reminder`` is, written as :func:`values_line`: the moved lines' values
  alone on one bracketed line (``[2024-05-15 15:01:19 EST | req_1a2b]``), no tags, no labels.
  The note search of ``bench/answer_stability.py`` (issue 36: teacher-forced KL of the
  original's answer, placements x wordings at equal reuse) found the values alone, at the end
  of the latest turn, the note the model notices least; the label a moved line had (``The
  current time is``, ``Request ID:``) is not carried, only its value.
* ``auto`` (the default) — per client API, :data:`prefixgate.config.schema.HOIST_TARGET_BY_API`,
  chosen by measurement (``bench/answer_stability.py`` -> ``bench/results/answer_stability.json``).

When the last message is an assistant prefill, every placement puts the note in the newest user
turn instead (a prefill must stay last). Turns are never moved or reordered; the note's block is
flagged ``volatile`` so no breakpoint lands on it.

Note text (:func:`note_text`): the moved lines, each as the client wrote it (``inline``: their
values on one line), then, when some spans were replaced by placeholders in a long line,
:data:`NOTE_HEADER` and one ``[n] line`` entry per placeholder; ``reminder`` wraps it in the
marker tags.
"""

from __future__ import annotations

import re
from dataclasses import replace

from prefixgate.config.schema import HOIST_TARGET_BY_API
from prefixgate.rewriter.wire.ir import Api, Block, Message, Prompt

PLACEMENTS = ("end", "last_user", "system_end", "reminder", "inline")
"""Every concrete placement (``auto`` resolves to one of them)."""
NOTE_HEADER = "(Current values for the placeholders in the instructions above:)"
REMINDER_OPEN = "<system-reminder>"
REMINDER_CLOSE = "</system-reminder>"
_LABELLED = re.compile(r"^(?:the )?[A-Za-z][A-Za-z ]{0,40}?(?: is |: ?)(?P<value>.{1,400}?)\.?$",
                       re.I)
"""A moved line that states or labels its value: ``The current time is X.``, ``Request ID: X``
(a value over 400 characters: the line is kept whole; bounded reach, tests/rewriter/test_linear_scans)."""


def resolve(target: str, api: Api) -> str:
    """The concrete placement of ``target`` for a client ``api``: ``auto`` -> the measured
    default of :data:`HOIST_TARGET_BY_API`; ``system_end`` on Anthropic (no trailing system
    message) -> Anthropic's default."""
    if target == "auto" or (target == "system_end" and api == "anthropic"):
        return HOIST_TARGET_BY_API[api]
    return target


def placeholder(n: int) -> str:
    """The text standing in the system prompt for placeholder ``n``."""
    return f"[see note {n} at the end]"


def values_line(moved_lines: list[str]) -> str:
    """``inline``'s note line: each moved line's value (the text after ``<label> is`` or
    ``<label>:``, a final period dropped; a line with no such label whole), ``" | "``-joined in
    brackets: ``["The current time is X.", "Request ID: req_1"]`` -> ``"[X | req_1]"``."""
    values = []
    for line in moved_lines:
        m = _LABELLED.match(line.strip())
        values.append(m.group("value").strip() if m else line.strip())
    return "[" + " | ".join(values) + "]"


def note_text(moved_lines: list[str], entries: list[str], placement: str) -> str:
    """The note (module docstring): moved lines (``inline``: :func:`values_line`), then
    numbered placeholder entries."""
    parts = [values_line(moved_lines)] if placement == "inline" and moved_lines else list(moved_lines)
    if entries:
        parts.append(NOTE_HEADER)
        parts += [f"[{i}] {e}" for i, e in enumerate(entries, 1)]
    body = "\n".join(parts)
    if placement == "reminder":
        return f"{REMINDER_OPEN}\n{body}\n{REMINDER_CLOSE}"
    return body


def _newest_user(msgs: tuple[Message, ...]) -> int | None:
    for i in range(len(msgs) - 1, -1, -1):
        if msgs[i].role == "user":
            return i
    return None


def _system_role(prompt: Prompt) -> str:
    first = prompt.system[0].raw.get("role") if prompt.system else None
    return "developer" if first == "developer" else "system"


def _appended(m: Message, note: str, join_string: bool) -> Message:
    """``m`` with ``note`` as a new volatile text block after its content; the blocks before
    it keep their bytes (later passes still read the user's own text as theirs). After a text
    block the note starts with a blank line (renderers that glue text parts, a one-string
    content, keep them apart). A one-string content stays a string when ``join_string``, else
    becomes a list."""
    lead = "\n\n" if m.blocks and m.blocks[-1].is_text else ""
    out = m.with_blocks([*m.blocks, Block.text_block(lead + note, volatile=True)])
    return out if join_string and m.form == "string" else replace(out, form="list")


def add_note(prompt: Prompt, note: str, placement: str) -> tuple[Prompt, str] | None:
    """``prompt`` with ``note`` at ``placement`` (a concrete one, see :func:`resolve`) and where
    it went (``messages[i]``, ``(new user turn)`` / ``(new system turn)``); ``None`` when the
    prompt has no user turn to carry it."""
    msgs = list(prompt.messages)
    if not msgs:
        return None
    last = msgs[-1]
    openai_tail = prompt.api == "openai" and last.role in ("user", "tool")
    if openai_tail and placement == "end" or \
            openai_tail and placement in ("reminder", "inline") and last.role == "tool":
        msgs.append(Message("user", (Block.text_block(note, volatile=True),), "string",
                            {"role": "user", "content": note}))
        return replace(prompt, messages=tuple(msgs)), f"messages[{len(msgs) - 1}] (new user turn)"
    if openai_tail and placement == "system_end":
        role = _system_role(prompt)
        msgs.append(Message(role, (Block.text_block(note, volatile=True),), "string",
                            {"role": role, "content": note}))
        return replace(prompt, messages=tuple(msgs)), f"messages[{len(msgs) - 1}] (new {role} turn)"
    i = _newest_user(prompt.messages)
    if i is None:
        return None
    join = prompt.api == "openai" or placement == "last_user"
    msgs[i] = _appended(msgs[i], note, join)
    return replace(prompt, messages=tuple(msgs)), f"messages[{i}]"
