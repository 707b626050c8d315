"""``bench/result_file.py``: the command, commit, load average and atomic write every benchmark's
result file uses."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bench import result_file as rf

REPO = Path(__file__).resolve().parents[2]


def test_the_command_line_reruns_the_script_with_its_arguments_quoted() -> None:
    cmd = rf.command(REPO / "bench" / "fanout.py", ["--note", "quiet box", "--n", "3"], prefix="nice python")
    assert cmd == "nice python bench/fanout.py --note 'quiet box' --n 3"
    assert rf.command("-m bench.conformance", [], prefix="python") == "python -m bench.conformance"


def test_the_command_line_defaults_to_this_process_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["bench/x.py", "--only", "a b"])
    assert rf.command(REPO / "bench" / "x.py") == "python bench/x.py --only 'a b'"


def test_commit_is_the_checkout_description_and_none_outside_git(tmp_path: Path) -> None:
    head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=REPO, capture_output=True,
                          text=True).stdout.strip()
    got = rf.commit(REPO)
    assert got is not None and head[:7] in got
    assert rf.commit(tmp_path) is None


def test_load_average_is_three_rounded_figures() -> None:
    load = rf.load_average()
    assert len(load) == 3 and all(x >= 0 and round(x, 2) == x for x in load)


def test_provenance_names_command_commit_load_and_time() -> None:
    p = rf.provenance(REPO / "bench" / "fanout.py", ["--n", "1"])
    assert set(p) == {"command", "commit", "load_average", "at"}
    assert p["command"] == "python bench/fanout.py --n 1"
    assert p["at"].endswith("Z") and len(p["at"]) == len("2026-12-06T22:30:00Z")


def test_write_json_writes_the_document_with_a_trailing_newline(tmp_path: Path) -> None:
    out = rf.write_json(tmp_path / "new" / "r.json", {"figures": {"x": 1.5}}, indent=1)
    assert out.read_text() == json.dumps({"figures": {"x": 1.5}}, indent=1) + "\n"
    assert oct(out.stat().st_mode & 0o777) == oct(0o644)
    assert rf.read_json(out) == {"figures": {"x": 1.5}}


def test_a_write_that_fails_midway_leaves_the_previous_file_whole(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "r.json"
    out.write_text('{"figures": {"old": 1}}\n')

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError):
        rf.write_json(out, {"figures": {"new": 2, "pad": "x" * 100_000}})
    assert out.read_text() == '{"figures": {"old": 1}}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_a_document_that_is_not_json_raises_before_touching_the_file(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    out.write_text("{}\n")
    with pytest.raises(TypeError):
        rf.write_json(out, {"figures": {1, 2}})
    assert out.read_text() == "{}\n"
    assert len(list(tmp_path.iterdir())) == 1


@pytest.mark.parametrize("text", [None, "not json", "[1, 2]"])
def test_read_json_gives_an_empty_object_for_no_earlier_result(tmp_path: Path, text: str | None) -> None:
    path = tmp_path / "r.json"
    if text is not None:
        path.write_text(text)
    assert rf.read_json(path) == {}
