"""docs/policy.md is the reference generated from the schema, and covers every key."""

from __future__ import annotations

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
