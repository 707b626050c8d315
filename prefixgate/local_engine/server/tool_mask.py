"""Which tool calls a chat request may make: ``tool_choice`` -> a :class:`ToolConstraint`.

OpenAI's Chat Completions rules (function-calling guide, "tool choice" and "allowed tools",
read 2026-12-01), made binding here by masking at decode time
(:mod:`prefixgate.local_engine.server.constrained`):

- absent or ``"auto"``: no constraint (the model may answer text or call any tool);
- ``"none"``: mode ``none`` — the answer is text, a ``<tool_call>`` block cannot be written;
- ``"required"``: mode ``required`` over every tool — the answer is exactly one call;
- ``{"type": "function", "function": {"name": N}}``: mode ``required`` over ``[N]``;
- ``{"type": "allowed_tools", "allowed_tools": {"mode": "auto" | "required", "tools": [...]}}``
  (each entry ``{"type": "function", "function": {"name": N}}`` or the Responses form
  ``{"type": "function", "name": N}``): that mode over the named tools. All tools stay in the
  prompt (its bytes, so its prefix cache, do not change); only the calls are restricted.

One call per answer in ``required`` and ``auto`` modes when constrained (no parallel calls).
Errors are :class:`prefixgate.local_engine.server.protocol.ApiError` 400s naming ``tool_choice``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from prefixgate.local_engine.server.protocol import ApiError

__all__ = ["ToolConstraint", "resolve_tool_constraint", "tool_name", "tool_parameters"]

Mode = Literal["auto", "required", "none"]


@dataclass(frozen=True)
class ToolConstraint:
    """The calls allowed: ``mode`` and the allowed tool names (request order, no repeats)."""

    mode: Mode
    names: tuple[str, ...]


def tool_name(tool: dict[str, Any]) -> str | None:
    """A tool definition's name (``{"type": "function", "function": {"name"}}``), or None."""
    fn = tool.get("function")
    name = fn.get("name") if isinstance(fn, dict) else tool.get("name")
    return name if isinstance(name, str) else None


def tool_parameters(tool: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema of a tool's arguments (an empty object schema when absent)."""
    fn = tool.get("function")
    params = fn.get("parameters") if isinstance(fn, dict) else tool.get("parameters")
    return params if isinstance(params, dict) else {"type": "object", "properties": {}}


def _bad(message: str) -> ApiError:
    return ApiError(message, param="tool_choice", code="invalid_value")


def _choice_name(entry: Any) -> str:
    if isinstance(entry, dict):
        fn = entry.get("function")
        name = fn.get("name") if isinstance(fn, dict) else entry.get("name")
        if isinstance(name, str):
            return name
    raise _bad("Each allowed tool must be {'type': 'function', 'function': {'name': ...}}.")


def _allowed(choice: dict[str, Any], defined: list[str]) -> ToolConstraint:
    spec = choice.get("allowed_tools")
    if not isinstance(spec, dict):
        raise _bad("tool_choice of type 'allowed_tools' needs an 'allowed_tools' object.")
    mode = spec.get("mode", "auto")
    if mode not in ("auto", "required"):
        raise _bad(f"allowed_tools.mode must be 'auto' or 'required', not {mode!r}.")
    tools = spec.get("tools")
    if not isinstance(tools, list) or not tools:
        raise _bad("allowed_tools.tools must be a non-empty list of tools.")
    wanted = [_choice_name(t) for t in tools]
    unknown = sorted(set(wanted) - set(defined))
    if unknown:
        raise _bad(f"allowed_tools names tools that are not in 'tools': {unknown}.")
    return ToolConstraint(mode, tuple(n for n in defined if n in set(wanted)))


def resolve_tool_constraint(tools: list[dict[str, Any]] | None,
                            tool_choice: str | dict[str, Any] | None) -> ToolConstraint | None:
    """The constraint ``tool_choice`` puts on the answer (rules: module docstring), or None
    when decoding is left free. Raises ApiError(400) for a choice that names no defined tool,
    a forcing choice without ``tools``, or an unknown shape."""
    defined = [n for n in (tool_name(t) for t in tools or []) if n is not None]
    if tool_choice is None or tool_choice == "auto":
        return None
    if tool_choice == "none":
        return ToolConstraint("none", ()) if defined else None
    if not defined:
        raise _bad("tool_choice forces a tool call but the request defines no tools.")
    if tool_choice == "required":
        return ToolConstraint("required", tuple(dict.fromkeys(defined)))
    if isinstance(tool_choice, dict):
        kind = tool_choice.get("type")
        if kind == "allowed_tools":
            return _allowed(tool_choice, list(dict.fromkeys(defined)))
        if kind == "function":
            name = _choice_name(tool_choice)
            if name not in defined:
                raise _bad(f"tool_choice names '{name}', which is not in 'tools'.")
            return ToolConstraint("required", (name,))
    raise _bad("tool_choice must be 'none', 'auto', 'required', a function or allowed_tools.")
