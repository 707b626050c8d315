"""Locations of the repository and the shared, read-only test data (``../shared/data``)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
