"""The P/D pair's secret (issue 34, item 1): where it comes from, and a P/D role without one
refuses to start before loading a model."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefixgate.local_engine.__main__ import main
from prefixgate.local_engine.pd.auth import ENV_SECRET, load_secret


def test_the_secret_comes_from_the_file_or_the_environment(tmp_path: Path) -> None:
    f = tmp_path / "pd.secret"
    f.write_text("  from-the-file-0123456789\n")
    assert load_secret(str(f), environ={ENV_SECRET: "from-the-env-0123456789"}) == (
        b"from-the-file-0123456789")
    assert load_secret(None, environ={ENV_SECRET: "from-the-env-0123456789"}) == (
        b"from-the-env-0123456789")
    for env in ({}, {ENV_SECRET: "short"}):
        with pytest.raises(ValueError, match="shared secret"):
            load_secret(None, environ=env)


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_pd_role_without_a_secret_refuses_to_start(role: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_SECRET, raising=False)
    with pytest.raises(SystemExit) as e:  # before the (missing) model is read
        main(["--model", "/nonexistent/model", "--role", role])
    assert "shared secret" in str(e.value) and ENV_SECRET in str(e.value)
