"""What the quantised and packed linears share, below all of them: the CPU's int8 dot-product
support and the one call that runs any prepared linear. Kept apart so that ``int8``,
``cpu_linear`` and ``screened_head`` import it instead of each other (they formed an import
circle)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["cpu_has_vnni", "linear_any"]


def cpu_has_vnni() -> bool:
    """Whether this CPU has VNNI / AMX int8 dot products (``/proc/cpuinfo`` flags
    ``avx512_vnni``, ``avx_vnni`` or ``amx_int8``); False where the file cannot be read."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags or "amx_int8" in flags


def linear_any(x: torch.Tensor, w: Any, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` for tensors; a prepared product (``Int8Linear``, ``cpu_linear.PackedLinear``:
    bias inside) is called."""
    if isinstance(w, torch.Tensor):
        return F.linear(x, w, b)
    return w(x)
