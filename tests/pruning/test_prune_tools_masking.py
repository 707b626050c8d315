"""prune_tools on an engine route (``Context.masks_tools``): mask instead of removing."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from prefixgate.rewriter.pipeline import rewrite_request
from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.validate import violations
from tests.pruning.test_prune_tools import catalog, names
from tests.rewriter.helpers import ctx


def _body(choice: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "local", "tools": catalog("openai"), "messages": [
        {"role": "user", "content": "What is the weather forecast in Oslo tomorrow?"}]}
    if choice is not None:
        body["tool_choice"] = choice
    return body


def _rewrite(body: dict[str, Any], masks: bool, prune: bool = True) -> Any:
    return rewrite_request(body, "openai", replace(ctx("radix", prune_tools=prune),
                                                   masks_tools=masks))


@pytest.mark.parametrize("choice, mode", [(None, "auto"), ("auto", "auto"),
                                          ("required", "required")])
def test_engine_route_keeps_every_tool_and_sends_allowed_tools(choice: Any, mode: str) -> None:
    body = _body(choice)
    pruned = _rewrite(body, masks=False)
    masked = _rewrite(body, masks=True)
    assert len(names(pruned.body)) < len(body["tools"])  # removal elsewhere
    unpruned = _rewrite(body, masks=True, prune=False)
    assert masked.body["tools"] == unpruned.body["tools"]  # same prefix bytes as no pruning
    tc = masked.body["tool_choice"]
    assert tc["type"] == "allowed_tools" and tc["allowed_tools"]["mode"] == mode
    allowed = [t["function"]["name"] for t in tc["allowed_tools"]["tools"]]
    assert allowed == names(pruned.body)  # the set pruning would keep, catalog order
    edit = next(e for e in masked.edits if e.pass_name == "prune_tools")
    assert edit.applied and "masked" in edit.detail and edit.tokens_removed == 0
    assert not violations(wire.parse(masked.body, "openai"))


@pytest.mark.parametrize("choice", ["none", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_binding_choice_is_left_as_sent(choice: Any) -> None:
    masked = _rewrite(_body(choice), masks=True)
    assert masked.body["tool_choice"] == choice
    assert len(masked.body["tools"]) == len(catalog("openai"))


def test_anthropic_clients_are_pruned_as_before() -> None:
    body = {"model": "local", "max_tokens": 64, "tools": catalog("anthropic"), "messages": [
        {"role": "user", "content": "What is the weather forecast in Oslo tomorrow?"}]}
    out = rewrite_request(body, "anthropic", replace(ctx("radix", prune_tools=True),
                                                     masks_tools=True))
    assert len(names(out.body)) < len(body["tools"]) and "tool_choice" not in out.body
