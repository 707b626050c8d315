"""What an answer decided, as one canonical string, so that two answers compare by equality.

A trial sends one request three ways (original, repeat, variant) and asks whether the answers
*decide* the same thing, not whether they are byte-equal:

- **tool calls** (any in the answer): each call as ``tool:<name>`` + the canonical JSON of its
  arguments (parsed from the wire's string when it is JSON; sorted keys, no spaces, non-ASCII
  kept), in the answer's order, one per line. Text beside the calls is not compared. Arguments
  cut off by the trial's small ``max_tokens`` are not JSON: the raw string is compared.
- **text** otherwise: ``text:`` + the first ``first_tokens`` whitespace-separated tokens,
  casefolded, joined by one space (so line breaks, runs of spaces and case do not count; a
  difference after the first N tokens does not either).
- **a refusal**: ``refusal`` (Chat ``message.refusal`` or a ``refusal`` content part, a
  Messages ``stop_reason`` of ``"refusal"``, a Responses ``refusal`` content part; text beside
  it is not compared), whatever its wording: a refusal decides
  something, unlike an empty answer, so a variant that turns an answer into a refusal (or back)
  is a change.
- **an error or an empty answer**: ``error:<type>`` (the error object's ``type`` or ``code``,
  ``empty`` when the answer holds neither text, a call nor a refusal). Such an answer decided
  nothing (:func:`decided`): the trial drops a pair whose ORIGINAL answer is one (there is
  nothing to compare against; a reasoning model whose trial cap ends inside its reasoning
  answers empty every time, and counting those as unchanged would turn a move on with no
  evidence). A repeat or variant that decides nothing where the original decided is a change.

Reasoning / thinking content is not a decision and is skipped. Bodies are the providers'
non-streamed JSON: OpenAI Chat Completions (``api="openai"``: ``choices[0].message``),
Anthropic Messages (``"anthropic"``: ``content`` blocks) and OpenAI Responses (``"responses"``:
``output`` items).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

APIS = ("openai", "anthropic", "responses")
REFUSAL = "refusal"


def canonical_json(value: Any) -> str:
    """``value`` as JSON with sorted keys and no insignificant whitespace."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _arguments(raw: Any) -> str:
    """Canonical arguments: a JSON string parsed first; any other string kept as it is."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return raw
    return canonical_json(raw)


def _call(name: Any, arguments: Any) -> str:
    return f"tool:{name}{_arguments(arguments)}"


def _text(text: str, first_tokens: int) -> str:
    return "text:" + " ".join(text.casefold().split()[:first_tokens])


def _parts_text(content: Any, kinds: tuple[str, ...]) -> str:
    """Text of a string content, or of the parts of a list whose ``type`` is in ``kinds``."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content
                       if isinstance(p, Mapping) and p.get("type") in kinds)
    return ""


def _refusal_part(content: Any) -> bool:
    """Whether a list ``content`` holds a part of type ``refusal`` (Chat and Responses)."""
    return isinstance(content, list) and any(
        isinstance(p, Mapping) and p.get("type") == "refusal" for p in content)


def _error(answer: Mapping[str, Any]) -> str | None:
    err = answer.get("error")
    if isinstance(err, Mapping):
        return f"error:{err.get('type') or err.get('code') or 'error'}"
    if err:
        return f"error:{err}"
    if answer.get("type") == "error" or answer.get("status") == "failed":
        return "error:failed"
    return None


def _openai(answer: Mapping[str, Any]) -> tuple[list[str], bool, str]:
    choices = answer.get("choices") or []
    first = choices[0] if isinstance(choices, list) and choices else None
    message = (first.get("message") if isinstance(first, Mapping) else None) or {}
    calls = [_call((tc.get("function") or {}).get("name"), (tc.get("function") or {}).get("arguments"))
             for tc in message.get("tool_calls") or [] if isinstance(tc, Mapping)]
    legacy = message.get("function_call")
    if not calls and isinstance(legacy, Mapping):
        calls = [_call(legacy.get("name"), legacy.get("arguments"))]
    content = message.get("content")
    refused = ((isinstance(message.get("refusal"), str) and bool(message["refusal"].strip()))
               or _refusal_part(content))
    return calls, refused, _parts_text(content, ("text",))


def _anthropic(answer: Mapping[str, Any]) -> tuple[list[str], bool, str]:
    blocks = [b for b in answer.get("content") or [] if isinstance(b, Mapping)]
    calls = [_call(b.get("name"), b.get("input")) for b in blocks if b.get("type") == "tool_use"]
    return calls, answer.get("stop_reason") == "refusal", _parts_text(blocks, ("text",))


def _responses(answer: Mapping[str, Any]) -> tuple[list[str], bool, str]:
    items = [i for i in answer.get("output") or [] if isinstance(i, Mapping)]
    calls = [_call(i.get("name"), i.get("arguments")) for i in items if i.get("type") == "function_call"]
    messages = [i.get("content") for i in items if i.get("type") == "message"]
    refused = any(_refusal_part(c) for c in messages)
    text = "".join(_parts_text(c, ("output_text", "text")) for c in messages)
    return calls, refused, text


_READERS = {"openai": _openai, "anthropic": _anthropic, "responses": _responses}


def decision_of(answer: Mapping[str, Any], api: str, first_tokens: int) -> str:
    """The canonical decision of a non-streamed ``answer`` body of ``api`` (module docstring).
    Raises ValueError for an ``api`` not in :data:`APIS` or ``first_tokens < 1``."""
    if api not in _READERS:
        raise ValueError(f"api must be one of {APIS}, got {api!r}")
    if first_tokens < 1:
        raise ValueError(f"first_tokens must be >= 1, got {first_tokens}")
    if not isinstance(answer, Mapping):
        return "error:not_json"
    err = _error(answer)
    if err is not None:
        return err
    calls, refused, text = _READERS[api](answer)
    if calls:
        return "\n".join(calls)
    if refused:
        return REFUSAL
    if not text.split():
        return "error:empty"
    return _text(text, first_tokens)


def decided(decision: str) -> bool:
    """Whether an answer's decision (:func:`decision_of`) decided anything: False for an error
    or an empty answer (``error:...``), True for tool calls, a refusal or text."""
    return not decision.startswith("error:")


def changed(a: str, b: str) -> bool:
    """Whether two decisions (:func:`decision_of`) differ."""
    return a != b
