"""The per-backend defaults table (issue 35, item 4) is generated from the code, and
docs/providers.md (linked from the README) is current."""

from __future__ import annotations

from pathlib import Path

from prefixgate.config.backend_kinds import BACKEND_KINDS
from prefixgate.config.provider_table import page, table
from prefixgate.config.schema import RewriteSettings

REPO = Path(__file__).resolve().parents[2]


def test_docs_page_is_current() -> None:
    assert (REPO / "docs" / "providers.md").read_text() == page(), (
        "docs/providers.md is stale: run `python -m prefixgate.config.provider_table --page > "
        "docs/providers.md`")


def test_a_row_per_kind_and_the_cells_follow_the_settings() -> None:
    text = table()
    assert all(f"| `{k}` |" in text for k in BACKEND_KINDS)
    openai_row = next(line for line in text.splitlines() if line.startswith("| `openai` |"))
    assert "`prompt_cache_key` per conversation" in openai_row
    off = table(RewriteSettings(openai_prompt_cache_key=False, hoist_volatile=True))
    openai_off = next(line for line in off.splitlines() if line.startswith("| `openai` |"))
    assert "prompt_cache_key" not in openai_off and "`hoist_volatile`" not in openai_off
