"""Property: each pass's OWN output, and the pipeline with every pass on, keeps the client's
meaning and stays within 4 breakpoints (:func:`tests.rewriter.meaning.check_meaning`).

The pipeline reverts a pass whose output breaks an API rule (fail-open), which would hide a broken
pass, so every pass's ``run`` is checked directly as well as the pipeline's result. Bodies carry
what the hostile tester used: a user's own numbered list and ``---`` sections, tool results with
retrieved passages (text, search_result blocks), document blocks (two identical), base64
images, client ``cache_control`` markers nested in ``tool_result`` content, tool_choice ``allowed_tools``, a system prompt naming a tool, and small budgets.
"""

from __future__ import annotations

import base64
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixgate.config.schema import RewriteSettings
from prefixgate.rewriter.pipeline import PASSES, _load, rewrite_request
from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.ir import Api
from prefixgate.rewriter.wire.validate import introduced
from tests.rewriter.helpers import ctx
from tests.rewriter.meaning import check_meaning
from tests.rewriter.strategies import anthropic_requests, openai_requests

ALL_ON: dict[str, Any] = {
    "prune_tools": True, "prune_tools_min_catalog": 2, "prune_rag": True, "rag_budget_tokens": 20,
    "prune_history": True, "history_high_watermark_tokens": 120,
    "history_low_watermark_tokens": 40, "rag_delimiters": ["\n---\n"]}
PHOTO = base64.b64encode(bytes(range(256)) * 400).decode()
USER_LIST = "Do all of these:\n[1] rename a to b\n[2] rename a to c\n[3] rename a to b"
USER_SECTIONS = "intro\n---\nkeep part one\n---\nkeep part one\n---\nend"
HITS = "\n".join(f"[{i}] passage {i} about topic {i % 3} " + "filler words " * 8
                 for i in range(1, 6))


def _user_strings(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m.get("role") == "user"
            and isinstance(m.get("content"), str)]


@st.composite
def hostile(draw: st.DrawFn) -> tuple[Api, dict[str, Any]]:
    """A valid body of either API with the hostile tester's content mixed in."""
    api: Api = draw(st.sampled_from(["openai", "anthropic"]))
    clock = draw(st.sampled_from([None, "2026-12-01T10:00:00Z"]))
    body = draw(openai_requests(clock) if api == "openai" else anthropic_requests(clock))
    for m in _user_strings(body):
        m["content"] = draw(st.sampled_from(["", USER_LIST + "\n", USER_SECTIONS + "\n",
                                             '<doc id="1">a b</doc><doc id="2">c d</doc>\n']
                                            )) + m["content"]
    for m in body["messages"]:
        if m.get("role") == "tool" and draw(st.booleans()):
            m["content"] = HITS
        if api == "anthropic" and m.get("role") == "user" and isinstance(m["content"], list):
            for b in m["content"]:
                if b.get("type") == "tool_result" and draw(st.booleans()):
                    inner: list[dict[str, Any]] = [{"type": "text", "text": HITS}]
                    if draw(st.booleans()):
                        inner = [{"type": "search_result", "source": f"https://s/{i}",
                                  "title": f"hit {i}", "content": [
                                      {"type": "text", "text": f"result {i % 2} " * 15}]}
                                 for i in range(3)]
                    if draw(st.booleans()):
                        inner[0]["cache_control"] = draw(st.sampled_from(
                            [{"type": "ephemeral"}, {"type": "ephemeral", "ttl": "1h"}]))
                    b["content"] = inner
    for m in body["messages"]:
        if api == "anthropic" and m.get("role") == "user" and draw(st.integers(0, 3)) == 0 \
                and not any(isinstance(b, dict) and b.get("type") == "tool_result"
                            for b in m["content"] if isinstance(m["content"], list)):
            doc = {"type": "document", "title": "t", "source": {
                "type": "text", "media_type": "text/plain", "data": "contract clause " * 12}}
            other = {"type": "document", "title": "u", "source": {
                "type": "text", "media_type": "text/plain", "data": "other clause " * 12}}
            content = m["content"]
            text = [{"type": "text", "text": content}] if isinstance(content, str) else content
            m["content"] = [doc, dict(doc), other, *text]
            break
    first = body["messages"][0]
    if draw(st.booleans()) and isinstance(first.get("content"), str):
        img = ({"type": "image_url", "image_url": {"url": "data:image/png;base64," + PHOTO}}
               if api == "openai" else
               {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                            "data": PHOTO}})
        first["content"] = [{"type": "text", "text": first["content"] or "look"}, img]
    names = [t["function"]["name"] if api == "openai" else t["name"] for t in body["tools"]]
    for i in range(draw(st.integers(0, 6))):
        name, desc = f"zz_filler_{i}", f"Manage widget inventory shelf {i}"
        body["tools"].append({"type": "function", "function": {"name": name, "description": desc}}
                             if api == "openai" else {"name": name, "description": desc,
                                                      "input_schema": {"type": "object"}})
    if api == "openai" and draw(st.booleans()):
        body["tool_choice"] = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
            {"type": "function", "function": {"name": draw(st.sampled_from(names))}}]}}
    if draw(st.booleans()):
        rule = f"Always call {draw(st.sampled_from(names))} first."
        if api == "anthropic":
            body["system"] = rule
        else:
            body["messages"].insert(0, {"role": "system", "content": rule})
    if api == "anthropic" and draw(st.integers(0, 3)) == 0:
        body["cache_control"] = draw(st.sampled_from(
            [{"type": "ephemeral"}, {"type": "ephemeral", "ttl": "1h"}]))
    return api, body


def _settings(**extra: Any) -> RewriteSettings:
    return RewriteSettings(**{**ALL_ON, **extra})


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile())
def test_each_pass_output_keeps_meaning_and_validity(case: tuple[Api, dict[str, Any]]) -> None:
    api, body = case
    provider = "anthropic" if api == "anthropic" else "openai"
    c = ctx(provider, model=body["model"], **ALL_ON)
    for spec in PASSES:
        run = _load(spec)
        assert run is not None
        prompt = wire.parse(body, api)
        out, _ = run(prompt, c)
        assert not introduced(prompt, out), (spec.name, introduced(prompt, out))
        check_meaning(body, wire.render(out), api, settings=_settings())


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile())
def test_pipeline_with_every_pass_on_keeps_meaning(case: tuple[Api, dict[str, Any]]) -> None:
    api, body = case
    provider = "anthropic" if api == "anthropic" else "openai"
    r = rewrite_request(body, api, ctx(provider, model=body["model"], **ALL_ON))
    check_meaning(body, r.body, api, settings=_settings())
    assert not any(e.detail.startswith(("pass failed", "output invalid")) for e in r.edits), \
        [e.detail for e in r.edits if not e.applied]
