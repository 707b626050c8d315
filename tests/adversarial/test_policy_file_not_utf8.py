"""``prefixgate config check`` on a policy file that is not UTF-8 text (a binary file, a
Latin-1 file) reports the problem on one line and exits 1, without a traceback; policy files
are read as UTF-8 whatever the machine's locale."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefixgate.config.loader import PolicyError, load_policy
from prefixgate.proxy.cli import app


@pytest.mark.parametrize("data", [b"\xff\xfe\x00\x01", "routes: [{match: 'café'}]".encode("latin-1")])
def test_non_utf8_policy_file_is_a_policy_error(tmp_path: Path, data: bytes) -> None:
    f = tmp_path / "policy.yaml"
    f.write_bytes(data)
    with pytest.raises(PolicyError) as ei:
        load_policy(f)
    assert ei.value.problems[0][0] == ""
    assert "UTF-8" in ei.value.problems[0][1]
    r = CliRunner().invoke(app, ["config", "check", str(f)])
    assert r.exit_code == 1
    assert "UTF-8" in r.output and "Traceback" not in r.output
    assert not isinstance(r.exception, UnicodeDecodeError)


def test_utf8_policy_file_with_non_ascii_text_loads(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LC_ALL", "C")
    f = tmp_path / "policy.yaml"
    f.write_text("backends: {café: {kind: openai, base_url: 'https://x/v1'}}\n"
                 "routes: [{match: 'modèle-*', backend: café}]\n", encoding="utf-8")
    policy = load_policy(f)
    assert policy.routes[0].match == "modèle-*"
