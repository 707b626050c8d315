"""The stable region of a prompt (tools + system) and its hash.

``stable_prefix_hash`` is the hex sha256 of the rendered tools and system region, in wire
form and key order (``cache_control`` markers excluded, so placing a breakpoint does not change
the hash). Used for ``prompt_cache_key``, prefix affinity and the counterfactual ledger.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from rewriter.ir import Prompt, without_key
from rewriter.wire_anthropic import render_message as render_anthropic
from rewriter.wire_openai import render_message as render_openai


def _strip(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _strip(x) for k, x in without_key(v, "cache_control").items()}
    if isinstance(v, list):
        return [_strip(x) for x in v]
    return v


def stable_region(prompt: Prompt) -> dict[str, Any]:
    """``{"tools": [...], "system": [...]}`` in wire form, without cache_control markers."""
    render = render_openai if prompt.api == "openai" else render_anthropic
    region = {"tools": [t.raw for t in prompt.tools or ()],
              "system": [render(m) for m in prompt.system]}
    if '"cache_control"' in json.dumps(region, ensure_ascii=False):
        return _strip(region)  # type: ignore[no-any-return]
    return region


def stable_prefix_hash(prompt: Prompt) -> str:
    """Hex sha256 of :func:`stable_region` serialized compactly (key order kept)."""
    data = json.dumps(stable_region(prompt), separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(data.encode()).hexdigest()
