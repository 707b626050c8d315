"""The import direction of DESIGN.md holds, by import-linter (``[tool.importlinter]`` in
``pyproject.toml``): the rooms, the proxy's layers, the engine apart, no torch in the proxy.

Each contract is also shown to bite: a copy of the package with one import pointing the wrong
way fails the check and names the contract it broke.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; "
        "sys.exit(c())"]


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(LINT, cwd=tree, env=env, capture_output=True, text=True, timeout=120)


def _copy(tmp: Path) -> Path:
    shutil.copytree(ROOT / "prefixgate", tmp / "prefixgate",
                    ignore=shutil.ignore_patterns("__pycache__", "static"))
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    return tmp


def test_the_tree_keeps_every_contract() -> None:
    res = _lint(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("prefixgate/proxy/core/errors.py", "import prefixgate.proxy.pipeline.exchange",
     "proxy layers: lower never imports higher"),
    ("prefixgate/proxy/bridges/fields.py", "import prefixgate.proxy.upstream.client",
     "bridges map dicts and bytes: no HTTP"),
    ("prefixgate/proxy/bridges/base.py", "import httpx", "bridges map dicts and bytes: no HTTP"),
    ("prefixgate/proxy/api/models.py", "import prefixgate.proxy.sim.traces",
     "proxy layers: lower never imports higher"),
    ("prefixgate/cache/ledger/store.py", "import prefixgate.proxy.core.errors",
     "rooms: proxy -> rewriter / cache -> config"),
    ("prefixgate/cache/state/session.py", "import prefixgate.rewriter.wire.ir",
     "cache and rewriter are independent rooms"),
    ("prefixgate/local_engine/sched/sampler.py", "import prefixgate.config.schema",
     "local_engine imports no other room"),
    ("prefixgate/proxy/observe/metrics.py", "import torch",
     "the proxy, rewriter, cache and config never import torch"),
    ("prefixgate/local_engine/sched/scheduler.py", "import prefixgate.local_engine.server.protocol",
     "the engine core never imports its HTTP side"),
])
def test_an_import_the_wrong_way_breaks_its_contract(tmp_path: Path, module: str, line: str,
                                                     contract: str) -> None:
    tree = _copy(tmp_path)
    target = tree / module
    target.write_text(target.read_text() + f"\n{line}  # noqa\n")
    res = _lint(tree)
    assert res.returncode != 0
    assert f"{contract} BROKEN" in res.stdout, res.stdout
