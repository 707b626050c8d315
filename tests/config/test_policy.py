"""Policy schema, loader and `prefixgate config check`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from prefixgate.config import PolicyError, default_policy, load_policy, parse_policy, resolve_route
from prefixgate.config.secrets import MissingSecret, redact, resolve_secret
from prefixgate.proxy.cli import app


def _minimal() -> dict:
    return {
        "backends": {"local": {"kind": "local", "base_url": "http://127.0.0.1:8081/v1"}},
        "routes": [{"match": "*", "backend": "local"}],
    }


def test_default_policy_routes_the_local_model_by_its_id_and_aliases_only() -> None:
    p = default_policy()
    assert resolve_route(p, "smollm2")[0] == "local"
    assert resolve_route(p, "SmolLM2-135M-Instruct")[0] == "local"
    assert resolve_route(p, "smolm2") is None and resolve_route(p, "gtp-4o") is None
    assert resolve_route(p, "") is None  # no catch-all route in the shipped policy
    assert resolve_route(p, "gpt-4o")[0] == "openai"
    assert resolve_route(p, "claude-sonnet-4-5")[0] == "anthropic"
    assert p.listen.port == 8080


def test_first_matching_route_wins_and_no_match_gives_none() -> None:
    data = _minimal()
    data["backends"]["other"] = {"kind": "local", "base_url": "http://127.0.0.1:8082/v1"}
    # both routes match "gpt-4o": order alone decides; reversing them flips the answer
    data["routes"] = [{"match": "gpt-4*", "backend": "other"}, {"match": "gpt-*", "backend": "local"}]
    assert resolve_route(parse_policy(data), "gpt-4o")[0] == "other"
    assert resolve_route(parse_policy(data), "gpt-3.5")[0] == "local"
    data["routes"] = data["routes"][::-1]
    assert resolve_route(parse_policy(data), "gpt-4o")[0] == "local"
    assert resolve_route(parse_policy(data), "claude-x") is None


def test_literal_api_key_is_refused_with_its_yaml_path() -> None:
    data = _minimal()
    data["backends"]["local"]["api_key"] = "sk-live-123"
    with pytest.raises(PolicyError) as ei:
        parse_policy(data)
    assert ei.value.problems[0][0] == "backends.local.api_key"


def test_route_to_unknown_backend_is_refused() -> None:
    data = _minimal()
    data["routes"][0]["backend"] = "nope"
    with pytest.raises(PolicyError) as ei:
        parse_policy(data)
    assert "nope" in str(ei.value)


def test_watermarks_must_be_ordered() -> None:
    data = _minimal()
    data["rewrite"] = {"history_high_watermark_tokens": 100, "history_low_watermark_tokens": 200}
    with pytest.raises(PolicyError):
        parse_policy(data)


def test_unknown_keys_are_errors_not_silently_ignored() -> None:
    data = _minimal()
    data["rewrit"] = {}
    with pytest.raises(PolicyError) as ei:
        parse_policy(data)
    assert ei.value.problems[0][0] == "rewrit"


def test_secret_resolved_from_environment_only_at_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PG_TEST_KEY", raising=False)
    with pytest.raises(MissingSecret):
        resolve_secret("${PG_TEST_KEY}")
    monkeypatch.setenv("PG_TEST_KEY", "sk-abcdef")
    assert resolve_secret("${PG_TEST_KEY}") == "sk-abcdef"
    assert "abcdef" not in redact("sk-abcdef")


def test_config_check_cli_prints_paths_and_exits_nonzero(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({
        "backends": {"x": {"kind": "foo", "base_url": "ftp://a"}},
        "routes": [{"match": "*", "backend": "x"}],
    }))
    r = CliRunner().invoke(app, ["config", "check", str(bad)])
    assert r.exit_code == 1
    assert "backends.x.kind" in r.output and "backends.x.base_url" in r.output

    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(_minimal()))
    r = CliRunner().invoke(app, ["config", "check", str(good)])
    assert r.exit_code == 0, r.output
    assert load_policy(good).routes[0].backend == "local"


def test_config_check_reports_invalid_yaml(tmp_path: Path) -> None:
    f = tmp_path / "broken.yaml"
    f.write_text("backends: [unclosed\n")
    r = CliRunner().invoke(app, ["config", "check", str(f)])
    assert r.exit_code == 1
    assert "invalid YAML" in r.output
