"""Suite-wide checks: the shared real test data must be present (it is read in place)."""

from __future__ import annotations

import pytest

from tests.paths import DATA


def pytest_sessionstart(session: pytest.Session) -> None:
    """Stop at once, with the fix, when ``../shared/data`` is missing (instead of N errors)."""
    if not (DATA / "traces" / "tau_bench_airline_gpt4o.json").exists():
        raise pytest.UsageError(
            f"test data not found at {DATA}: check out prefixgate next to the project's shared/ "
            "folder (../shared/data) or set PREFIXGATE_DATA_DIR to its data/ directory")
