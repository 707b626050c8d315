"""Holdout A/B membership (issue 9, item 2): is this session sent unrewritten?

A session is in the holdout when ``sha256(f"{seed}:{session_id}")``, read as a number in
[0, 1), falls below ``policy.holdout.fraction``. The session id is the proxy's own
(:func:`prefixgate.proxy.pipeline.rewrite.session_id_for`), so every request of one conversation lands on the
same side and a prefix cache sees a whole conversation either rewritten or not. Deterministic: the
same id and seed always give the same answer; another seed reshuffles the sessions.
"""

from __future__ import annotations

import hashlib

from prefixgate.config.schema import HoldoutSettings


def holdout_point(session_id: str, seed: int) -> float:
    """The session's position in [0, 1) for ``seed``."""
    digest = hashlib.sha256(f"{seed}:{session_id}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64


def in_holdout(session_id: str, settings: HoldoutSettings) -> bool:
    """True when the session is held out (sent unrewritten); always False at fraction 0."""
    return settings.fraction > 0 and holdout_point(session_id, settings.seed) < settings.fraction
