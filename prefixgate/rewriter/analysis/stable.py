"""The stable region of a prompt (tools + system) and its hash.

``stable_prefix_hash`` is the hex sha256 of the rendered tools and system region, in wire
form and key order (``cache_control`` markers excluded, so placing a breakpoint does not change
the hash). Used for ``prompt_cache_key``, prefix affinity and the counterfactual ledger.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from prefixgate.rewriter.wire.anthropic import render_message as render_anthropic
from prefixgate.rewriter.wire.ir import Prompt, without_key
from prefixgate.rewriter.wire.openai import render_message as render_openai


def _strip(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _strip(x) for k, x in without_key(v, "cache_control").items()}
    if isinstance(v, list):
        return [_strip(x) for x in v]
    return v


def _has_key(v: Any, key: str) -> bool:
    """True when ``key`` is a key of any dict nested in ``v`` (a walk over the containers:
    no serialization of the texts)."""
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            if key in x:
                return True
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return False


def marked_region(prompt: Prompt) -> dict[str, Any]:
    """``{"tools": [...], "system": [...]}`` in wire form, ``cache_control`` markers included:
    what :func:`stable_region` is a function of (a memo's key)."""
    render = render_openai if prompt.api == "openai" else render_anthropic
    return {"tools": [t.raw for t in prompt.tools or ()],
            "system": [render(m) for m in prompt.system]}


def stable_region(prompt: Prompt) -> dict[str, Any]:
    """``{"tools": [...], "system": [...]}`` in wire form, without cache_control markers."""
    region = marked_region(prompt)
    if _has_key(region, "cache_control"):
        return _strip(region)  # type: ignore[no-any-return]
    return region


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
ONE_SHOT_MAX_ITEMS = 4096
"""Regions with at most this many tools + system blocks are serialized in one call of the
C encoder (``JSONEncoder.encode``: ~10x the piecewise encoder's speed on a 29 KB agent body);
larger ones piece by piece. Both give the same text (the same encoder settings)."""
ONE_SHOT_MAX_CHARS = 1 << 20
"""Above this many characters the one-shot text is dropped and the region hashed piecewise."""


def stable_prefix_hash(prompt: Prompt) -> str:
    """Hex sha256 of :func:`stable_region` serialized compactly (key order kept): the bytes of
    ``json.dumps(region, separators=(",", ":"), ensure_ascii=False)``. A region of more than
    :data:`ONE_SHOT_MAX_ITEMS` items, or one whose text passes :data:`ONE_SHOT_MAX_CHARS`, is
    fed to the hash piece by piece (no copy of a megabytes-long system prompt, and a worker
    thread yields between pieces)."""
    region = stable_region(prompt)
    h = hashlib.sha256()
    if len(region["tools"]) + len(region["system"]) <= ONE_SHOT_MAX_ITEMS:
        text = _ENCODER.encode(region)
        if len(text) <= ONE_SHOT_MAX_CHARS:
            h.update(text.encode())
            return h.hexdigest()
    for piece in _ENCODER.iterencode(region):
        h.update(piece.encode())
    return h.hexdigest()
