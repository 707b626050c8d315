"""The README is a landing page (issue 22, item 9): at most ~250 lines — what it is, the two
commands, the first agent pointed at it, what you will see — and every link it gives resolves
(the reference moved to ``docs/``; a link that points nowhere fails here)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\((?!https?:|#|mailto:)([^)#]+)")


def test_the_readme_is_a_landing_page() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    heads = [line for line in text.splitlines() if line.startswith("## ")]
    assert heads[:2] == ["## Set up (fresh Linux machine, Python 3.11)", "## Point an agent at it"]
    assert "make run" in text and "make test" in text


def test_every_relative_link_in_the_readme_and_docs_resolves() -> None:
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in LINK.findall(page.read_text()):
            assert (page.parent / target).exists(), f"{page.name}: {target}"
