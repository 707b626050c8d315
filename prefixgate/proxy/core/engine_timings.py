"""The timings a backend reports of its own work (issue 9): read from its response headers.

``X-Engine-TTFT-Ms`` (ours: request arrival -> first token, i.e. queue + prefill),
``X-Engine-Decode-Ms`` (ours, non-streamed answers: first -> last token), and, where an engine
sends them, ``X-Engine-Queue-Ms`` / ``X-Engine-Prefill-Ms``. A header that is absent or not a
finite non-negative number is None (not reported), never 0. An engine that reports its times in
the answer's body instead (llama.cpp ``timings.prompt_ms`` / ``predicted_ms``, read by
:func:`prefixgate.proxy.core.usage.engine_usage`) fills what the headers left None
(:func:`with_body_times`; the headers win where both report). :func:`apply_reported_timings`
puts them on the ledger row.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from prefixgate.cache.ledger.store import LedgerRow

TTFT_HEADER = "x-engine-ttft-ms"
DECODE_HEADER = "x-engine-decode-ms"
QUEUE_HEADER = "x-engine-queue-ms"
PREFILL_HEADER = "x-engine-prefill-ms"


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


def with_body_times(t: EngineTimings, prefill_ms: float | None,
                    decode_ms: float | None) -> EngineTimings:
    """``t`` with its None prefill / decode filled from the answer body's own times (ms)."""
    return replace(t, prefill_ms=t.prefill_ms if t.prefill_ms is not None else prefill_ms,
                   decode_ms=t.decode_ms if t.decode_ms is not None else decode_ms)


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
