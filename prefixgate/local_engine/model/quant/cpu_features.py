"""What the quantised and packed linears share, below all of them: the CPU's int8 dot-product
support and the one call that runs any prepared linear. Kept apart so that ``int8``,
``cpu_linear`` and ``screened_head`` import it instead of each other (they formed an import
circle)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["cpu_has_vnni", "linear_any", "quantize_rows_int8"]

QINT8_DEPRECATION = "torch.quantize_per_tensor, torch.quantize_per_channel"
"""The start of torch's warning (2.13) that quantized tensor types are deprecated
(pytorch/pytorch#184982): fbgemm's dynamic int8 linear (``quantized.linear_prepack`` /
``linear_dynamic``) still takes only such a tensor, and no replacement exists yet, so the one
call that makes it says nothing to a user (issue 37: it was the first line ``serve`` printed)."""


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


def quantize_rows_int8(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``w`` ``[out, in]`` fp32 as a per-row (axis 0) symmetric ``torch.qint8`` tensor with
    ``scale`` ``[out]`` (zero points 0): the form ``torch.ops.quantized.linear_prepack`` packs.
    torch's deprecation warning for the qint8 type (:data:`QINT8_DEPRECATION`) is silenced for
    this call only; every other warning passes."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=QINT8_DEPRECATION, category=UserWarning)
        return torch.quantize_per_channel(w, scale.double(), torch.zeros(
            w.shape[0], dtype=torch.long), 0, torch.qint8)
