"""The providers' own cache-miss diagnostics, read off an answer (issue 35, item 3).

Shapes (names checked against the providers' docs and SDK models, read 2026-12-06; the reasons
and their causes: :mod:`prefixgate.cache.savings.miss_causes`):

* Anthropic Messages: top-level ``diagnostics`` of the message (non-streamed answer; a stream's
  ``message_start`` message)::

      "diagnostics": {"cache_miss_reason": {"type": "system_changed",
                                            "cache_missed_input_tokens": 2048}}

  ``cache_miss_reason: null`` with ``diagnostics`` present: the comparison was still running
  when the answer was written -> reason ``pending``.
* OpenAI Responses: ``prompt_cache_diagnostics`` of the response (non-streamed answer; a
  stream's ``response.completed`` / ``response.incomplete`` response)::

      "prompt_cache_diagnostics": {"type": "cache_miss", "reason": "tools_changed",
                                   "cache_missed_tokens": 1536, "comparison_reusable_tokens": 2048}

  A ``cache_miss`` is reported by its ``reason`` (``cache_miss`` when it has none); any other
  ``type`` (``cache_hit``, ``comparison_response_not_found``, ``unavailable``) as the type.

Tolerant: a reason that is not a short string of ``[a-z0-9_]`` is kept only when it is one
(anything else is dropped, never an error); unknown reasons are kept as written (at most
:data:`MAX_REASON` characters). Token counts are non-negative ints or None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MAX_REASON = 64
_REASON = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


@dataclass(frozen=True)
class Diagnosis:
    """A provider's verdict on one request: ``reason`` (module docstring), ``missed_tokens``
    (input tokens the provider says it could not reuse), ``reusable_tokens`` (OpenAI's
    ``comparison_reusable_tokens``: the baseline's reusable prefix)."""

    reason: str
    missed_tokens: int | None = None
    reusable_tokens: int | None = None


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _reason(v: Any) -> str | None:
    return v if isinstance(v, str) and _REASON.match(v) else None


def anthropic_diagnosis(message: Any) -> Diagnosis | None:
    """The diagnosis of an Anthropic message (answer or ``message_start``'s message); None when
    it carries no ``diagnostics`` object."""
    d = message.get("diagnostics") if isinstance(message, dict) else None
    if not isinstance(d, dict):
        return None
    why = d.get("cache_miss_reason")
    if why is None:
        return Diagnosis("pending")
    if not isinstance(why, dict):
        return None
    reason = _reason(why.get("type"))
    if reason is None:
        return None
    return Diagnosis(reason, _count(why.get("cache_missed_input_tokens")))


def openai_diagnosis(response: Any) -> Diagnosis | None:
    """The diagnosis of a Responses response object; None when it has no
    ``prompt_cache_diagnostics`` object."""
    d = response.get("prompt_cache_diagnostics") if isinstance(response, dict) else None
    if not isinstance(d, dict):
        return None
    kind = _reason(d.get("type"))
    if kind is None:
        return None
    reason = (_reason(d.get("reason")) or kind) if kind == "cache_miss" else kind
    return Diagnosis(reason, _count(d.get("cache_missed_tokens")),
                     _count(d.get("comparison_reusable_tokens")))
