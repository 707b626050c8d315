"""The passage-order stabiliser (``prefixgate/rewriter/passes/stabilise_passages.py``): each markup form, the
retrieval-only rule, labels travelling with their passages, and properties over whole sessions
(same multiset, ids intact, first-seen order across turns, idempotent, history re-rendered to the
same bytes, meaning kept)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixgate.rewriter.passes.stabilise_passages import MAX_SEEN, MEMORY_KEY, SeenOrder, digest, run
from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.ir import Api
from tests.rewriter.helpers import ctx, replay
from tests.rewriter.meaning import MeaningViolation, check_meaning

TEXTS = {k: f"{k} passage about topic {k} with some detail words {k}{k}" for k in "abcdefgh"}
FORMS = ("tag", "numbered", "header", "markdown", "json")


def render(form: str, keys: list[str], header: str = "Retrieved documents:") -> str:
    """A retrieval of ``keys`` (each passage labelled by its own key) in ``form``."""
    num = {k: i + 3 for i, k in enumerate(sorted(TEXTS))}
    if form == "tag":
        body = "\n".join(f'<document id="{k}">{TEXTS[k]}</document>' for k in keys)
    elif form == "numbered":
        body = "\n".join(f"[{num[k]}] {TEXTS[k]}" for k in keys)
    elif form == "header":
        body = "\n".join(f"Document {k}: {TEXTS[k]}" for k in keys)
    elif form == "markdown":
        body = "\n\n".join(f"## Source {k}\n\n{TEXTS[k]}" for k in keys)
    else:
        body = json.dumps([{"id": k, "content": TEXTS[k]} for k in keys], indent=1)
    return f"{header}\n{body}\n\nAnswer from these only."


def marker(form: str, k: str) -> str:
    """The label plus the start of passage ``k``'s text, as :func:`render` writes it."""
    num = {x: i + 3 for i, x in enumerate(sorted(TEXTS))}
    return {"tag": f'<document id="{k}">{k} passage', "numbered": f"[{num[k]}] {k} passage",
            "header": f"Document {k}: {k} passage", "markdown": f"## Source {k}\n\n{k} passage",
            "json": f'"id": "{k}",\n  "content": "{k} passage'}[form]


def order_in(text: str, form: str) -> list[str]:
    """Keys of the passages in ``text`` (each found whole, label attached), in text order."""
    found = [(text.find(marker(form, k)), k) for k in sorted(TEXTS)]
    for pos, k in found:
        assert pos < 0 or text.count(TEXTS[k]) == 1
    return [k for pos, k in sorted(found) if pos >= 0]


def system_body(text: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "system", "content": text},
                                       {"role": "user", "content": "What holds?"}]}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("where", ["system", "user", "tool"])
def test_turn2_renders_turn1_order(form: str, where: str) -> None:
    def body(keys: list[str]) -> dict[str, Any]:
        text = render(form, keys)
        if where == "system":
            return system_body(text)
        if where == "user":
            return {"model": "m", "messages": [{"role": "user", "content": text}]}
        return {"model": "m", "messages": [
            {"role": "user", "content": "search"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "s", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": text}]}

    t1, t2 = body(["a", "b", "c"]), body(["c", "a", "d", "b"])
    r1, r2 = replay([t1, t2], "openai")
    idx = 0 if where != "tool" else 2
    out2 = r2.body["messages"][idx]["content"]
    assert order_in(out2, form) == ["a", "b", "c", "d"]
    assert "stabilise_passages" in r2.summary()
    assert out2.startswith(r1.body["messages"][idx]["content"].split("\n\nAnswer")[0]
                           .rsplit("\n", 1)[0])
    check_meaning(t2, r2.body, "openai", settings=ctx().settings)


@pytest.mark.parametrize("form", ["numbered", "header", "markdown", "json"])
def test_users_own_list_is_never_reordered(form: str) -> None:
    """Without a retrieval header, a user's numbered list / notes / sections stay as written."""
    bodies = [{"model": "m", "messages": [{"role": "user", "content": render(form, keys, "Do:")}]}
              for keys in (["a", "b", "c"], ["c", "b", "a"])]
    r2 = replay(bodies, "openai")[1]
    assert r2.body is bodies[1]


def test_labels_travel_and_positional_numbers_are_not_renumbered() -> None:
    t1 = "Sources:\n[7] seven alpha\n[3] three beta"
    t2 = "Sources:\n[3] three beta\n[7] seven alpha"
    r2 = replay([system_body(t1), system_body(t2)], "openai")[1]
    assert r2.body["messages"][0]["content"] == t1  # [7] still labels "seven alpha"
    positional = ["Sources:\n[1] alpha\n[2] beta", "Sources:\n[1] beta\n[2] alpha"]
    r2 = replay([system_body(t) for t in positional], "openai")[1]
    assert r2.body["messages"][0]["content"] == positional[1]  # never renumbered


@pytest.mark.parametrize("texts", [
    ["<result>rule one</result>\n<result>rule two</result>",
     "<result>rule two</result>\n<result>rule one</result>"],
    ["## Context\nbe brief\n## Reference\nuse metric units",
     "## Reference\nuse metric units\n## Context\nbe brief"],
])
def test_a_developers_own_sections_in_system_text_are_not_passages(texts: list[str]) -> None:
    r2 = replay([system_body(t) for t in texts], "openai")[1]
    assert r2.body["messages"][0]["content"] == texts[1]


def test_gaps_with_content_are_not_reordered() -> None:
    texts = ['<doc id="1">one</doc> and then <doc id="2">two</doc>',
             '<doc id="2">two</doc> and then <doc id="1">one</doc>']
    r2 = replay([system_body(t) for t in texts], "openai")[1]
    assert r2.body["messages"][0]["content"] == texts[1]


def _docs(keys: list[str], citations: bool) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                        "data": TEXTS[k]}, "title": k,
         **({"citations": {"enabled": True}} if citations else {})} for k in keys]
    return {"model": "claude-x", "max_tokens": 10, "messages": [
        {"role": "user", "content": [*blocks, {"type": "text", "text": "Summarise."}]}]}


@pytest.mark.parametrize("citations", [False, True])
def test_document_blocks(citations: bool) -> None:
    t1, t2 = _docs(["a", "b"], citations), _docs(["b", "a", "c"], citations)
    r2 = replay([t1, t2], "anthropic", provider="anthropic")[1]
    titles = [b.get("title") for b in r2.body["messages"][0]["content"]][:3]
    assert titles == (["b", "a", "c"] if citations else ["a", "b", "c"])
    check_meaning(t2, r2.body, "anthropic", settings=ctx().settings)


def test_meaning_checker_rejects_a_reorder_when_the_pass_is_off() -> None:
    t1, t2 = system_body(render("tag", ["a", "c"])), {"model": "m", "messages": [
        {"role": "user", "content": render("tag", ["b", "a"])}]}
    r = replay([t1, t2], "openai")[1]
    assert r.body is not t2
    with pytest.raises(MeaningViolation):
        check_meaning(t2, r.body, "openai", settings=ctx(stabilise_passages=False).settings)


def test_memory_holds_digests_only_and_is_bounded() -> None:
    r = replay([system_body(render("tag", ["a", "b"]))], "openai")[0]
    mem = json.dumps({k: v for e in r.edits for k, v in e.memory.items()})
    assert "passage about" not in mem and "topic" not in mem
    assert digest(f'<document id="a">{TEXTS["a"]}</document>') in mem
    seen = SeenOrder()
    seen.order([f"{i:08d}" for i in range(MAX_SEEN + 50)])
    assert len(seen.ranks) == MAX_SEEN
    assert SeenOrder.from_memory(seen.memory()[MEMORY_KEY]).ranks == seen.ranks


def test_off_switch() -> None:
    bodies = [system_body(render("tag", k)) for k in (["a", "b"], ["b", "a"])]
    r2 = replay(bodies, "openai", stabilise_passages=False)[1]
    assert r2.body is bodies[1]


# --------------------------------------------------------------------------------------------
# Properties over sessions
# --------------------------------------------------------------------------------------------

turns_st = st.lists(st.lists(st.sampled_from(sorted(TEXTS)), min_size=2, max_size=6, unique=True),
                    min_size=1, max_size=5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(form=st.sampled_from(FORMS), turns=turns_st, api=st.sampled_from(["openai", "anthropic"]))
def test_session_properties(form: str, turns: list[list[str]], api: Api) -> None:
    """A conversation whose every user turn carries a retrieval; the history is re-sent."""
    memory: dict[str, Any] = {}
    first_seen: list[str] = []
    emitted: list[str] = []  # what each user message became when it was the newest
    history: list[dict[str, Any]] = []
    for i, keys in enumerate(turns):
        history = [*history, {"role": "user", "content": render(form, keys)}]
        body = {"model": "m", "max_tokens": 5, "messages": history}
        prompt = wire.parse(body, api)
        c = ctx(session=memory)
        out, edits = run(prompt, c)
        sent = wire.render(out)
        texts = [m["content"] for m in sent["messages"] if m["role"] == "user"]
        # history re-rendered to the bytes it had when it was the newest message
        assert texts[:-1] == emitted
        newest = texts[-1]
        # same multiset, every passage whole with its own label, nothing else changed
        assert sorted(order_in(newest, form)) == sorted(keys)
        assert len(newest) == len(history[-1]["content"])
        # first-seen order: seen passages first in that order, then new ones as sent
        seen = [k for k in first_seen if k in keys]
        assert order_in(newest, form) == seen + [k for k in keys if k not in first_seen]
        first_seen += [k for k in keys if k not in first_seen]
        # idempotent: the pass on its own output, same memory, changes nothing
        again, _ = run(out, c)
        assert wire.render(again) == sent
        check_meaning(body, sent, api, settings=c.settings)
        emitted.append(newest)
        for e in edits:
            memory.update(e.memory)
        history[-1] = {"role": "user", "content": history[-1]["content"]}
        history.append({"role": "assistant", "content": f"answer {i}"})


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(form=st.sampled_from(FORMS), turns=turns_st, api=st.sampled_from(["openai", "anthropic"]),
       budget=st.sampled_from([20, 2000]))
def test_pipeline_with_every_pass_on_keeps_meaning(form: str, turns: list[list[str]], api: Api,
                                                   budget: int) -> None:
    """Re-ranked retrievals in the system prompt and in tool results, prune_rag on (over and
    under its budget): the whole pipeline's output keeps the client's meaning on every turn."""
    bodies = []
    for keys in turns:
        calls = [{"id": "c1", "type": "function", "function": {"name": "s", "arguments": "{}"}}]
        msgs: list[dict[str, Any]] = [
            {"role": "system", "content": render(form, keys)},
            {"role": "user", "content": "search"},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "c1", "content": render(form, keys[::-1])}]
        body: dict[str, Any] = {"model": "m", "max_tokens": 5, "messages": msgs}
        if api == "anthropic":
            body = {"model": "m", "max_tokens": 5, "system": msgs[0]["content"], "messages": [
                msgs[1], {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "c1", "name": "s", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1",
                                              "content": msgs[3]["content"]}]}]}
        bodies.append(body)
    on = {"prune_rag": True, "rag_budget_tokens": budget}
    for body, r in zip(bodies, replay(bodies, api, **on)):
        check_meaning(body, r.body, api, settings=ctx(**on).settings)
