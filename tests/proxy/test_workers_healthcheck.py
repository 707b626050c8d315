"""``serve --workers N`` gives each worker process time to start on a busy machine: uvicorn's
supervisor waits :data:`prefixgate.proxy.cli.serve.WORKER_HEALTHCHECK_S` for its answer, not its
5 s default (which killed and respawned every worker of a loaded 2-core box, issue 25)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from typer.testing import CliRunner

from prefixgate.proxy.cli import app as cli
from prefixgate.proxy.cli import serve


def _serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int) -> dict[str, Any]:
    policy = tmp_path / "p.yaml"
    policy.write_text(json.dumps({
        "backends": {"up": {"kind": "openai_compat", "base_url": "http://127.0.0.1:9/v1"}},
        "routes": [{"match": "*", "backend": "up"}],
        "ledger": {"path": str(tmp_path / "l.sqlite")}}))
    seen: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(kw, app=app))
    r = CliRunner().invoke(cli, ["serve", "--policy", str(policy), "--workers", str(workers),
                                 "--host", "127.0.0.1"])
    assert r.exit_code == 0, r.output
    return seen


def test_workers_get_the_long_healthcheck(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _serve(tmp_path, monkeypatch, 2)
    assert seen["workers"] == 2
    assert seen["timeout_worker_healthcheck"] == serve.WORKER_HEALTHCHECK_S >= 30


def test_one_process_has_no_supervisor_option(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    assert "timeout_worker_healthcheck" not in _serve(tmp_path, monkeypatch, 1)
