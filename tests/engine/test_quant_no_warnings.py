"""Building the int8 linears prints nothing (issue 37, item 4: torch's deprecation warning for
qint8 tensors was the first line ``prefixgate serve`` showed). Run in a fresh interpreter: torch
may say it once per process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = """
import warnings
warnings.simplefilter("always")
import torch
from prefixgate.local_engine.model.quant.int8 import Int8Linear
from prefixgate.local_engine.model.quant.screened_head import ScreenedHead
w = torch.randn(64, 32)
head = ScreenedHead(w, lambda x: x @ w.t())
lin = Int8Linear(w, None)
x = torch.randn(3, 32)
assert torch.isfinite(head(x)).all() and torch.isfinite(lin(x)).all()
with warnings.catch_warnings(record=True) as seen:  # other warnings still pass
    warnings.simplefilter("always")
    warnings.warn("a user warning", UserWarning)
assert len(seen) == 1
print("built")
"""


def test_int8_linears_build_without_a_deprecation_warning() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-W", "always", "-c", BUILD], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "built"
    assert "deprecated" not in done.stderr and "Warning" not in done.stderr, done.stderr
