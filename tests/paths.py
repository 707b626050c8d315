"""Locations of the repository and the shared, read-only test data.

The data lives beside the checkout in ``../shared/data`` (never copied into the repo);
``PREFIXGATE_DATA_DIR`` points elsewhere when the checkout is not next to it.
"""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("PREFIXGATE_DATA_DIR") or REPO.parent / "shared" / "data").resolve()
