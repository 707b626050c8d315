"""docs/policy.md is the reference generated from the schema, and covers every key."""

from __future__ import annotations

import inspect
from pathlib import Path

from prefixgate.config.reference import SECTIONS, policy_reference

DOC = Path(__file__).resolve().parents[2] / "docs" / "policy.md"


def test_committed_reference_matches_the_schema() -> None:
    assert DOC.read_text() == policy_reference(), (
        "docs/policy.md is stale: run `python -m prefixgate.config.reference > docs/policy.md`")


def test_every_key_of_every_section_is_listed() -> None:
    text = policy_reference()
    for _, model, _ in SECTIONS:
        for name in model.model_fields:
            assert f"| `{name}` |" in text


def _models_in(annotation: object) -> list[type]:
    from typing import get_args

    from pydantic import BaseModel
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in get_args(annotation) for m in _models_in(a)]


def test_every_top_level_policy_field_is_in_the_committed_reference() -> None:
    """Issue 20: holdout, slo, fanout, tenants, retry, breaker and health_checks had no
    section. Read from the committed file, so a field added without regenerating fails too."""
    from prefixgate.config.schema import Policy

    doc = DOC.read_text()
    top = doc.split("\n## ", 2)[1]
    for name, f in Policy.model_fields.items():
        assert f"| `{name}` |" in top, name
        if _models_in(f.annotation):
            assert f"\n## `{name}`\n" in doc, f"docs/policy.md has no section for {name}"
    for name in ("holdout", "slo", "fanout", "tenants", "retry", "breaker", "health_checks"):
        assert f"\n## `{name}`\n" in doc


def test_every_model_reachable_from_the_policy_has_its_keys_documented() -> None:
    """Not only the top level: nested models (deployments, timeouts, affinity, fallbacks,
    slo.default) are walked here independently of the generator."""
    from prefixgate.config.schema import Policy

    doc = DOC.read_text()
    todo, seen = [Policy], set()
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        if model is not Policy:
            first = inspect.cleandoc(model.__doc__ or "").splitlines()[0]
            assert first in doc, f"{model.__name__}: its docstring is not in docs/policy.md"
        for name, f in model.model_fields.items():
            assert f"| `{name}` |" in doc, f"{model.__name__}.{name}"
            todo += _models_in(f.annotation)
    assert len(seen) >= 20


def _leaves(doc: object, path: list[str]) -> list[object]:
    """The values at ``path`` of an example document, stepping into each element of a list
    (routes, deployments, keys) and each backend of ``backends`` (keyed by name)."""
    if not path:
        return [doc]
    assert isinstance(doc, dict), doc
    value = doc[path[0]]
    items = value if isinstance(value, list) else (
        list(value.values()) if path[0] == "backends" else [value])
    return [leaf for item in items for leaf in _leaves(item, path[1:])]


def test_every_yaml_example_is_a_valid_section() -> None:
    import yaml

    from prefixgate.config.reference import sections

    text = policy_reference()
    checked = 0
    for path, model, _, _ in sections():
        if path == "(top level)" or f"## `{path}`\n" not in text:
            continue
        part = text.split(f"## `{path}`\n", 1)[1].split("\n## ", 1)[0]
        if "```yaml\n" not in part:
            continue
        doc = yaml.safe_load(part.split("```yaml\n", 1)[1].split("```")[0])
        for v in _leaves(doc, path.split(".")):
            if not isinstance(v, str):  # a fallback may be a backend's name
                model.model_validate(v)
                checked += 1
    assert checked >= 20
