"""The code samples of the docs, read out of the Markdown (issue 22, item 8).

A sample is a fenced Python block (```` ```python ````, ```` ```py ````) whose previous non-blank
line is the marker ``<!-- sample: NAME -->`` (an HTML comment: invisible on GitHub and in
MkDocs, so blocks keep it wherever they move). :func:`doc_files` lists where samples may live:
``README.md`` and every ``docs/**/*.md``. :func:`extract` returns a file's samples and the
lines of its Python blocks that carry no marker (``tests/test_doc_samples.py`` allows none, so a
block added without one is caught).

Fences follow CommonMark: a run of 3+ backticks or tildes, optionally indented (up to 3 spaces,
or inside a list item: the block's indentation is removed), closed by a run of the same
character at least as long with nothing after it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MARKER = re.compile(r"^\s*<!--\s*sample:\s*([A-Za-z0-9_.-]+)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^`\s]*)")
PYTHON = {"python", "py", "python3"}
BASE_URL = "http://127.0.0.1:8080"
"""The proxy address every sample uses (``make run``'s); tests substitute their own."""


@dataclass(frozen=True)
class Sample:
    """One tagged block: ``name`` (the marker's), where it is (``path``, 1-based ``line`` of its
    opening fence) and its ``code`` (indentation of the fence removed)."""

    name: str
    path: Path
    line: int
    code: str

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"


def doc_files(repo: Path) -> list[Path]:
    """``README.md`` then ``docs/**/*.md`` (sorted), those that exist."""
    found = [repo / "README.md"] + sorted((repo / "docs").rglob("*.md"))
    return [p for p in found if p.is_file()]


def extract(path: Path, text: str | None = None) -> tuple[list[Sample], list[str]]:
    """``(samples, untagged)`` of the Markdown at ``path`` (``text``: its content, read from
    ``path`` when None); ``untagged``: ``"FILE:LINE"`` of each Python block with no marker."""
    lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
    samples: list[Sample] = []
    untagged: list[str] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = len(m.group(1)), m.group(2), m.group(3).lower()
        close = re.compile(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            line = lines[j]
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))):])
            j += 1
        if info in PYTHON:
            prev = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
            tag = MARKER.match(prev)
            if tag:
                samples.append(Sample(tag.group(1), path, i + 1, "\n".join(body) + "\n"))
            else:
                untagged.append(f"{path.name}:{i + 1}")
        i = j + 1
    return samples, untagged


def all_samples(repo: Path) -> tuple[list[Sample], list[str]]:
    """:func:`extract` over :func:`doc_files`, in order."""
    samples: list[Sample] = []
    untagged: list[str] = []
    for p in doc_files(repo):
        s, u = extract(p)
        samples += s
        untagged += u
    return samples, untagged
