"""The passage-order stabiliser pinned point by point (issue 21): :mod:`prefixgate.rewriter.passes.stabilise_passages`.

Source of each rule: its module docstring — seen passages first in first-seen order, new ones
after in the client's order; the Edit counts the passages and retrievals moved and the tokens of
the text they moved in; the memory is ``{"seen": 8 base64 chars per passage}`` in first-seen
order, at most ``MAX_SEEN``, written back even when nothing moved; never moved: assistant turns,
a run of document blocks with citations or a ``cache_control`` marker, a retrieval whose order
carries meaning (it is still remembered, in the client's order). Token counts use ``len`` (one
token per character) so each figure is exact.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from prefixgate.rewriter.passes.stabilise_passages import (
    DIGEST_CHARS,
    MAX_SEEN,
    MEMORY_KEY,
    NAME,
    SeenOrder,
    block_digest,
    digest,
    run,
)
from prefixgate.rewriter.types import Edit
from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.ir import Api
from tests.rewriter.helpers import ctx
from tests.rewriter.test_stabilise_passages import TEXTS, render

TAG = '<document id="{k}">{t}</document>'


def rewrite(body: dict[str, Any], api: Api = "openai", seen: list[str] | None = None
            ) -> tuple[dict[str, Any], Edit]:
    """Run the pass alone on ``body`` with the session's seen passages ``seen`` (digests)."""
    session = {MEMORY_KEY: {"seen": "".join(seen)}} if seen is not None else {}
    c = dataclasses.replace(ctx(session=session), count_tokens=len)
    prompt = wire.parse(body, api)
    out, edits = run(prompt, c)
    assert len(edits) == 1
    return (body if out is prompt else wire.render(out)), edits[0]


def d(k: str) -> str:
    """The digest of passage ``k`` as the tag form renders it."""
    return digest(TAG.format(k=k, t=TEXTS[k]))


def sys_body(*texts: str, user: str = "q") -> dict[str, Any]:
    return {"model": "m", "messages": [*({"role": "system", "content": t} for t in texts),
                                       {"role": "user", "content": user}]}


# ---- digests and the memory ------------------------------------------------------------------

def test_digest_is_8_chars_of_the_whitespace_normalised_text() -> None:
    """The memory's format: sessions written by an earlier version must read the same."""
    assert digest("a b c") == "Dp9kAx_L"  # urlsafe_b64(sha256(b"a b c")[:6])
    assert len(digest("x")) == DIGEST_CHARS
    assert digest("  a\n b\t\tc ") == digest("a b c") != digest("a bc")
    assert digest("\udc80") == digest("\udc80")  # a lone surrogate digests, never raises


def test_a_blocks_digest_ignores_its_cache_marker_and_key_order() -> None:
    a = {"type": "document", "title": "t", "source": {"data": "x"}}
    marked = {"source": {"data": "x"}, "cache_control": {"type": "ephemeral"}, "title": "t", "type": "document"}
    assert block_digest(a) == block_digest(marked) != block_digest({**a, "title": "u"})
    assert block_digest({"type": "document", "title": "é"}) == digest('{"title": "é", "type": "document"}')


def test_the_memory_reads_back_in_first_seen_order_and_anything_malformed_reads_empty() -> None:
    assert SeenOrder.from_memory({"seen": "AAAAAAAABBBBBBBBAAAAAAAA"}).ranks == {"AAAAAAAA": 0, "BBBBBBBB": 1}
    for bad in (None, "x", [], {"seen": 5}, {"seen": "AAAAAAAAB"}, {}):
        assert SeenOrder.from_memory(bad).ranks == {}
    many = "".join(f"{i:08d}" for i in range(MAX_SEEN + 3))
    ranks = SeenOrder.from_memory({"seen": many}).ranks
    assert len(ranks) == MAX_SEEN and ranks[f"{MAX_SEEN - 1:08d}"] == MAX_SEEN - 1 and f"{MAX_SEEN:08d}" not in ranks
    s = SeenOrder({"BBBBBBBB": 1, "AAAAAAAA": 0})
    assert s.memory() == {MEMORY_KEY: {"seen": "AAAAAAAABBBBBBBB"}} and not s.added


def test_order_puts_seen_passages_by_rank_then_new_ones_as_sent() -> None:
    s = SeenOrder({"a": 0, "b": 1, "c": 2})
    assert s.order(["x", "c", "y", "a"]) == [3, 1, 0, 2]  # a (rank 0), c (rank 2), then x, y as sent
    assert s.ranks == {"a": 0, "b": 1, "c": 2, "x": 3, "y": 4} and s.added
    fresh = SeenOrder()
    assert fresh.order(["q", "p"]) == [0, 1] and fresh.ranks == {"q": 0, "p": 1}
    again = SeenOrder({"a": 0, "b": 1})
    assert again.order(["b", "a"]) == [1, 0] and not again.added  # nothing new: nothing to write back


def test_a_group_holding_one_passage_twice_keeps_its_order_and_records_it_once() -> None:
    s = SeenOrder({"a": 0})
    assert s.order(["b", "a", "b"]) == [0, 1, 2]
    assert s.ranks == {"a": 0, "b": 1} and s.added


def test_the_seen_set_stops_growing_at_max_seen() -> None:
    s = SeenOrder({f"{i:08d}": i for i in range(MAX_SEEN - 1)})
    assert s.order(["new-1", "new-2"]) == [0, 1]
    assert s.ranks["new-1"] == MAX_SEEN - 1 and "new-2" not in s.ranks and len(s.ranks) == MAX_SEEN
    full = SeenOrder({f"{i:08d}": i for i in range(MAX_SEEN)})
    full.order(["later"])
    assert "later" not in full.ranks and not full.added


# ---- the pass ----------------------------------------------------------------------------------

def test_the_first_turn_moves_nothing_and_remembers_every_passage_in_order() -> None:
    body = sys_body(render("tag", ["a", "b", "c"]))
    out, e = rewrite(body)
    assert out is body
    assert e == Edit(NAME, False, "messages", "no retrieval out of its first-seen order",
                     memory={MEMORY_KEY: {"seen": d("a") + d("b") + d("c")}})


def test_a_later_turn_is_put_back_in_first_seen_order_with_exact_figures() -> None:
    """Seen a, b, c; sent c, a, d, b -> a, b, c, d: all 4 passages moved, 1 retrieval, the
    system text's tokens before and after (one per char), d remembered after c."""
    text = render("tag", ["c", "a", "d", "b"])
    out, e = rewrite(sys_body(text), seen=[d("a"), d("b"), d("c")])
    assert out["messages"][0]["content"] == render("tag", ["a", "b", "c", "d"])
    assert e == Edit(NAME, True, "system", "4 passage(s) of 1 retrieval(s) put back in first-seen order",
                     len(text), len(text), {MEMORY_KEY: {"seen": d("a") + d("b") + d("c") + d("d")}})


def test_only_passages_that_moved_are_counted_and_nothing_new_writes_no_memory() -> None:
    """Seen a, b, c, d; sent a, c, b, d -> a, b, c, d: b and c moved (2), a and d did not."""
    text = render("tag", ["a", "c", "b", "d"])
    out, e = rewrite(sys_body(text), seen=[d(k) for k in "abcd"])
    assert out["messages"][0]["content"] == render("tag", list("abcd"))
    assert (e.applied, e.detail, e.memory) == (True, "2 passage(s) of 1 retrieval(s) put back in first-seen order", {})


def test_retrievals_in_system_and_messages_are_each_counted() -> None:
    """A system retrieval and a user one, both out of order: 2 retrievals, region
    system+messages, the tokens of both texts."""
    s_text, u_text = render("tag", ["b", "a"]), render("tag", ["d", "c"])
    out, e = rewrite(sys_body(s_text, user=u_text), seen=[d(k) for k in "abcd"])
    assert out["messages"][0]["content"] == render("tag", ["a", "b"])
    assert out["messages"][1]["content"] == render("tag", ["c", "d"])
    assert (e.region, e.detail) == ("system+messages", "4 passage(s) of 2 retrieval(s) put back in first-seen order")
    assert (e.tokens_before, e.tokens_after) == (len(s_text) + len(u_text),) * 2


def test_a_developer_message_is_read_as_system_text_in_the_messages_region() -> None:
    text = render("tag", ["b", "a"])
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}, {"role": "developer", "content": text}]}
    out, e = rewrite(body, seen=[d("a"), d("b")])
    assert out["messages"][1]["content"] == render("tag", ["a", "b"])
    assert (e.applied, e.region) == (True, "messages")


def test_assistant_turns_are_never_moved_nor_remembered() -> None:
    text = render("tag", ["b", "a"])
    body = {"model": "m", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": text},
                                       {"role": "user", "content": "and?"}]}
    out, e = rewrite(body, seen=[d("a"), d("b")])
    assert out is body and (e.applied, e.memory) == (False, {})


def test_a_retrieval_whose_order_means_something_is_kept_yet_remembered() -> None:
    """Ranked results go out as sent; the Edit says why; their new passages are still
    remembered, in the client's order (so a later unranked copy follows it)."""
    text = "Results ranked by relevance, most relevant first.\n" + render("tag", ["c", "b", "a"])
    out, e = rewrite(sys_body(text), seen=[d("a")])
    assert out["messages"][0]["content"] == text
    assert e.detail == ("no retrieval out of its first-seen order; 1 retrieval(s) left in the client's order: "
                        "the text around it gives the order a meaning ('ranked')")
    assert (e.applied, e.memory) == (False, {MEMORY_KEY: {"seen": d("a") + d("c") + d("b")}})
    plain = render("tag", ["b", "a"])
    moved, e2 = rewrite(sys_body(plain, user=text), seen=[d("a"), d("c")])
    assert moved["messages"][0]["content"] == render("tag", ["a", "b"])
    assert moved["messages"][1]["content"] == text
    assert e2.detail == ("2 passage(s) of 1 retrieval(s) put back in first-seen order; 1 retrieval(s) left "
                         "in the client's order: the text around it gives the order a meaning ('ranked')")


def test_one_reason_is_said_once_however_many_retrievals_it_kept() -> None:
    text = "Results ranked by relevance.\n" + render("tag", ["b", "a"])
    _, e = rewrite(sys_body(text, user=text), seen=[d("a"), d("b")])
    assert e.detail.count("'ranked'") == 1 and "2 retrieval(s) left in the client's order" in e.detail


# ---- Anthropic document / search_result runs and tool results --------------------------------

def doc(k: str, **extra: Any) -> dict[str, Any]:
    return {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": TEXTS[k]},
            "title": k, **extra}


def user_blocks(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": list(blocks)}]}


def titles(body: dict[str, Any], i: int = 0) -> list[Any]:
    return [b.get("title") for b in body["messages"][i]["content"]]


def test_a_run_of_document_blocks_is_reordered_and_counted() -> None:
    seen = [block_digest(doc(k)) for k in "ab"]
    body = user_blocks(doc("c"), doc("b"), doc("a"), {"type": "text", "text": "Summarise."})
    out, e = rewrite(body, "anthropic", seen)
    assert titles(out) == ["a", "b", "c", None]
    # c, b, a -> a, b, c: b stays second, a and c moved
    assert (e.applied, e.region, e.detail) == (True, "messages", "2 passage(s) of 1 retrieval(s) put back in first-seen order")
    assert e.memory == {MEMORY_KEY: {"seen": "".join(seen) + block_digest(doc("c"))}}


def test_search_results_runs_are_separate_and_a_lone_block_is_not_a_run() -> None:
    def sr(k: str) -> dict[str, Any]:
        return {"type": "search_result", "source": k, "title": k, "content": [{"type": "text", "text": TEXTS[k]}]}

    seen = [block_digest(sr(k)) for k in "abcd"]
    body = user_blocks(sr("b"), sr("a"), {"type": "text", "text": "and"}, sr("d"), sr("c"),
                       {"type": "text", "text": "also"}, sr("e"))
    out, e = rewrite(body, "anthropic", seen)
    assert titles(out) == ["a", "b", None, "c", "d", None, "e"]
    assert e.detail == "4 passage(s) of 2 retrieval(s) put back in first-seen order"
    assert e.memory == {}  # the lone block is not a retrieval: nothing new to remember


def test_a_run_with_a_cache_marker_or_citations_is_never_moved() -> None:
    """The client marked where its cache ends (or responses cite by position): a moved block
    would move that prefix."""
    seen = [block_digest(doc(k)) for k in "ab"]
    for extra in ({"cache_control": {"type": "ephemeral"}}, {"citations": {"enabled": True}}):
        body = user_blocks(doc("b"), doc("a", **extra), {"type": "text", "text": "Summarise."})
        out, e = rewrite(body, "anthropic", seen)
        assert titles(out) == ["b", "a", None] and not e.applied and e.memory == {}


def test_a_run_whose_order_means_something_is_kept_with_its_reason() -> None:
    ranked = {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                              "data": "rank: 1 the best match"}, "title": "r1"}
    second = {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                              "data": "rank: 2 the next match"}, "title": "r2"}
    seen = [block_digest(second), block_digest(ranked)]
    out, e = rewrite(user_blocks(ranked, second), "anthropic", seen)
    assert titles(out) == ["r1", "r2"] and not e.applied
    assert e.detail.endswith("1 retrieval(s) left in the client's order: the passages carry ranks or scores")
    seen = [block_digest(doc(k)) for k in "ab"]
    told = {**user_blocks(doc("b"), doc("a")), "system": "Use the top 5 hits."}
    out, e = rewrite(told, "anthropic", seen)
    assert titles(out) == ["b", "a"] and not e.applied
    assert e.detail.endswith("the instructions gives the order a meaning ('top 5')")


def tool_body(content: Any) -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": 10, "messages": [
        {"role": "user", "content": "search"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "s", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": content}]}]}


def test_a_tool_results_text_and_its_document_run_are_reordered() -> None:
    text = render("tag", ["b", "a"])
    out, e = rewrite(tool_body(text), "anthropic", [d("a"), d("b")])
    assert out["messages"][2]["content"][0]["content"] == render("tag", ["a", "b"])
    assert (e.applied, e.region, e.tokens_before) == (True, "messages", len(text))
    items = [{"type": "text", "text": text}, {"type": "image", "source": {"type": "url", "url": "u"}}]
    out, e = rewrite(tool_body(items), "anthropic", [d("a"), d("b")])
    got = out["messages"][2]["content"][0]["content"]
    assert got[0] == {"type": "text", "text": render("tag", ["a", "b"])} and got[1] == items[1]
    run_ = [doc("b"), doc("a"), "not a block"]
    out, e = rewrite(tool_body(run_), "anthropic", [block_digest(doc("a")), block_digest(doc("b"))])
    assert [b.get("title") if isinstance(b, dict) else b for b in out["messages"][2]["content"][0]["content"]] \
        == ["a", "b", "not a block"]
    assert e.detail == "2 passage(s) of 1 retrieval(s) put back in first-seen order"


def test_a_tool_result_in_order_or_without_text_is_left_as_it_is() -> None:
    for content in (render("tag", ["a", "b"]), [{"type": "text", "text": render("tag", ["a", "b"])}], None):
        body = tool_body(content)
        out, e = rewrite(body, "anthropic", [d("a"), d("b")])
        assert out is body and not e.applied


def test_a_system_retrievals_own_words_are_not_read_as_the_instructions() -> None:
    """A passage that says "ranked" is content, not an instruction about the order."""
    def text(keys: str) -> str:
        body = {"a": "alpha passage about teams ranked in the league", "b": "beta passage about the weather"}
        return ("Retrieved documents:\n" + "\n".join(TAG.format(k=k, t=body[k]) for k in keys)
                + "\n\nAnswer from these only.")

    first = [digest(TAG.format(k="a", t="alpha passage about teams ranked in the league")),
             digest(TAG.format(k="b", t="beta passage about the weather"))]
    out, e = rewrite(sys_body(text("ba")), seen=first)
    assert out["messages"][0]["content"] == text("ab") and e.applied


def _retrieval(texts: dict[str, str], keys: str, before: str = "Retrieved documents:\n",
               after: str = "\n\nAnswer from these only.") -> str:
    return before + "\n".join(TAG.format(k=k, t=texts[k]) for k in keys) + after


RANKED = {"x": "xray passage about teams ranked in the league", "y": "yankee passage about the weather",
          "z": "zulu passage about players ranked by goals"}


def test_none_of_a_system_retrievals_passages_is_read_as_its_surroundings_or_instructions() -> None:
    """Three passages, the first and the last saying "ranked": their words are the passages'
    content; only the text around the whole retrieval (and the rest of the system text) counts."""
    seen = [digest(TAG.format(k=k, t=RANKED[k])) for k in "xyz"]
    out, e = rewrite(sys_body(_retrieval(RANKED, "zyx")), seen=seen)
    assert out["messages"][0]["content"] == _retrieval(RANKED, "xyz") and e.applied


def test_the_system_text_is_the_instructions_of_a_retrieval_elsewhere() -> None:
    """The system prompt says "ranked" (inside its own retrieval): a user message's retrieval is
    read against the whole system text, so it is kept; the system's own is read without itself."""
    seen = [digest(TAG.format(k=k, t=RANKED[k])) for k in "xyz"]
    text = _retrieval(RANKED, "zyx")
    out, e = rewrite(sys_body(text, user=text), seen=seen)
    assert out["messages"][0]["content"] == _retrieval(RANKED, "xyz")
    assert out["messages"][1]["content"] == text
    assert "1 retrieval(s) left in the client's order: the instructions gives the order a meaning ('ranked')" in e.detail


def test_a_retrieval_sent_twice_in_the_system_text_reads_its_other_copy_as_instructions() -> None:
    seen = [digest(TAG.format(k=k, t=RANKED[k])) for k in "xyz"]
    text = _retrieval(RANKED, "zyx")
    out, e = rewrite(sys_body(text, text), seen=seen)
    assert [m["content"] for m in out["messages"][:2]] == [text, text] and not e.applied
    assert "2 retrieval(s) left in the client's order" in e.detail


def test_the_system_text_around_a_retrieval_is_read_joined() -> None:
    """ "Listed by <retrieval> relevance.": without the retrieval the system text says "by
    relevance" — an instruction about the order, so the retrieval is kept."""
    seen = [d("a"), d("b")]
    text = "Listed by " + "\n".join(TAG.format(k=k, t=TEXTS[k]) for k in "ba") + "relevance."
    out, e = rewrite(sys_body(text), seen=seen)
    assert out["messages"][0]["content"] == text
    assert e.detail.endswith("the instructions gives the order a meaning ('by relevance')")


RESULTS = {k: f"{k} result about topic {k} with words {k}{k}" for k in "ab"}


def _results(keys: str) -> str:
    """Unlabelled ``<result>`` elements: passages only where every tag counts (a tool result)."""
    return "\n".join(f"<result>{RESULTS[k]}</result>" for k in keys)


def test_a_tool_results_generic_tags_are_passages_there_only() -> None:
    """``<result>`` elements are passages in a tool result (retrieved by construction), as a
    string or a text item, never in a user's own message; the region is the messages'."""
    seen = [digest(f"<result>{RESULTS[k]}</result>") for k in "ab"]
    out, e = rewrite(tool_body(_results("ba")), "anthropic", seen)
    assert out["messages"][2]["content"][0]["content"] == _results("ab")
    assert (e.applied, e.region) == (True, "messages")
    out, e = rewrite(tool_body([{"type": "text", "text": _results("ba")}]), "anthropic", seen)
    assert out["messages"][2]["content"][0]["content"] == [{"type": "text", "text": _results("ab")}]
    assert (e.applied, e.region) == (True, "messages")
    user = {"model": "m", "messages": [{"role": "user", "content": _results("ba")}]}
    out, e = rewrite(user, seen=seen)
    assert out is user and not e.applied


def test_a_tool_results_document_run_is_in_the_messages_region() -> None:
    out, e = rewrite(tool_body([doc("b"), doc("a")]), "anthropic", [block_digest(doc(k)) for k in "ab"])
    assert [b["title"] for b in out["messages"][2]["content"][0]["content"]] == ["a", "b"]
    assert (e.applied, e.region) == (True, "messages")


def test_a_run_holding_a_pdf_document_is_still_put_in_order() -> None:
    """A base64 PDF's text is unknown (nothing to read an order from): the run moves by digest."""
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0x"},
           "title": "p"}
    seen = [block_digest(doc("a")), block_digest(pdf)]
    out, e = rewrite(user_blocks(pdf, doc("a")), "anthropic", seen)
    assert titles(out) == ["a", "p"] and e.applied


@pytest.mark.parametrize("where", ["second system block", "system message", "developer message"])
def test_every_piece_of_system_text_is_read_as_instructions(where: str) -> None:
    """The instructions are every system text block and every system / developer message, each
    on its own line (a block that starts "Ranked." says so)."""
    retrieval = render("tag", ["b", "a"])
    if where == "second system block":
        body: dict[str, Any] = {"model": "claude-x", "max_tokens": 10,
                                "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Ranked."}],
                                "messages": [{"role": "user", "content": retrieval}]}
        api: Api = "anthropic"
    else:
        role = "system" if where == "system message" else "developer"
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"},
                                           {"role": role, "content": "Ranked."},
                                           {"role": "user", "content": retrieval}]}
        api = "openai"
    out, e = rewrite(body, api, [d("a"), d("b")])
    assert out is body and not e.applied
    assert e.detail.endswith("the instructions gives the order a meaning ('Ranked')")


def test_each_different_reason_is_said_once_in_the_client_order() -> None:
    ranked_run = [{"type": "document", "title": f"r{i}",
                   "source": {"type": "text", "media_type": "text/plain", "data": f"rank: {i} match {i}"}}
                  for i in (2, 1)]
    text = "Results ranked by relevance:\n" + "\n".join(TAG.format(k=k, t=TEXTS[k]) for k in "ba")
    body = user_blocks({"type": "text", "text": text}, *ranked_run)
    seen = [d("a"), d("b"), *(block_digest(b) for b in reversed(ranked_run))]
    out, e = rewrite(body, "anthropic", seen)
    assert out is body and not e.applied
    assert e.detail == ("no retrieval out of its first-seen order; 2 retrieval(s) left in the client's order: "
                        "the text around it gives the order a meaning ('ranked'); "
                        "the passages carry ranks or scores")


def test_an_openai_tool_message_is_a_tool_result() -> None:
    """A ``tool`` role message: tool-only tags count, region messages."""
    seen = [digest(f"<result>{RESULTS[k]}</result>") for k in "ab"]
    body = {"model": "m", "messages": [
        {"role": "user", "content": "search"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "s", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": _results("ba")}]}
    out, e = rewrite(body, seen=seen)
    assert out["messages"][2]["content"] == _results("ab")
    assert (e.applied, e.region) == (True, "messages")


@pytest.mark.parametrize("role", ["system", "developer"])
def test_a_system_message_mid_conversation_is_system_text(role: str) -> None:
    """Its retrieval is put in order (read without itself: its passages' own "ranked" is content),
    in the messages region."""
    seen = [digest(TAG.format(k=k, t=RANKED[k])) for k in "xyz"]
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"},
                                       {"role": role, "content": _retrieval(RANKED, "zyx")},
                                       {"role": "user", "content": "and?"}]}
    out, e = rewrite(body, seen=seen)
    assert out["messages"][2]["content"] == _retrieval(RANKED, "xyz")
    assert (e.applied, e.region) == (True, "messages")
