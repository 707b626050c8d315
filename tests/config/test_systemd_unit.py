"""docs/prefixgate.service passes `systemd-analyze verify` (skipped where the tool is absent)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "docs" / "prefixgate.service"
INSTALLED = "/opt/prefixgate/.venv/bin/prefixgate"


def test_unit_file_verifies(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed")
    text = UNIT.read_text()
    assert f"ExecStart={INSTALLED} serve --policy /etc/prefixgate/policy.yaml" in text
    # verify checks that ExecStart's program exists: point it at a real one here
    exe = shutil.which("prefixgate") or sys.executable
    unit = tmp_path / "prefixgate.service"
    unit.write_text(text.replace(INSTALLED, exe))
    r = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "prefixgate.service" not in r.stderr, r.stderr  # no warning about our unit


def test_operating_doc_shows_the_unit_it_ships() -> None:
    doc = (UNIT.parent / "operating.md").read_text()
    for line in UNIT.read_text().splitlines():
        if line.startswith(("ExecStart=", "User=", "EnvironmentFile=", "ProtectSystem=")):
            assert line in doc
