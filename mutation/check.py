"""Mutation check: does the test suite catch single-point bugs? (issue 14)

Applies each mutant of :data:`mutation.mutants.MUTANTS` (file, exact original snippet, replacement,
the test files that should catch it) to a scratch copy of the repository, runs those tests once
per hypothesis seed (``--hypothesis-seed=N`` under the ``dev`` profile of tests/conftest.py: the
``ci`` profile is derandomized, which would make every seed draw the same examples; no database,
so an earlier failure is never replayed), and records per mutant and seed whether the tests failed:

* ``killed`` — the tests failed on every seed;
* ``flaky`` — failed on some seeds only (catching it depends on luck);
* ``survived`` — passed on every seed (the suite cannot see this bug).

A mutant whose original snippet is not found exactly once is an error (the list is stale), never
silently skipped. Before the mutants run, every selected test file must pass unmutated (seed 0),
else the check stops: a failing baseline would "kill" everything.

    .venv/bin/python mutation/check.py [--seeds 0 1 2] [--only ID ...] [--jobs N]

Writes ``mutation/results/mutation_check.json`` as ``{"command", "figures": {"mutants", "killed",
"flaky", "survived"}, "per_mutant": [{"id", "file", "bug", "tests", "seeds": {seed: "failed" |
"passed" | "timeout"}, "status"}]}``. Exit status 1 when any mutant is flaky or survived.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mutation.mutants import MUTANTS, Mutant  # noqa: E402
from tests.paths import DATA  # noqa: E402

OUT = REPO / "mutation" / "results" / "mutation_check.json"
TIMEOUT_S = 300
PROFILE = "dev"  # tests/conftest.py: not derandomized, no database


def scratch_copy(dest: Path) -> None:
    """Copy the files git knows (tracked + untracked, not ignored) of REPO into ``dest``."""
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def check_snippets(mutants: list[Mutant], root: Path) -> None:
    """Raise ``SystemExit`` naming every mutant whose original is not in its file exactly once."""
    bad = [f"{m['id']}: found {(root / m['file']).read_text().count(m['original'])}x in {m['file']}"
           for m in mutants if (root / m["file"]).read_text().count(m["original"]) != 1]
    if bad:
        raise SystemExit("stale mutants (snippet must occur exactly once):\n  " + "\n  ".join(bad))


def run_tests(root: Path, tests: list[str], seed: int, timeout_s: float = TIMEOUT_S) -> str:
    """``"failed"`` / ``"passed"`` / ``"timeout"`` for one pytest run in ``root``."""
    shutil.rmtree(root / ".hypothesis", ignore_errors=True)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not slow",
           f"--hypothesis-seed={seed}", *tests]
    # the "ci" profile (tests/conftest.py) is derandomized, which overrides --hypothesis-seed;
    # "dev" honours the seed, so the three seeds really draw different examples
    env = dict(os.environ, PREFIXGATE_DATA_DIR=str(DATA), HYPOTHESIS_PROFILE=PROFILE)
    try:
        rc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, timeout=timeout_s).returncode
    except subprocess.TimeoutExpired:
        return "timeout"
    return "passed" if rc == 0 else "failed"


def status_of(seeds: dict[int, str]) -> str:
    """killed (every seed failed or timed out), survived (every seed passed), else flaky."""
    caught = [v != "passed" for v in seeds.values()]
    return "killed" if all(caught) else "survived" if not any(caught) else "flaky"


def run_mutant(m: Mutant, base: Path, seeds: list[int], timeout_s: float = TIMEOUT_S) -> dict[str, Any]:
    """Apply ``m`` to a private copy of ``base``, run its tests per seed, return its record."""
    with tempfile.TemporaryDirectory(prefix=f"pg-mut-{m['id']}-") as tmp:
        root = Path(tmp) / "repo"
        shutil.copytree(base, root)
        path = root / m["file"]
        path.write_text(path.read_text().replace(m["original"], m["replacement"], 1))
        results = {s: run_tests(root, m["tests"], s, timeout_s) for s in seeds}
    return {"id": m["id"], "file": m["file"], "bug": m["bug"], "tests": m["tests"],
            "seeds": {str(k): v for k, v in results.items()}, "status": status_of(results)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--only", nargs="*", help="mutant ids to run (default: all)")
    ap.add_argument("--jobs", type=int, default=1, help="mutants run in parallel")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S,
                    help="seconds one pytest run may take (a shared, loaded box needs more)")
    args = ap.parse_args()
    mutants = [m for m in MUTANTS if not args.only or m["id"] in args.only]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pg-mut-base-") as tmp:
        base = Path(tmp) / "repo"
        base.mkdir()
        scratch_copy(base)
        check_snippets(mutants, base)
        selected = sorted({t for m in mutants for t in m["tests"]})
        baseline = run_tests(base, selected, args.seeds[0], args.timeout)
        if baseline != "passed":
            raise SystemExit(f"baseline: the selected tests do not pass unmutated ({baseline})")
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            records = list(pool.map(lambda m: run_mutant(m, base, args.seeds, args.timeout), mutants))
    for r in records:
        print(f"{r['status']:9s} {r['id']:40s} {r['seeds']}")
    figures = {k: sum(r["status"] == k for r in records) for k in ("killed", "flaky", "survived")}
    seeds = " ".join(map(str, args.seeds))
    only = f" --only {' '.join(args.only)}" if args.only else ""
    only += f" --timeout {args.timeout:g}" if args.timeout != TIMEOUT_S else ""
    command = (f".venv/bin/python mutation/check.py --seeds {seeds}{only}"
               f"  # HYPOTHESIS_PROFILE={PROFILE}")
    result = {"command": command, "figures": {"mutants": len(records), **figures},
              "per_mutant": records}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["figures"]), f"in {time.perf_counter() - t0:.0f} s -> {args.out}")
    return 0 if figures["flaky"] == figures["survived"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
