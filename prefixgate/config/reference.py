"""The policy reference (``docs/policy.md``), generated from the schema so it cannot drift.

``python -m prefixgate.config.reference > docs/policy.md`` (also ``prefixgate config reference``) writes,
for each section of :class:`prefixgate.config.schema.Policy`: its docstring, a table of every key with its
type and default, and the section's defaults as a YAML example. ``tests/config`` checks the
committed file against this output.
"""

from __future__ import annotations

import inspect
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from prefixgate.config.schema import (
    AuthSettings,
    Backend,
    LedgerSettings,
    Limits,
    Listen,
    Policy,
    ProxyKey,
    RewriteSettings,
    Route,
)

# (yaml path of the section, its model, an example of it when its defaults are not one)
SECTIONS: list[tuple[str, type[BaseModel], Any]] = [
    ("(top level)", Policy, None),
    ("listen", Listen, None),
    ("backends", Backend,
     {"local": {"kind": "local", "base_url": "http://127.0.0.1:8081/v1", "spawn": True},
      "openai": {"kind": "openai", "base_url": "https://api.openai.com/v1",
                 "api_key": "${OPENAI_API_KEY}"}}),
    ("routes", Route, [{"match": "claude-*", "backend": "anthropic"},
                         {"match": "*", "backend": "local", "default_max_tokens": 512}]),
    ("rewrite", RewriteSettings, None),
    ("ledger", LedgerSettings, None),
    ("limits", Limits, None),
    ("auth", AuthSettings, {"keys_file": "policy.keys.yaml"}),
    ("auth.keys", ProxyKey, [{"id": "k_3f9a", "name": "ci", "hash": "sha256:" + "0" * 64,
                                "rpm": 60}]),
]


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


def _example(path: str, model: type[BaseModel], example: Any) -> str:
    if example is None:
        example = {k: v for k, v in model().model_dump().items()
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
    for path, model, example in SECTIONS:
        out += [f"## `{path}`", "", inspect.cleandoc(model.__doc__ or ""), "",
                "| key | type | default | notes |", "|---|---|---|---|"]
        for name, f in model.model_fields.items():
            note = " ".join((f.description or "").split()).replace("|", "\\|")
            out.append(f"| `{name}` | `{_type(f)}` | {_default(f)} | {note} |")
        out.append("")
        if path != "(top level)":
            out += ["```yaml", _example(path, model, example), "```", ""]
    return "\n".join(out)


if __name__ == "__main__":
    print(policy_reference(), end="")
