"""Issue 22, item 6: ``prefixgate keys add --name NAME`` works without a policy file, and
``prefixgate serve`` reads the same default keys file for a policy that names no
``auth.keys_file`` (:func:`prefixgate.config.loader.default_keys_file`); ``prefixgate config
show-default`` prints the shipped policy to start one's own. Keys still fail closed.

Every test points ``$PREFIXGATE_KEYS_FILE`` (or ``$XDG_CONFIG_HOME`` / ``$HOME``) at its own
folder; ``tests/conftest.py`` keeps the suite off the developer's real one."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import pytest
import uvicorn
import yaml
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import prefixgate.proxy.cli.serve as serve_cli
from prefixgate.config.loader import (
    default_keys_file,
    default_policy,
    default_policy_text,
    load_policy,
    parse_policy,
    with_default_keys_file,
)
from prefixgate.proxy.cli import app as cli
from prefixgate.proxy.http.auth import KeyStore, hash_key
from tests.paths import REPO

POLICY = ("backends:\n  b: {kind: openai_compat, base_url: 'http://127.0.0.1:9/v1'}\n"
          "routes:\n  - {match: 'm-*', backend: b}\n")


@pytest.fixture
def keys_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    kf = tmp_path / "conf" / "keys.yaml"
    monkeypatch.setenv("PREFIXGATE_KEYS_FILE", str(kf))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the shipped policy's ledger goes here
    return kf


def _add(*args: str) -> str:
    r = CliRunner().invoke(cli, ["keys", "add", *args])
    assert r.exit_code == 0, r.output
    return r.stdout.strip()


def test_keys_add_without_a_policy_writes_the_default_keys_file(keys_file: Path) -> None:
    r = CliRunner().invoke(cli, ["keys", "add", "--name", "ci", "--rpm", "60"])
    assert r.exit_code == 0, r.output
    key = r.stdout.strip()
    assert key.startswith("pgk-") and "\n" not in key  # stdout: the key alone
    assert str(keys_file) in r.stderr and "serve" in r.stderr
    stored = keys_file.read_text()
    assert key not in stored and hash_key(key) in stored
    assert keys_file.stat().st_mode & 0o077 == 0
    entry = yaml.safe_load(stored)["keys"][0]
    assert (entry["name"], entry["rpm"]) == ("ci", 60)
    second = _add("--name", "bot")
    assert [k["name"] for k in yaml.safe_load(keys_file.read_text())["keys"]] == ["ci", "bot"]
    assert second != key


def test_keys_list_and_remove_without_a_policy_use_the_default_keys_file(keys_file: Path) -> None:
    run = CliRunner().invoke
    key = _add("--name", "alice")
    _add("--name", "bob")
    listed = run(cli, ["keys", "list"])
    assert listed.exit_code == 0 and "alice" in listed.stdout and "bob" in listed.stdout
    assert str(keys_file) in listed.stdout and key not in listed.stdout
    assert "sha256:" not in listed.stdout
    assert run(cli, ["keys", "remove", "alice"]).exit_code == 0
    assert [k["name"] for k in yaml.safe_load(keys_file.read_text())["keys"]] == ["bob"]
    assert run(cli, ["keys", "remove", "alice"]).exit_code == 1


def test_serve_reads_the_default_keys_file_for_the_shipped_policy(
        keys_file: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Through the command as a newcomer runs it: ``keys add --name`` then ``serve --host
    0.0.0.0`` (the engine and uvicorn stubbed): it starts, says keys are required, and its app
    admits that key and refuses a request without one."""
    served: list[Any] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.append((app, kw)))
    monkeypatch.setattr(serve_cli, "EngineProcess", lambda *a, **k: contextlib.nullcontext())
    argv = ["serve", "--host", "0.0.0.0", "--model", str(tmp_path)]
    refused = CliRunner().invoke(cli, argv)
    assert refused.exit_code == 2 and not served
    assert "`prefixgate keys add --name NAME`" in refused.output  # no policy file needed
    key = _add("--name", "newcomer")
    r = CliRunner().invoke(cli, argv)
    assert r.exit_code == 0, r.output
    assert "proxy keys required (1 in " + str(keys_file) in r.stderr
    app, options = served[0]
    assert options["host"] == "0.0.0.0"
    body = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
    with TestClient(app) as client:
        assert client.post("/v1/chat/completions", json=body).status_code == 401
        ok = client.post("/v1/chat/completions", json=body,
                         headers={"authorization": f"Bearer {key}"})
        assert ok.status_code == 404, ok.text  # past the key: the model is what is unknown


def test_a_policy_naming_no_keys_file_reads_the_default_one_and_one_naming_its_own_does_not(
        keys_file: Path, tmp_path: Path) -> None:
    key = _add("--name", "shared")
    bare = tmp_path / "bare.yaml"
    bare.write_text(POLICY)
    own = tmp_path / "own.yaml"
    own.write_text(POLICY + "auth: {keys_file: own.keys.yaml}\n")
    assert serve_cli._load(bare).auth.keys_file == str(keys_file)
    assert KeyStore(serve_cli._load(bare).auth).lookup(key) is not None
    assert serve_cli._load(None).auth.keys_file == str(keys_file)
    assert serve_cli._load(own).auth.keys_file == str(tmp_path / "own.keys.yaml")
    assert KeyStore(serve_cli._load(own).auth).lookup(key) is None
    # --workers: each worker builds its policy from $PREFIXGATE_POLICY the same way
    os.environ[serve_cli.POLICY_ENV] = str(bare)
    try:
        assert serve_cli._policy_from_env().auth.keys_file == str(keys_file)
    finally:
        del os.environ[serve_cli.POLICY_ENV]
    # `keys list --policy` shows what serve would admit for that policy
    listed = CliRunner().invoke(cli, ["keys", "list", "--policy", str(bare)]).stdout
    assert "shared" in listed and str(keys_file) in listed


def test_keys_add_with_a_policy_still_keeps_its_keys_next_to_it(keys_file: Path,
                                                                tmp_path: Path) -> None:
    p = tmp_path / "team.yaml"
    p.write_text(POLICY)
    key = _add("--policy", str(p))
    assert load_policy(p).auth.keys_file == str(tmp_path / "team.keys.yaml")
    assert not keys_file.exists()  # the default file is not touched
    assert KeyStore(serve_cli._load(p).auth).lookup(key) is not None


def test_the_default_keys_file_still_fails_closed(keys_file: Path) -> None:
    """Removing the last key from the default file leaves a running proxy refusing every
    request (http/keystore.py), never open again."""
    key = _add("--name", "only")
    store = KeyStore(serve_cli._load(None).auth)
    assert store.configured and store.lookup(key) is not None
    assert CliRunner().invoke(cli, ["keys", "remove", "only"]).exit_code == 0
    store._checked = float("-inf")  # skip the once-a-second wait
    assert store.lookup(key) is None and store.configured


def test_default_keys_file_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("PREFIXGATE_KEYS_FILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    assert default_keys_file() == tmp_path / ".config" / "prefixgate" / "keys.yaml"
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/ignored")  # the XDG spec: absolute only
    assert default_keys_file() == tmp_path / ".config" / "prefixgate" / "keys.yaml"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert default_keys_file() == tmp_path / "xdg" / "prefixgate" / "keys.yaml"
    monkeypatch.setenv("PREFIXGATE_KEYS_FILE", "~/k.yaml")
    assert default_keys_file() == tmp_path / "k.yaml"


def test_with_default_keys_file_fills_only_a_missing_keys_file(keys_file: Path) -> None:
    pol = default_policy()
    filled = with_default_keys_file(pol)
    assert filled.auth.keys_file == str(keys_file) and pol.auth.keys_file is None
    own = parse_policy({**yaml.safe_load(POLICY), "auth": {"keys_file": "/x/k.yaml"}})
    assert with_default_keys_file(own).auth.keys_file == "/x/k.yaml"


def test_config_show_default_prints_the_shipped_policy(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["config", "show-default"])
    assert r.exit_code == 0 and r.stdout == default_policy_text()
    copy = tmp_path / "my_policy.yaml"
    copy.write_text(r.stdout)
    assert load_policy(copy) == default_policy()
    assert CliRunner().invoke(cli, ["config", "check", str(copy)]).exit_code == 0


def test_the_readme_says_how_to_add_a_key_without_a_policy_and_how_to_get_one() -> None:
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    text = "\n".join(p.read_text() for p in docs)
    assert "prefixgate keys add --name" in text
    assert "prefixgate config show-default > my_policy.yaml" in text
