"""The backend-kind table is the one place kind-specific behaviour is read from (issue 18)."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import yaml

from prefixgate.config import backend_kinds
from prefixgate.config.backend_kinds import BACKEND_KINDS, traits
from prefixgate.config.loader import parse_policy
from prefixgate.config.schema import BackendKind


def test_every_schema_kind_has_exactly_one_row() -> None:
    assert set(BACKEND_KINDS) == set(typing.get_args(BackendKind))


def test_rows_are_what_the_backends_do() -> None:
    assert traits("anthropic").wire == "anthropic"
    assert {k for k, t in BACKEND_KINDS.items() if t.wire == "openai"} == {"local", "openai_compat", "llamacpp",
                                                                       "openai"}
    assert [k for k, t in BACKEND_KINDS.items() if t.native_responses] == ["openai"]
    assert [k for k, t in BACKEND_KINDS.items() if t.masks_tools] == ["local"]
    assert {k for k, t in BACKEND_KINDS.items() if t.tokenizes} == {"local", "openai_compat"}
    assert traits("openai").output_cap_field == "max_completion_tokens"
    assert traits("anthropic").output_cap_field is None
    assert traits("local").cache_provider == traits("openai_compat").cache_provider == "radix"
    assert [k for k, t in BACKEND_KINDS.items() if t.pins_slots] == ["llamacpp"]
    assert traits("llamacpp").cache_provider == "radix" and not traits("llamacpp").tokenizes


def test_unknown_kind_raises() -> None:
    with pytest.raises(KeyError):
        traits("bedrock")


POLICY = """
backends:
  eng: {kind: openai_compat, base_url: "http://127.0.0.1:9/v1"}
routes:
  - {match: "*", backend: eng}
"""


@pytest.mark.parametrize("column, value", [("wire", "anthropic"), ("cache_provider", "anthropic")])
def test_router_reads_the_table(monkeypatch: pytest.MonkeyPatch, column: str, value: str) -> None:
    """Changing one row changes what the router plans: no second kind table behind it."""
    from prefixgate.proxy.routing.router import plan_targets

    policy = parse_policy(yaml.safe_load(POLICY))
    before = plan_targets(policy, "m", "openai", can_translate=True)[0]
    row = dataclasses.replace(BACKEND_KINDS["openai_compat"], **{column: value})
    monkeypatch.setitem(backend_kinds.BACKEND_KINDS, "openai_compat", row)
    after = plan_targets(policy, "m", "openai", can_translate=True)[0]
    field = {"wire": "wire", "cache_provider": "provider"}[column]
    assert getattr(before, field) != value
    assert getattr(after, field) == value


def test_otel_and_output_cap_read_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefixgate.proxy.pipeline.output_cap import cap_field
    from prefixgate.proxy.routing.router import plan_targets

    target = plan_targets(parse_policy(yaml.safe_load(POLICY)), "m", "openai")[0]
    assert cap_field("openai", target) == "max_tokens"
    row = dataclasses.replace(BACKEND_KINDS["openai_compat"], output_cap_field="max_completion_tokens")
    monkeypatch.setitem(backend_kinds.BACKEND_KINDS, "openai_compat", row)
    assert cap_field("openai", target) == "max_completion_tokens"
