"""Rewriting through the proxy with the real pipeline (cases B03, B04), the opt-out header,
lossless forwarding and session memory."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from prefixgate.proxy.pipeline.rewrite import default_rewrite_fn, session_id_for
from tests.proxy.upstream import Script, completion

RULES = "Follow the airline policy. Be brief. Verify the user id first. " * 40


def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


def rewriting_rig(rig_factory: Any, **rewrite: Any) -> Any:
    """A proxy with the real pipeline; ``rewrite``: the policy's ``rewrite`` switches (none:
    the defaults)."""
    fn = default_rewrite_fn()
    assert fn is not None, "rewriter.pipeline must be importable"
    rig = rig_factory(rewrite_fn=fn, **({"rewrite": rewrite} if rewrite else {}))
    rig.upstream.script = Script(body=completion())
    return rig


@pytest.fixture
def rewriting(rig_factory: Any) -> Any:
    return rewriting_rig(rig_factory)


def turns() -> list[dict[str, Any]]:
    return [
        {"model": "m", "messages": [
            {"role": "system", "content": f"You are Helper. Now: 2025-03-04 10:15. {RULES}"},
            {"role": "user", "content": "Q1"}]},
        {"model": "m", "messages": [
            {"role": "system", "content": f"You are Helper. Now: 2025-03-04 10:16. {RULES}"},
            {"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
            {"role": "user", "content": "Q2"}]},
    ]


def test_b03_timestamp_is_hoisted_so_the_upstream_prefix_is_byte_stable(rig_factory: Any) -> None:
    """The clock moves once it is seen changing (turn 2); from then on the system prompt the
    upstream receives is byte-stable (issue 19, item 2). Hoisting is opt-in
    (``MOVES_THE_MODEL_READS``): the route turns it on."""
    rewriting = rewriting_rig(rig_factory, hoist_volatile=True)
    h = {"x-prefixgate-session": "b03"}
    third = json.loads(json.dumps(turns()[1]).replace("10:16", "10:17"))
    r1, r2, r3 = (post(rewriting.url, t, h) for t in [*turns(), third])
    assert "hoist_volatile" not in r1.headers["x-prefixgate-edits"]  # not yet seen changing
    assert "hoist_volatile" in r2.headers["x-prefixgate-edits"]
    assert "hoist_volatile" in r3.headers["x-prefixgate-edits"]
    s1, s2, s3 = (s.json for s in rewriting.upstream.seen)
    assert s2["messages"][0] == s3["messages"][0]  # system byte-stable across the minute
    assert "2025-03-04 10:17" in str(s3["messages"][-1]["content"])  # the information kept
    assert "10:16" not in str(s3) and "10:15" in str(s1)


def test_b03_with_the_opt_out_header_the_body_is_forwarded_unchanged(rewriting: Any) -> None:
    h = {"x-prefixgate-rewrite": "off"}
    bodies = turns()
    for b in bodies:
        r = post(rewriting.url, b, h)
        assert r.headers["x-prefixgate-edits"] == "off"
    assert [s.json for s in rewriting.upstream.seen] == bodies
    assert [r["rewrite"] for r in rewriting.ledger.rows()] == [0, 0]


FS = {"type": "function", "function": {"name": "fs_read_tree", "parameters": {
    "type": "object", "properties": {}}}}
GH = {"type": "function", "function": {"name": "gh_search", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}}}}


def test_b04_swapped_tool_order_gives_the_same_upstream_tools_block(rig_factory: Any) -> None:
    """``tool_order: "name"`` (opt-in): every request's tools sorted by name."""
    rewriting = rewriting_rig(rig_factory, tool_order="name")
    msgs = [{"role": "user", "content": "list repo"}]
    post(rewriting.url, {"model": "m", "tools": [GH, FS], "messages": msgs})
    post(rewriting.url, {"model": "m", "tools": [FS, GH], "messages": msgs})
    a, b = rewriting.upstream.seen
    assert [t["function"]["name"] for t in a.json["tools"]] == ["fs_read_tree", "gh_search"]
    # the clients' bodies differ only in tool order: the bytes sent upstream are identical
    assert a.raw == b.raw


def test_b04_by_default_the_first_tools_go_as_sent_and_a_swap_gets_their_bytes_back(
        rewriting: Any) -> None:
    """The default ``tool_order: "first_seen"``: the session's first request keeps its tools as
    sent (order and key order); a later one with the same tools swapped and re-keyed goes
    upstream with the first one's bytes, through the proxy's session memory."""
    h = {"x-prefixgate-session": "b04"}
    msgs = [{"role": "user", "content": "list repo"}]
    first = {"model": "m", "tools": [GH, FS], "messages": msgs}
    gh_rekeyed = {"function": {"parameters": {"properties": {"q": {"type": "string"}},
                                              "type": "object"}, "name": "gh_search"},
                  "type": "function"}
    post(rewriting.url, first, h)
    post(rewriting.url, {"model": "m", "tools": [FS, gh_rekeyed], "messages": msgs}, h)
    a, b = rewriting.upstream.seen
    assert json.dumps(a.json["tools"]) == json.dumps(first["tools"])  # as sent, key order too
    tools_bytes = json.dumps(a.json["tools"])
    assert json.dumps(b.json["tools"]) == tools_bytes


def test_no_pass_applies_then_the_original_bytes_go_upstream(rig_factory: Any) -> None:
    rig = rig_factory(rewrite_fn=default_rewrite_fn())
    rig.upstream.script = Script(body=completion())
    raw = (b'{"zeta": 1, "model": "m", "messages": [{"role": "user", "content": "plain"}],'
           b' "alpha": {"b": 2, "a": 1}, "temperature": 0.50}')
    r = httpx.post(rig.url + "/v1/chat/completions", content=raw, timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 200
    assert rig.upstream.seen[-1].raw == raw


def test_non_stream_response_carries_edits_and_cached_tokens_headers(rewriting: Any) -> None:
    r = post(rewriting.url, turns()[0])
    assert r.headers["x-prefixgate-cached-tokens"] == "4"
    assert r.headers["x-prefixgate-tokens-pruned"] == "0"
    assert r.json() == completion()


def test_pipeline_failure_fails_open(rig_factory: Any) -> None:
    def broken(body: Any, api: str, ctx: Any) -> Any:
        raise RuntimeError("boom")

    rig = rig_factory(rewrite_fn=broken)
    rig.upstream.script = Script(body=completion())
    body = turns()[0]
    r = post(rig.url, body)
    assert r.status_code == 200 and r.headers["x-prefixgate-edits"] == "rewrite_failed"
    assert rig.upstream.seen[-1].json == body


def test_session_memory_from_edits_is_merged_and_read_back(rig_factory: Any) -> None:
    from prefixgate.rewriter.types import Edit, RewriteResult

    views: list[dict[str, Any]] = []

    def remembering(body: Any, api: str, ctx: Any) -> RewriteResult:
        views.append(dict(ctx.session))
        n = ctx.session.get("n", 0)
        return RewriteResult(body, [Edit("count", False, "params", "x", memory={"n": n + 1})])

    # the meaning guard's background trials run the rewrite function too (issue 36): off here
    rig = rig_factory(rewrite_fn=remembering, meaning_guard={"enabled": False})
    rig.upstream.script = Script(body=completion())
    for _ in range(3):
        post(rig.url, turns()[0], {"x-prefixgate-session": "s1"})
    post(rig.url, turns()[0], {"x-prefixgate-session": "s2"})
    assert views == [{}, {"n": 1}, {"n": 2}, {}]


def test_session_id_is_stable_per_conversation_and_differs_across_keys() -> None:
    t1, t2 = turns()
    h = {"authorization": "Bearer k1"}
    assert session_id_for(h, t1) == session_id_for(h, t2)  # only the clock differs
    other = {**t2, "messages": [{"role": "system", "content": "Another agent"}]
             + t2["messages"][1:]}
    assert session_id_for(h, t1) != session_id_for(h, other)
    assert session_id_for({"authorization": "Bearer k2"}, t1) != session_id_for(h, t1)
    assert session_id_for({"x-prefixgate-session": "abc"}, t1) == "abc"


def test_policy_with_rewriting_disabled_forwards_the_exact_bytes(rig_factory: Any) -> None:
    rig = rig_factory(rewrite_fn=default_rewrite_fn(), rewrite={"enabled": False})
    rig.upstream.script = Script(body=completion())
    body = turns()[1] | {"tools": [{"type": "function", "function": {"name": "z"}},
                                   {"type": "function", "function": {"name": "a"}}]}
    raw = httpx.Request("POST", "http://x", json=body).content
    r = httpx.post(rig.url + "/v1/chat/completions", content=raw, timeout=30,
                   headers={"content-type": "application/json"})
    assert r.headers["x-prefixgate-edits"] == "off"
    assert rig.upstream.seen[-1].raw == raw


def test_b02_block_list_system_with_cache_control_same_on_stream_and_non_stream(
        rig_factory: Any) -> None:
    rig = rig_factory(rewrite_fn=default_rewrite_fn())
    msg = {"id": "msg_1", "type": "message", "role": "assistant", "content": [],
           "usage": {"input_tokens": 1, "output_tokens": 1}}
    rig.upstream.script = Script(body=msg)
    body = {"model": "claude-x", "max_tokens": 32,
            "system": [{"type": "text", "text": RULES, "cache_control": {"type": "ephemeral"}},
                       {"type": "text", "text": "short session note"}],
            "messages": [{"role": "user", "content": "Hello"}]}
    for stream in (True, False, True, False):
        if stream:
            stop = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
            rig.upstream.script = Script(pieces=[stop])
        else:
            rig.upstream.script = Script(body=msg)
        httpx.post(rig.url + "/v1/messages", json={**body, "stream": stream}, timeout=30,
                   headers={"x-api-key": "sk-proxy-k", "x-prefixgate-session": "b02"})
    sent = [s.json for s in rig.upstream.seen]
    for s in sent:
        assert isinstance(s["system"], list) and len(s["system"]) == 2
        assert s["system"][0]["cache_control"]["type"] == "ephemeral"
        assert s["system"][0]["text"] == RULES
    without_stream = [{k: v for k, v in s.items() if k != "stream"} for s in sent]
    assert without_stream[0] == without_stream[1] == without_stream[2] == without_stream[3]
