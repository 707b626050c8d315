"""The regression mutants of ``mutation/mutants.py`` quote the code they break: a change that
rewrites a quoted line must update the list in the same commit, or ``mutation/check.py``
refuses to run (it did, twice, after merges)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mutation.check import check_snippets
from mutation.mutants import MUTANTS

REPO = Path(__file__).resolve().parents[1]


def test_every_mutant_quotes_its_file_exactly_once() -> None:
    check_snippets(list(MUTANTS), REPO)


def test_a_stale_quote_is_refused(tmp_path: Path) -> None:
    m = MUTANTS[0]
    target = tmp_path / m["file"]
    target.parent.mkdir(parents=True)
    target.write_text((REPO / m["file"]).read_text().replace(m["original"], "rewritten"))
    with pytest.raises(SystemExit, match="stale"):
        check_snippets([m], tmp_path)
