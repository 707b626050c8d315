"""Startup says only what applies (issue 37, item 6): the shipped policy, whose default keys
file holds no key or one tenant's, does not warn that tenants can read each other's cached
prefixes; keys of two tenants do."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import default_policy
from prefixgate.proxy.app import build_app
from prefixgate.proxy.http.keystore import hash_key


def _shipped(tmp_path: Path, keys: list[dict[str, str]] | None) -> object:
    keys_file = tmp_path / "keys.yaml"
    if keys is not None:
        keys_file.write_text(yaml.safe_dump({"keys": keys}))
    pol = default_policy()
    return pol.model_copy(update={
        "auth": pol.auth.model_copy(update={"keys_file": str(keys_file)}),
        "ledger": pol.ledger.model_copy(update={"path": str(tmp_path / "ledger.sqlite")})})


def _tenant_warnings(tmp_path: Path, keys: list[dict[str, str]] | None,
                     caplog: pytest.LogCaptureFixture) -> list[str]:
    caplog.clear()
    policy = _shipped(tmp_path, keys)
    build_app(policy, ledger=Ledger(tmp_path / "ledger.sqlite"))  # type: ignore[arg-type]
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("tenants:")]


def _key(kid: str, tenant: str | None = None) -> dict[str, str]:
    k = {"id": kid, "hash": hash_key("pgk-" + kid * 8)}
    return {**k, "tenant": tenant} if tenant else k


def test_the_shipped_policy_without_tenants_says_nothing_about_tenants(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    assert _tenant_warnings(tmp_path, None, caplog) == []                 # no keys file yet
    assert _tenant_warnings(tmp_path, [_key("k1")], caplog) == []         # one key, one tenant
    assert _tenant_warnings(tmp_path, [_key("k1", "acme"), _key("k2", "acme")], caplog) == []
    two = _tenant_warnings(tmp_path, [_key("k1", "acme"), _key("k2", "globex")], caplog)
    assert two and all("can read another's cached prompt prefix" in m for m in two)
