"""What the ledger row gets beyond usage (issue 9): per-pass token figures and the backend's
own timings.

- :func:`pass_tokens_json`: the applied Edits as ``{pass: {"reusable", "removed", "added"}}``
  (token counts only, never text), the ledger's ``pass_tokens`` column, read by
  :mod:`prefixgate.cache.attribution`.
- :func:`engine_timings` / :func:`apply_reported_timings`: an engine's timing headers.
  ``X-Engine-TTFT-Ms`` (ours: request arrival -> first token, i.e. queue + prefill),
  ``X-Engine-Decode-Ms`` (ours, non-streamed answers: first -> last token), and, where an
  engine sends them, ``X-Engine-Queue-Ms`` / ``X-Engine-Prefill-Ms``. A header that is absent or
  not a finite non-negative number is None (not reported), never 0.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prefixgate.cache.ledger import LedgerRow
from prefixgate.rewriter.types import Edit

TTFT_HEADER = "x-engine-ttft-ms"
DECODE_HEADER = "x-engine-decode-ms"
QUEUE_HEADER = "x-engine-queue-ms"
PREFILL_HEADER = "x-engine-prefill-ms"


def pass_tokens_json(edits: Iterable[Edit]) -> str:
    """``{pass: {"reusable", "removed", "added"}}`` summed over the applied ``edits`` (a pass
    may emit several); "" when none applied or none moved a token."""
    out: dict[str, dict[str, int]] = {}
    for e in edits:
        if not e.applied:
            continue
        f = out.setdefault(e.pass_name, {"reusable": 0, "removed": 0, "added": 0})
        f["reusable"] += e.tokens_reusable
        f["removed"] += e.tokens_removed
        f["added"] += e.tokens_added
    out = {k: v for k, v in out.items() if any(v.values())}
    return json.dumps(out, separators=(",", ":"), sort_keys=True) if out else ""


@dataclass(frozen=True)
class EngineTimings:
    """Milliseconds the backend reported (None = not reported)."""

    ttft_ms: float | None = None
    queue_ms: float | None = None
    prefill_ms: float | None = None
    decode_ms: float | None = None


def _ms(headers: Mapping[str, str], name: str) -> float | None:
    v = headers.get(name)
    if not isinstance(v, str) or not 0 < len(v) <= 32:
        return None
    try:
        x = float(v)
    except ValueError:
        return None
    return x if math.isfinite(x) and x >= 0 else None


def engine_timings(headers: Mapping[str, str]) -> EngineTimings:
    """The timing headers of an upstream response (module docstring)."""
    return EngineTimings(_ms(headers, TTFT_HEADER), _ms(headers, QUEUE_HEADER),
                         _ms(headers, PREFILL_HEADER), _ms(headers, DECODE_HEADER))


def apply_reported_timings(row: LedgerRow, t: EngineTimings) -> None:
    """Fill ``row`` from ``t``: queue / prefill / decode as reported; for a non-streamed answer
    (no TTFT measured by the proxy) the backend's TTFT with ``ttft_source="reported"`` and, when
    decode time and output tokens are known, TPOT = decode / (output - 1). A TTFT the proxy
    measured on a stream is kept (``ttft_source="measured"``)."""
    row.queue_ms, row.prefill_ms, row.decode_ms = t.queue_ms, t.prefill_ms, t.decode_ms
    if row.ttft_ms is not None:
        row.ttft_source = "measured"
        return
    if t.ttft_ms is not None:
        row.ttft_ms, row.ttft_source = t.ttft_ms, "reported"
    if row.tpot_ms is None and t.decode_ms is not None and (row.output_tokens or 0) >= 2:
        row.tpot_ms = t.decode_ms / (row.output_tokens - 1)  # type: ignore[operator]
