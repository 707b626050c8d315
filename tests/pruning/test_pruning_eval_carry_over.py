"""``bench.pruning_eval --only``: sections not re-run are carried over with the command that
measured them, never silently mixed with new figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.pruning_eval import carry_over


def _write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_a_carried_section_names_the_command_that_measured_it(tmp_path: Path) -> None:
    f = _write(tmp_path / "p.json", {"command": "run --hybrid",
                                     "figures": {"tools": {"recall": 1}, "seconds": {"tools": 9}}})
    got = carry_over(f, ["tools"])
    assert got["figures"]["tools"] == {"recall": 1}
    assert got["note"]["sections"] == {"tools": {"command": "run --hybrid", "seconds": 9}}


def test_carrying_twice_keeps_the_original_command_not_the_partial_rerun(tmp_path: Path) -> None:
    f = _write(tmp_path / "p.json", {
        "command": "run --only rag", "figures": {"tools": {"recall": 1}},
        "carried_over": {"sections": {"tools": {"command": "run --hybrid", "seconds": 9}}}})
    assert carry_over(f, ["tools"])["note"]["sections"]["tools"]["command"] == "run --hybrid"


def test_a_section_missing_from_the_file_stops_the_run(tmp_path: Path) -> None:
    f = _write(tmp_path / "p.json", {"command": "x", "figures": {"rag": {}}})
    with pytest.raises(SystemExit, match="tools"):
        carry_over(f, ["tools"])
    with pytest.raises(SystemExit, match="cannot carry"):
        carry_over(tmp_path / "absent.json", ["tools"])
