"""What every benchmark's result file records, and how it is written: one helper for all of ``bench/``.

A result file (``bench/results/<name>.json``) carries its figures and how they were made: the
command that reproduces them, the commit they were measured at, the machine's load average (the
box is shared; a figure taken under load says so) and when. Each script keeps its own JSON shape
(readers and tests depend on its keys); this module supplies the values and the write:

- :func:`command`: the shell command line of this run (``python bench/x.py --flag 'a b'``);
- :func:`commit`: ``git describe --always --dirty`` of the checkout (None outside git);
- :func:`load_average`: ``[1 min, 5 min, 15 min]`` from ``os.getloadavg``, rounded to 0.01;
- :func:`utc_now`: ``"2026-12-06T22:30:00Z"``;
- :func:`provenance`: the four together, for a new script's ``{"command", "commit",
  "load_average", "at"}``;
- :func:`read_json`: an earlier result file, or ``{}`` (missing, unreadable, not an object), for
  scripts that carry earlier runs or sections over;
- :func:`write_json`: the file written atomically (a temporary file in the same folder, then
  ``os.replace``): a run killed mid-write leaves the previous file whole, never half of one.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def command(script: str | os.PathLike[str], argv: Sequence[str] | None = None, prefix: str = "python") -> str:
    """The command line that reproduces this run: ``prefix``, the script, its arguments
    shell-quoted (``shlex.join``). ``script``: a file (``__file__``; shown relative to the
    repository root when under it, e.g. ``bench/fanout.py``) or a name as given (``-m
    bench.conformance``); ``argv``: the arguments, ``sys.argv[1:]`` when None; ``prefix``: how
    the script is started (``"python"``, ``"nice -n 5 .venv/bin/python"``), kept unquoted."""
    name = os.fspath(script)
    if name.endswith(".py"):
        path = Path(name).resolve()
        name = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else name
    args = shlex.join(sys.argv[1:] if argv is None else argv)
    return " ".join(part for part in (prefix, name, args) if part)


def commit(repo: Path = REPO) -> str | None:
    """``git describe --always --dirty`` of ``repo`` (e.g. ``"d22a05e-dirty"``); None when it is
    not a git checkout or git is missing."""
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=repo,
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def load_average() -> list[float]:
    """The machine's load average ``[1 min, 5 min, 15 min]`` (runnable processes, rounded to
    0.01), or ``[]`` where the platform has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def utc_now() -> str:
    """The current UTC time, ``"YYYY-MM-DDTHH:MM:SSZ"``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def provenance(script: str | os.PathLike[str], argv: Sequence[str] | None = None,
               prefix: str = "python") -> dict[str, Any]:
    """``{"command", "commit", "load_average", "at"}`` of this run (arguments as in
    :func:`command`): what a new result file records beside its ``"figures"``."""
    return {"command": command(script, argv, prefix), "commit": commit(),
            "load_average": load_average(), "at": utc_now()}


def read_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object in ``path``; ``{}`` when the file is missing, unreadable, not JSON or not
    an object (an earlier run to carry over is optional)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def write_json(path: str | os.PathLike[str], doc: Any, indent: int | None = 2) -> Path:
    """Write ``doc`` to ``path`` as JSON (``indent``, a trailing newline), atomically: the text
    goes to a temporary file in the same folder, flushed to disk, then replaces ``path`` in one
    ``os.replace`` (mode 0644, as a plain write under the usual umask). Creates the folder if
    missing. Raises ``TypeError`` (before touching
    ``path``) when ``doc`` is not JSON-serialisable; returns the path."""
    target = Path(path)
    text = json.dumps(doc, indent=indent) + "\n"
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
