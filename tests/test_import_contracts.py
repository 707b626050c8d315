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
    ("prefixgate/local_engine/kv/radix_cache.py", "import prefixgate.local_engine.model.llama",
     "engine layers: kv < model < sched < spec < pd < engine < server"),
    ("prefixgate/local_engine/model/attention.py", "import prefixgate.local_engine.sched.sequence",
     "engine layers: kv < model < sched < spec < pd < engine < server"),
    ("prefixgate/local_engine/sched/scheduler.py", "import prefixgate.local_engine.spec.drafters",
     "engine layers: kv < model < sched < spec < pd < engine < server"),
    ("prefixgate/local_engine/spec/decode.py", "import prefixgate.local_engine.pd.roles",
     "engine layers: kv < model < sched < spec < pd < engine < server"),
    ("prefixgate/local_engine/pd/link.py", "import prefixgate.local_engine.engine",
     "engine layers: kv < model < sched < spec < pd < engine < server"),
    ("prefixgate/cache/ledger/rollup.py", "import prefixgate.cache.savings.summary",
     "cache packages: savings -> ledger -> state"),
    ("prefixgate/cache/state/session.py", "import prefixgate.cache.ledger.store",
     "cache packages: savings -> ledger -> state"),
    ("prefixgate/cache/provider_models/base.py", "import prefixgate.cache.state.session",
     "cache packages: savings -> ledger -> state"),
    ("prefixgate/cache/guard/verdicts.py", "import prefixgate.cache.savings.summary",
     "cache packages: savings -> ledger -> state"),
    ("prefixgate/cache/ledger/store.py", "import prefixgate.cache.guard.sequential",
     "cache packages: savings -> ledger -> state"),
    ("prefixgate/rewriter/wire/ir.py", "import prefixgate.rewriter.analysis.tokens",
     "rewriter layers: pipeline -> passes -> analysis -> wire"),
    ("prefixgate/rewriter/analysis/stable.py", "import prefixgate.rewriter.passes.dedupe",
     "rewriter layers: pipeline -> passes -> analysis -> wire"),
    ("prefixgate/rewriter/passes/dedupe.py", "import prefixgate.rewriter.pipeline",
     "rewriter layers: pipeline -> passes -> analysis -> wire"),
])
def test_an_import_the_wrong_way_breaks_its_contract(tmp_path: Path, module: str, line: str,
                                                     contract: str) -> None:
    tree = _copy(tmp_path)
    target = tree / module
    target.write_text(target.read_text() + f"\n{line}  # noqa\n")
    res = _lint(tree)
    assert res.returncode != 0
    assert f"{contract} BROKEN" in res.stdout, res.stdout


def _cycles(graph, modules: set[str]) -> list[tuple[str, ...]]:
    """Every import cycle among ``modules`` (Tarjan's strongly connected components over the
    module-level graph; a module importing itself counts)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[tuple[str, ...]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.find_modules_directly_imported_by(v) & modules:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.find_modules_directly_imported_by(v):
                found.append(tuple(sorted(comp)))

    for m in sorted(modules):
        if m not in index:
            visit(m)
    return found


def _import_cycles(tree: Path) -> list[tuple[str, ...]]:
    code = ("import grimp, json, sys; sys.path.insert(0, sys.argv[1]);"
            "g = grimp.build_graph('prefixgate', 'bench', cache_dir=None);"
            "print(json.dumps({m: sorted(g.find_modules_directly_imported_by(m)) for m in g.modules}))")
    res = subprocess.run([sys.executable, "-c", code, str(tree)], cwd=tree, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(tree)})
    assert res.returncode == 0, res.stderr
    edges = {k: set(v) for k, v in __import__("json").loads(res.stdout).items()}

    class G:
        @staticmethod
        def find_modules_directly_imported_by(m: str) -> set[str]:
            return edges.get(m, set())

    return _cycles(G, set(edges))


def test_no_import_cycle_anywhere_in_prefixgate_or_bench() -> None:
    assert _import_cycles(ROOT) == []


def test_a_planted_cycle_is_found(tmp_path: Path) -> None:
    tree = _copy(tmp_path)
    shutil.copytree(ROOT / "bench", tree / "bench", ignore=shutil.ignore_patterns("__pycache__", "results"))
    target = tree / "prefixgate/local_engine/kv/pool.py"
    target.write_text(target.read_text() + "\nimport prefixgate.local_engine.kv.radix_cache  # noqa\n")
    other = tree / "prefixgate/local_engine/kv/radix_cache.py"
    other.write_text(other.read_text() + "\nimport prefixgate.local_engine.kv.pool  # noqa\n")
    cycles = _import_cycles(tree)
    assert ("prefixgate.local_engine.kv.pool", "prefixgate.local_engine.kv.radix_cache") in cycles


def test_a_planted_cycle_between_benchmarks_is_found(tmp_path: Path) -> None:
    """bench/ scripts import each other by ``bench.``-qualified names (no ``sys.path`` tricks),
    so a circle between two of them, even through a function-level import, is in the graph."""
    tree = _copy(tmp_path)
    shutil.copytree(ROOT / "bench", tree / "bench", ignore=shutil.ignore_patterns("__pycache__", "results"))
    target = tree / "bench/proxy_targets.py"
    target.write_text(target.read_text() + "\n\ndef _late() -> None:\n    import bench.proxy_overhead  # noqa\n")
    assert ("bench.hot_path_profile", "bench.proxy_overhead", "bench.proxy_targets") in _import_cycles(tree)
