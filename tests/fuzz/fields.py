"""Field accounting for the bridges: each top-level field maps, or the request gets a 400.

Rule (issue 8, "Translation is lossless or refuses"): each field of the client's request maps to
its counterpart, is carried as delimited text, or the request is refused with a 400 naming it;
nothing is dropped silently. :data:`A2O` / :data:`O2A` say where each known client field must
appear in the upstream body (a dotted path); a field not in the table must arrive under its own
name. A mapped number must keep its exact JSON text. Fields carried inside the messages
(``system``, ``messages``, ``tools``, ``tool_choice``) are the meaning checker's, not this one's.
"""

from __future__ import annotations

from typing import Any

from tests.fuzz.jsontext import Num
from tests.fuzz.meaning import Violation

CONTENT = frozenset({"messages", "system", "tools", "tool_choice", "model"})

# client field -> upstream path(s), any of which may carry it
A2O: dict[str, tuple[str, ...]] = {
    "max_tokens": ("max_tokens", "max_completion_tokens"), "temperature": ("temperature",),
    "top_p": ("top_p",), "top_k": ("top_k",), "stop_sequences": ("stop",), "stream": ("stream",),
    "metadata": ("user", "metadata"), "thinking": ("reasoning_effort", "thinking"),
}
O2A: dict[str, tuple[str, ...]] = {
    "max_tokens": ("max_tokens",), "max_completion_tokens": ("max_tokens",),
    "temperature": ("temperature",), "top_p": ("top_p",), "stop": ("stop_sequences",),
    "user": ("metadata.user_id",), "stream": ("stream",),
    "stream_options": ("",),  # consumed by the proxy itself (include_usage on the way back)
    "parallel_tool_calls": ("tool_choice.disable_parallel_tool_use",),
    "metadata": ("metadata",),
}


VOID = {("parallel_tool_calls", (True, "none"))}
"""(client field, what the upstream body holds at tool_choice.type) where the field can have no
effect and the bridge documents it is not carried: with tool_choice none no tool call is made."""


def _get(body: dict[str, Any], path: str) -> tuple[bool, Any]:
    node: Any = body
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _numbers(v: Any) -> list[str]:
    if isinstance(v, Num):
        return [str(v)]
    if isinstance(v, list):
        return [x for e in v for x in _numbers(e)]
    if isinstance(v, dict):
        return [x for e in v.values() for x in _numbers(e)]
    return []


def field_violations(client: dict[str, Any], upstream: dict[str, Any], client_api: str) -> list[Violation]:
    """Top-level client fields the bridge dropped or whose numbers changed text."""
    table = A2O if client_api == "anthropic" else O2A
    out: list[Violation] = []
    for key, v in client.items():
        if key in CONTENT or v is None or v is False:
            continue
        paths = table.get(key, (key,))
        if paths == ("",) or (key, _get(upstream, "tool_choice.type")) in VOID:
            continue
        found = [val for ok, val in (_get(upstream, p) for p in paths) if ok]
        if not found:
            out.append(Violation("field_dropped", f"{client_api} client field {key!r} "
                                 f"(value {str(v)[:40]!r}) reached the upstream nowhere"))
            continue
        want = _numbers(v)
        have = [x for val in found for x in _numbers(val)]
        lost = [n for n in want if n not in have]
        if lost:
            out.append(Violation("number_text_changed", f"field {key!r}: {lost[:3]} arrived as "
                                 f"{have[:3] or [str(found[0])[:40]]}"))
    return out
