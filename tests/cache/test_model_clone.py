"""``CacheModel.clone``: a copy of a cache's state that then evolves on its own (the stage chain
of :mod:`prefixgate.proxy.observe.insight` starts a pass's cache as the previous stage's)."""

from __future__ import annotations

from typing import Any

import pytest

from prefixgate.cache.provider_models import make_model

SYSTEM = "Follow the policy. Verify the user first. " * 200


def _body(provider: str, user: str) -> dict[str, Any]:
    if provider == "anthropic":
        return {"model": "claude-sonnet-4-5", "max_tokens": 5,
                "system": [{"type": "text", "text": SYSTEM,
                            "cache_control": {"type": "ephemeral"}}],
                "messages": [{"role": "user", "content": user}]}
    return {"model": "gpt-4o", "messages": [{"role": "system", "content": SYSTEM},
                                            {"role": "user", "content": user}]}


@pytest.mark.parametrize("provider", ["anthropic", "openai", "radix"])
def test_a_clone_has_the_state_and_then_its_own_history(provider: str) -> None:
    original = make_model(provider, lambda t: (len(t) + 3) // 4)
    original.process(_body(provider, "a"), 0.0)
    twin = original.clone()
    assert twin.process(_body(provider, "b"), 1.0).cached_read_tokens > 1000   # inherited
    fresh = make_model(provider, lambda t: (len(t) + 3) // 4).process(_body(provider, "b"), 1.0)
    assert fresh.cached_read_tokens == 0
    # what the twin learns stays in the twin
    c = _body(provider, "a long question " * 300)
    if provider == "anthropic":
        c["cache_control"] = {"type": "ephemeral"}
    twin.process(c, 2.0)
    assert twin.process(c, 3.0).cached_read_tokens > original.process(c, 3.0).cached_read_tokens
    # deep tries (one block per message) are copied without recursion limits
    deep = make_model(provider, lambda t: (len(t) + 3) // 4)
    long = _body(provider, "x")
    long["messages"] = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"}
                        for i in range(3001)]
    if provider == "anthropic":
        long["cache_control"] = {"type": "ephemeral"}
    deep.process(long, 0.0)
    assert deep.clone().process(long, 1.0).cached_read_tokens > 1000
