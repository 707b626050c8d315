"""Structural check of a bridge's output: a translated body the backend's API would reject is a
400 before anything is sent, never an upstream error (issue 8, *Translation is lossless or
refuses*).

A client body can be valid for its own API and still map to nothing valid in the other one
(an OpenAI user turn ``content: []`` leaves the Messages body without messages; an OpenAI tool
message whose ``tool_call_id`` no call before it has becomes an orphan ``tool_result``). The
bridges map field by field; this module checks the result as a whole against the backend API's
structural rules, so every such case is refused by construction, whatever field led to it.

Rules (the same the fuzzer's :mod:`tests.fuzz.shapes` checks, from the API references):

- Anthropic Messages (create message): ``messages`` non-empty; roles ``user`` / ``assistant``;
  ``content`` a non-empty string or a non-empty list of blocks; ``text`` blocks non-empty;
  ``system`` a string or text blocks only, each non-empty; a user turn after an assistant turn
  with ``tool_use`` blocks starts with exactly one ``tool_result`` per ``tool_use`` id
  (``tool_result`` blocks first in the turn), and no ``tool_result`` answers anything else.
- OpenAI Chat Completions (create): ``messages`` non-empty; ``content`` non-empty for user /
  system turns, null only for an assistant turn with ``tool_calls``; an assistant's
  ``tool_calls`` are each answered by a ``tool`` message (``tool_call_id``) right after it, and a
  ``tool`` message answers a call of the assistant turn before it.

:func:`anthropic_problem` / :func:`openai_problem` return the first problem as a
:class:`Problem`: the offending node of the translated body (a message, block or tool call
dict; None for the body's ``messages`` as a whole) and one sentence saying why. The caller
(:func:`checked`) names the client's param for that node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prefixgate.proxy.core import exactjson
from prefixgate.proxy.core.errors import InvalidRequest, quoted


@dataclass(frozen=True)
class Problem:
    """The first structural problem of a translated body: ``node`` (the message / block / tool
    call dict at fault, or None for the ``messages`` list), ``why`` (one sentence)."""

    node: dict[str, Any] | None
    why: str


_EMPTY = Problem(None, "nothing of the conversation is left to send: the other API needs at least "
                       "one message with content")


def _text_ok(b: dict[str, Any]) -> bool:
    return isinstance(b.get("text"), str) and b["text"] != ""


def _anthropic_system(system: Any) -> Problem | None:
    if system is None or isinstance(system, str):
        return None
    for b in system if isinstance(system, list) else [None]:
        if not isinstance(b, dict) or b.get("type") != "text":
            return Problem(b if isinstance(b, dict) else None,
                           "the Messages API's system prompt holds text blocks only")
        if not _text_ok(b):
            return Problem(b, "the Messages API rejects an empty text block in the system prompt")
    return None


Calls = dict[Any, dict[str, Any]]  # tool_use id -> its block


def _unanswered(calls: Calls, answered: list[str]) -> Problem:
    first = next(b for i, b in calls.items() if i not in answered)
    return Problem(first, "this tool call is not answered by a tool result first thing in the "
                   "next user turn")


def _anthropic_turn(m: dict[str, Any], calls: Calls) -> tuple[Problem | None, Calls]:
    """Check one turn given the tool_use blocks of the assistant turn before it (empty if
    none); return the problem and this turn's own tool_use blocks."""
    role, content = m.get("role"), m.get("content")
    if role not in ("user", "assistant"):
        return Problem(m, f"the Messages API has user and assistant turns, not {role!r}"), {}
    if calls and (role != "user" or isinstance(content, str)):
        return _unanswered(calls, []), {}
    if isinstance(content, str):
        return (Problem(m, "the Messages API rejects a turn with no content")
                if not content else None), {}
    if not isinstance(content, list) or not content:
        return Problem(m, "the Messages API rejects a turn with no content"), {}
    answered: list[str] = []
    for i, b in enumerate(content):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and not _text_ok(b):
            return Problem(b, "the Messages API rejects an empty text block"), {}
        if kind == "tool_result":
            if b.get("tool_use_id") not in calls or b.get("tool_use_id") in answered:
                return Problem(b, "this tool result answers no tool call of the assistant turn "
                               "right before it"), {}
            if role != "user" or len(answered) != i:
                return Problem(b, "a tool result must come first in the user turn right after "
                               "the assistant's tool call"), {}
            answered.append(b["tool_use_id"])
    if set(answered) != set(calls):
        return _unanswered(calls, answered), {}
    own = {b.get("id"): b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"}
    return None, own if role == "assistant" else {}


def anthropic_problem(body: dict[str, Any]) -> Problem | None:
    """The first structural problem of a Messages request body (see module docstring)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        return _EMPTY
    problem = _anthropic_system(body.get("system"))
    calls: Calls = {}
    for m in msgs:
        if problem is not None:
            return problem
        if not isinstance(m, dict):
            return Problem(None, "a message is not an object")
        problem, calls = _anthropic_turn(m, calls)
    return problem


def _openai_content(m: dict[str, Any]) -> Problem | None:
    role, c = m.get("role"), m.get("content")
    if c is None:
        if role == "assistant" and m.get("tool_calls"):
            return None
        return Problem(m, f"a {role} message needs content")
    if isinstance(c, list):
        if not c and role != "assistant":
            return Problem(m, f"a {role} message needs content")
        for p in c:
            if isinstance(p, dict) and p.get("type") == "text" and not isinstance(p.get("text"), str):
                return Problem(p, "a text part needs text")
    return None


def openai_problem(body: dict[str, Any]) -> Problem | None:
    """The first structural problem of a Chat Completions request body (module docstring)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        return _EMPTY
    pending: dict[Any, dict[str, Any]] = {}  # tool_call id -> its call, not yet answered
    for m in msgs:
        if not isinstance(m, dict):
            return Problem(None, "a message is not an object")
        problem = _openai_content(m)
        if problem is not None:
            return problem
        if m.get("role") == "tool":
            if m.get("tool_call_id") not in pending:
                return Problem(m, "this tool message answers no tool call of the assistant "
                               "message right before it")
            del pending[m["tool_call_id"]]
            continue
        if pending:
            return Problem(next(iter(pending.values())), "this tool call is not answered by a "
                           "tool message right after the assistant message")
        calls = m.get("tool_calls") if m.get("role") == "assistant" else None
        pending = {c.get("id"): c for c in calls or [] if isinstance(c, dict)}
    if pending:
        return Problem(next(iter(pending.values())), "this tool call is not answered by a tool "
                       "message right after the assistant message")
    return None


def checked(convert: Callable[[dict[str, Any], dict[int, str]], dict[str, Any]],
            body: dict[str, Any], problem: Callable[[dict[str, Any]], Problem | None]
            ) -> dict[str, Any]:
    """``convert(body, origins)`` (a bridge's request mapping, which records in ``origins`` the
    client field each node came from), checked as a whole by ``problem``. Raises
    InvalidRequest (400, ``param`` naming the client's field) for a shape no field check
    foresaw and for a result the backend's API would reject (module docstring)."""
    origins: dict[int, str] = {}
    try:
        out = convert(body, origins)
    except (TypeError, AttributeError, ValueError, KeyError) as e:  # a shape no check foresaw
        raise InvalidRequest(
            f"The request could not be translated for this model's backend: a field has an "
            f"unexpected type or shape ({type(e).__name__}: {str(e)[:120]}).") from None
    found = problem(out)
    if found is not None:
        node = found.node
        param = origins.get(id(node), "messages") if node is not None else "messages"
        raise InvalidRequest(f"{quoted(param)} cannot be translated for this model's backend (it "
                             f"speaks the other API): {found.why}.", param=param,
                             code="unsupported_parameter")
    return out


def encoded(out: dict[str, Any]) -> bytes:
    """A translated body as upstream bytes (numbers keep their text). A body that cannot be
    serialised (a value JSON cannot hold, nesting past orjson's 255 levels) is InvalidRequest
    (400) from the bridge step, never a 500."""
    try:
        return exactjson.dumps(out)
    except TypeError as e:  # orjson.JSONEncodeError is a TypeError
        raise InvalidRequest(f"'messages' could not be translated for this model's backend: "
                             f"the translated body cannot be written as JSON ({str(e)[:120]}).",
                             param="messages") from None
