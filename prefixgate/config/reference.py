"""The policy reference (``docs/policy.md``), generated from the schema so it cannot drift.

``python -m prefixgate.config.reference > docs/policy.md`` (also ``prefixgate config reference``) writes,
for each section of :class:`prefixgate.config.schema.Policy`: its docstring, a table of every key with its
type and default, and the section's defaults as a YAML example. ``tests/config`` checks the
committed file against this output.

The sections are found, not listed (issue 20: ``holdout``, ``slo``, ``fanout``, ``tenants``,
``retry``, ``breaker`` and ``health_checks`` were missing from a hand-kept list):
:func:`sections` walks ``Policy``'s fields depth first, and every pydantic model a field holds —
directly, in a list or dict, or in a union — is a section at that field's dotted path
(``backends.timeouts``, ``routes.fallbacks``), each model once. :data:`EXAMPLES` gives the YAML
example of a section whose defaults are not one (required keys, or a path through a dict or list).
"""

from __future__ import annotations

import inspect
from typing import Any, get_args

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from prefixgate.config.schema import Policy

_BACKEND_GROUP = {"kind": "openai_compat", "deployments": [
    {"base_url": "http://10.0.0.1:8000/v1", "name": "vllm-a"},
    {"base_url": "http://10.0.0.2:8000/v1", "name": "vllm-b"}]}

EXAMPLES: dict[str, Any] = {
    # the value at the section's path
    "backends": {"local": {"kind": "local", "base_url": "http://127.0.0.1:8081/v1", "spawn": True},
                 "openai": {"kind": "openai", "base_url": "https://api.openai.com/v1",
                            "api_key": "${OPENAI_API_KEY}"}},
    "routes": [{"match": "claude-*", "backend": "anthropic"},
               {"match": "*", "backend": "local", "default_max_tokens": 512}],
    "auth": {"keys_file": "policy.keys.yaml"},
    "auth.keys": [{"id": "k_3f9a", "name": "ci", "hash": "sha256:" + "0" * 64, "rpm": 60}],
    "slo": {"default": {"ttft_ms": 2000.0, "tpot_ms": 200.0},
            "routes": {"claude-*": {"ttft_ms": 1500.0, "tpot_ms": 200.0}}},
    # whole documents: sections reached through a dict or a list
    "backends.deployments": {"backends": {"vllm": _BACKEND_GROUP}},
    "backends.timeouts": {"backends": {"openai": {
        "kind": "openai", "base_url": "https://api.openai.com/v1", "api_key": "${OPENAI_API_KEY}",
        "timeouts": {"connect_s": 10.0, "first_byte_s": 60.0, "idle_s": 30.0, "total_s": 600.0}}}},
    "backends.affinity": {"backends": {"vllm": {**_BACKEND_GROUP, "affinity": {
        "mode": "prefix", "session_balance": 1.0, "imbalance_abs": 2, "imbalance_rel": 1.5}}}},
    "backends.deployments.kv_events": {"backends": {"vllm": {
        "kind": "openai_compat", "affinity": {"mode": "exact"}, "deployments": [
            {"base_url": "http://10.0.0.1:8000/v1", "name": "vllm-a", "kv_events": {
                "endpoint": "tcp://10.0.0.1:5557", "replay": "tcp://10.0.0.1:5558",
                "block_size": 16, "hash": "sha256_cbor"}}]}}},
    "routes.fallbacks": {"routes": [{"match": "gpt-*", "backend": "openai", "fallbacks": [
        "openai_backup", {"backend": "anthropic", "model": "claude-sonnet-4-5"}]}]},
}
"""YAML examples by section path: for a path through plain sections, the value at the path;
for one through a dict or a list (``backends.*``, ``routes.*``), the whole document."""


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (``X``, ``list[X]``, ``dict[str, X]``,
    ``X | None``, ``str | X``), in order."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in get_args(annotation) for m in _models_in(a)]


def _holds_container(annotation: Any) -> bool:
    """Whether a field's value is a list or dict (its section is reached through elements)."""
    origin = getattr(annotation, "__origin__", None)
    return origin in (list, dict) or any(_holds_container(a) for a in get_args(annotation)
                                         if not isinstance(a, type) or a in (list, dict))


def sections() -> list[tuple[str, type[BaseModel], Any, bool]]:
    """``[(path, model, example, whole)]``: ``(top level)`` first, then every section model
    reachable from :class:`~prefixgate.config.schema.Policy` (module docstring); ``whole``:
    the example is a whole document (the path goes through a dict or a list)."""
    out: list[tuple[str, type[BaseModel], Any, bool]] = [("(top level)", Policy, None, False)]
    seen: set[type[BaseModel]] = {Policy}

    def walk(prefix: str, model: type[BaseModel], through: bool) -> None:
        for name, f in model.model_fields.items():
            path = f"{prefix}.{name}" if prefix else name
            for sub in _models_in(f.annotation):
                if sub in seen:
                    continue
                seen.add(sub)
                out.append((path, sub, EXAMPLES.get(path), through))
                walk(path, sub, through or _holds_container(f.annotation))

    walk("", Policy, False)
    return out


SECTIONS: list[tuple[str, type[BaseModel], Any]] = [(p, m, e) for p, m, e, _ in sections()]
"""(yaml path of the section, its model, its example or None), in document order."""


def _type(f: FieldInfo) -> str:
    text = str(f.annotation).replace("typing.", "").replace("config.schema.", "")
    return text.replace("<class '", "").replace("'>", "").replace("|", "\\|")


def _default(f: FieldInfo) -> str:
    if f.is_required():
        return "required"
    if f.default_factory is not None:
        value = f.default_factory()  # type: ignore[call-arg]
        return "(section defaults)" if isinstance(value, BaseModel) else f"`{value!r}`"
    return "" if f.default is PydanticUndefined else f"`{f.default!r}`"


def _example(path: str, model: type[BaseModel], example: Any, whole: bool) -> str | None:
    """The section's YAML example (:data:`EXAMPLES`, else its defaults); None when it has
    neither (required keys, or reached through a dict or list, with no example given)."""
    if whole:
        return None if example is None else yaml.safe_dump(example, sort_keys=False).rstrip()
    if example is None:
        try:
            defaults = model().model_dump()
        except ValueError:  # pydantic's ValidationError: required keys
            return None
        example = {k: v for k, v in defaults.items()
                   if not isinstance(getattr(model.model_fields[k], "default_factory", None),
                                     type)}
    doc = example
    for key in reversed(path.split(".")):
        doc = {key: doc}
    return yaml.safe_dump(doc, sort_keys=False).rstrip()


def policy_reference() -> str:
    """The Markdown text of ``docs/policy.md``."""
    out = ["# Policy file reference", "",
           "Generated from `prefixgate/config/schema.py` by `python -m prefixgate.config.reference` (do "
           "not edit by "
           "hand). Check a file with `prefixgate config check FILE`.", ""]
    for path, model, example, whole in sections():
        out += [f"## `{path}`", "", inspect.cleandoc(model.__doc__ or ""), "",
                "| key | type | default | notes |", "|---|---|---|---|"]
        for name, f in model.model_fields.items():
            note = " ".join((f.description or "").split()).replace("|", "\\|")
            out.append(f"| `{name}` | `{_type(f)}` | {_default(f)} | {note} |")
        out.append("")
        yaml_text = None if path == "(top level)" else _example(path, model, example, whole)
        if yaml_text is not None:
            out += ["```yaml", yaml_text, "```", ""]
    return "\n".join(out)


if __name__ == "__main__":
    print(policy_reference(), end="")
