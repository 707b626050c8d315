"""KNOWN_DEFECTS: the defect classes the fuzzer finds in the current code, allowed for now.

Each entry names the violation kinds it covers, on which paths (client API -> backend API), a
regex on the violation's detail when the kind alone is too broad, the issue-8 class, and a
minimal reproducer (client API, model, raw JSON body). The differential fuzz test
(``test_differential.py``) fails on any violation no entry covers; ``test_known_defects.py``
fails for an entry whose reproducer no longer reproduces — remove the entry in the change that
fixes it, and the fuzzer becomes strict for that class. Empty list = every invariant enforced.

Models: ``gpt-fuzz`` routes to an OpenAI-compatible backend, ``claude-fuzz`` to an Anthropic
backend (see :mod:`tests.fuzz.harness`), so ``("anthropic", "gpt-fuzz")`` is the A->O bridge and
``("openai", "claude-fuzz")`` the O->A bridge.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from tests.fuzz.meaning import Violation

O2A, A2O = "openai->anthropic", "anthropic->openai"
SAME = ("openai->openai", "anthropic->anthropic")


@dataclass(frozen=True)
class KnownDefect:
    """One allowed defect class (see module docstring). ``raw`` is the reproducer's body."""

    id: str
    issue_class: int
    summary: str
    kinds: tuple[str, ...]
    paths: tuple[str, ...]
    api: str
    model: str
    raw: str
    detail: str = ""
    body: str = ""  # regex the client's raw body must match (the defect's trigger), if any
    headers: tuple[tuple[str, bytes], ...] = ()  # request headers of the reproducer

    def covers(self, path: str, v: Violation, raw: bytes = b"") -> bool:
        """Whether this entry allows violation ``v`` seen on ``path`` for client body ``raw``."""
        return (v.kind in self.kinds and (not self.paths or path in self.paths)
                and (not self.detail or re.search(self.detail, v.detail) is not None)
                and (not self.body or re.search(self.body.encode(), raw) is not None))


def _turns(n: int, words: int) -> list[dict[str, str]]:
    """A long chat: the task first, then ``n`` long user/assistant turns (history pruning)."""
    filler = " ".join(["the refund policy covers flights booked online"] * (words // 7))
    msgs = [{"role": "user", "content": "TASK: audit invoice 7 against the contract."}]
    for i in range(n):
        msgs += [{"role": "assistant", "content": f"step {i}: {filler}"},
                 {"role": "user", "content": f"continue {i}: {filler}"}]
    return msgs


_BIG_CALL = ('{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":'
             '{"name":"get_order","arguments":"{\\"order_id\\":123456789012345678901234567890}"}}]}')
_TOOLS14 = [{"name": n, "description": f"{n.replace('_', ' ')} records", "input_schema": {"type": "object"}}
            for v in ("get", "list") for n in (f"{v}_weather", f"{v}_order", f"{v}_user", f"{v}_flight",
                                               f"{v}_invoice", f"{v}_file", f"{v}_repo")]


def _nested_markers() -> dict[str, object]:
    """Four client cache_control markers (a tool, a text nested in tool_result, two user
    texts) and a system prompt long enough for place_breakpoints to add its own."""
    cc = {"type": "ephemeral"}
    return {"model": "claude-fuzz", "max_tokens": 64,
            "system": " ".join(["the refund policy covers flights booked online by the customer"] * 200),
            "tools": [{"name": "get_order", "input_schema": {"type": "object"}, "cache_control": cc}],
            "messages": [
                {"role": "user", "content": "where is order 1?"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_order",
                                                   "input": {"id": 1}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
                    {"type": "text", "text": "order 1 shipped", "cache_control": cc}]}]},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": [{"type": "text", "text": "a", "cache_control": cc},
                                             {"type": "text", "text": "b", "cache_control": cc}]}]}


KNOWN_DEFECTS: tuple[KnownDefect, ...] = (
    KnownDefect(
        "o2a_bigint_500", 5, "O->A bridge: an integer beyond 64 bits in tool-call arguments is a 500 "
        "(orjson cannot serialise the translated body)",
        ("status_5xx",), (O2A,), "openai", "claude-fuzz",
        '{"model":"claude-fuzz","messages":[{"role":"user","content":"find it"},' + _BIG_CALL +
        ',{"role":"tool","tool_call_id":"c1","content":"ok"}]}', detail="TypeError", body=r"\d{20}"),
    KnownDefect(
        "o2a_stream_options_500", 1, "O->A bridge: a streamed request with a non-object "
        "stream_options is a 500 (AttributeError after the upstream request was sent) and "
        "writes no ledger row",
        ("status_5xx", "ledger_mismatch"), (O2A,), "openai", "claude-fuzz",
        '{"model":"claude-fuzz","stream":true,"stream_options":"yes","messages":[{"role":"user","content":"hi"}]}',
        detail="AttributeError"),
    KnownDefect(
        "o2a_nesting_over_255_500", 6, "O->A bridge: tool-call arguments nested deeper than 255 "
        "are a 500 (orjson's depth limit when serialising the translated body)",
        ("status_5xx",), (O2A,), "openai", "claude-fuzz",
        '{"model":"claude-fuzz","messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,'
        '"tool_calls":[{"id":"c3","type":"function","function":{"name":"f","arguments":"{\\"a\\":'
        + "[" * 300 + "1" + "]" * 300 + '}"}}]},{"role":"tool","tool_call_id":"c3","content":"ok"}]}',
        detail="TypeError", body=r"\[{256}"),
    KnownDefect(
        "nesting_near_1000_500", 6, "a body nested ~1000 deep (under orjson's 1024 parse limit) is a "
        "500 RecursionError in the rewriter instead of a 400",
        ("status_5xx", "ledger_mismatch"), (), "openai", "gpt-fuzz",
        '{"model":"gpt-fuzz","messages":[{"role":"system","content":"Current time: 2026-12-01T05:00:00Z"},'
        '{"role":"user","content":"x"}],"x_deep":' + "[" * 1000 + "1" + "]" * 1000 + "}",
        detail="RecursionError"),
    KnownDefect(
        "non_ascii_header_500", 6, "a non-ASCII byte in a forwarded header (User-Agent, "
        "x-stainless-*, anthropic-beta, x-request-id) is a 500 and the request is never sent",
        ("status_5xx",), (), "openai", "gpt-fuzz",
        '{"model":"gpt-fuzz","messages":[{"role":"user","content":"hi"}]}',
        detail="UnicodeEncodeError", headers=(("user-agent", "fuzz-agent/1.0 (caf\u00e9)".encode()),)),
    KnownDefect(
        "a2o_answer_bigint_502", 5, "A->O bridge: an upstream tool call whose arguments hold an "
        "integer beyond 64 bits is answered 502 'unreadable answer' (orjson cannot serialise the "
        "translated answer), and the ledger records http_status 200 for it (class 7)",
        ("status_5xx", "ledger_mismatch"), (A2O,), "anthropic", "gpt-fuzz",
        '{"model":"gpt-fuzz","max_tokens":64,"messages":[{"role":"user","content":"find order 7"}],'
        '"tools":[{"name":"get_order","input_schema":{"type":"object"}}]}', detail="unreadable answer"),
    KnownDefect(
        "o2a_answer_numbers_change_text", 5, "O->A bridge: numbers in the backend's tool-call input "
        "reach the client re-serialised (1.10 -> 1.1, 123456789012345678901234567890 -> 1.2345...e+29)",
        ("answer_number_text_changed",), (O2A,), "openai", "claude-fuzz",
        '{"model":"claude-fuzz","messages":[{"role":"user","content":"find order 7"}],"tools":[{"type":'
        '"function","function":{"name":"get_order","parameters":{"type":"object"}}}]}'),
    KnownDefect(
        "reserialised_numbers_change_text", 5, "a re-serialised body (any pass applied, or a bridge) "
        "changes number text: 0.70 -> 0.7, 465.70 -> 465.7, 10**29 -> 1e+29 (also inside tool "
        "inputs and tool schemas)",
        ("number_text_changed", "call_number_text_changed"), (), "openai", "gpt-fuzz",
        '{"model":"gpt-fuzz","temperature":0.70,"messages":[{"role":"system","content":'
        '"Current time: 2026-12-01T05:00:00Z\\nYou are terse."},{"role":"user","content":"hi"}]}'),
    KnownDefect(
        "hoist_below_min_cacheable", 8, "hoist_volatile adds a note to a prompt far below the "
        "backend's minimum cacheable length (1024 tokens for Anthropic / OpenAI): it costs tokens "
        "and cannot make anything reusable",
        ("pass_below_min_cacheable",), (), "anthropic", "claude-fuzz",
        '{"model":"claude-fuzz","max_tokens":64,"system":"Current time: 2026-12-01T05:00:00Z\\nYou are '
        'terse.","messages":[{"role":"user","content":"hi"}]}'),
    KnownDefect(
        "history_drops_first_user_turn", 3, "prune_history compaction drops the first user turn "
        "(the task) with the other old turns",
        ("first_user_turn_lost",), (), "openai", "gpt-fuzz",
        json.dumps({"model": "gpt-fuzz", "messages": _turns(6, 120)})),
    KnownDefect(
        "a2o_glues_text_blocks", 5, "A->O bridge: consecutive text blocks (user, assistant, system, "
        "tool_result) are joined with no separator: '1. buy milk' + '2. call mom' -> "
        "'1. buy milk2. call mom'",
        ("glued_blocks",), (A2O,), "anthropic", "gpt-fuzz",
        '{"model":"gpt-fuzz","max_tokens":64,"messages":[{"role":"user","content":[{"type":"text",'
        '"text":"1. buy milk"},{"type":"text","text":"2. call mom"}]}]}'),
    KnownDefect(
        "a2o_drops_documents", 5, "A->O bridge: document and search_result blocks are dropped "
        "(their text never reaches the backend)",
        ("text_missing_or_moved", "media_missing"), (A2O,), "anthropic", "gpt-fuzz",
        '{"model":"gpt-fuzz","max_tokens":64,"messages":[{"role":"user","content":[{"type":"document",'
        '"source":{"type":"text","media_type":"text/plain","data":"Contract v1: pay within 10 days"}},'
        '{"type":"text","text":"Summarize the contract."}]}]}', detail=r"\(doc\)|media"),
    KnownDefect(
        "a2o_drops_unmodelled_blocks", 5, "A->O bridge: blocks it does not model are dropped "
        "silently instead of carried or refused: images inside tool_result or system, thinking, "
        "server_tool_use / web_search_tool_result, unknown block types, tool_result in an "
        "assistant turn",
        ("media_missing", "thinking_missing", "opaque_missing", "call_missing", "result_missing",
         "text_missing_or_moved"), (A2O,), "anthropic", "gpt-fuzz",
        '{"model":"gpt-fuzz","max_tokens":64,"messages":[{"role":"user","content":"go"},'
        '{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"chart","input":{}}]},'
        '{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text",'
        '"text":"chart:"},{"type":"image","source":{"type":"base64","media_type":"image/png",'
        '"data":"iVBORw0KGgo="}}]}]}],"tools":[{"name":"chart","input_schema":{"type":"object"}}]}'),
    KnownDefect(
        "o2a_moves_mid_system_to_top", 5, "O->A bridge: a system message in mid-conversation is "
        "moved into the top-level system prompt (its place in the conversation is lost)",
        ("text_missing_or_moved",), (O2A,), "openai", "claude-fuzz",
        '{"model":"claude-fuzz","messages":[{"role":"user","content":"hi"},{"role":"assistant",'
        '"content":"hello"},{"role":"system","content":"From now on answer in French."},'
        '{"role":"user","content":"bye"}]}', detail="^system message"),
    KnownDefect(
        "o2a_drops_parts_and_roles", 5, "O->A bridge: input_audio and file parts, function-role "
        "messages and unknown parts are dropped silently",
        ("media_missing", "result_missing", "opaque_missing", "text_missing_or_moved"), (O2A,),
        "openai", "claude-fuzz",
        '{"model":"claude-fuzz","messages":[{"role":"user","content":[{"type":"text","text":"transcribe"},'
        '{"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}}]}]}',
        detail=r"^(?!system message \(text\))"),
    KnownDefect(
        "bridges_drop_fields", 5, "both bridges drop top-level fields they do not map (O->A: n, "
        "seed, response_format, logit_bias, metadata, parallel_tool_calls...; A->O: thinking, "
        "service_tier, metadata keys but user_id, unknown fields) instead of mapping or a 400",
        ("field_dropped",), (O2A, A2O), "openai", "claude-fuzz",
        '{"model":"claude-fuzz","seed":7,"n":2,"response_format":{"type":"json_object"},'
        '"messages":[{"role":"user","content":"hi"}]}'),
    KnownDefect(
        "o2a_max_tokens_zero_becomes_4096", 5, "O->A bridge: max_tokens 0 (or a falsy value) is "
        "sent as 4096",
        ("number_text_changed",), (O2A,), "openai", "claude-fuzz",
        '{"model":"claude-fuzz","max_tokens":0,"messages":[{"role":"user","content":"hi"}]}',
        detail="field 'max_(completion_)?tokens'"),
    KnownDefect(
        "edits_listed_for_unchanged_body", 7, "x-prefixgate-edits (and the ledger) name a pass for a "
        "body that went upstream byte-identical",
        ("edits_listed_for_unchanged_body",), SAME, "openai", "gpt-fuzz",
        '{"model":"gpt-fuzz","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function",'
        '"function":{"name":"a","parameters":{"type":"object","properties":{"limit":{"type":"string"}}}}}]}'),
    KnownDefect(
        "prune_tools_drops_required_tool", 3, "prune_tools drops a tool the system prompt says to "
        "always call (or one named in tool_choice.allowed_tools)",
        ("required_tool_dropped",), (), "anthropic", "claude-fuzz",
        json.dumps({"model": "claude-fuzz", "max_tokens": 64, "system": "Always call list_repo before answering.",
                    "messages": [{"role": "user", "content": "get the order of the user"}], "tools": _TOOLS14})),
    KnownDefect(
        "breakpoints_nested_in_tool_result_not_counted", 4, "place_breakpoints does not count a "
        "cache_control nested in a tool_result: 4 client markers + its own = 5, which Anthropic "
        "rejects with a 400",
        ("upstream_invalid:too_many_breakpoints",), ("anthropic->anthropic",), "anthropic", "claude-fuzz",
        json.dumps(_nested_markers())),
    KnownDefect(
        "bridge_400_names_no_param", 6, "a request a bridge cannot translate gets a 400 whose "
        "message names no field ('a field has an unexpected type or shape (TypeError...)')",
        ("error_names_no_param",), (O2A, A2O), "anthropic", "gpt-fuzz",
        '{"model":"gpt-fuzz","max_tokens":64,"messages":[{"role":"user","content":"hi"},'
        '{"role":"assistant","content":[{"type":"text","text":7}]},{"role":"user","content":"x"}]}'),
    KnownDefect(
        "bridge_sends_invalid_body", 4, "a bridge turns a client body it cannot map into an "
        "upstream body the backend rejects (empty messages list, broken tool pairing, an image "
        "in the system prompt) instead of a 400",
        ("upstream_invalid:messages", "upstream_invalid:tool_pairing", "upstream_invalid:bad_system"),
        (O2A, A2O), "openai",
        "claude-fuzz", '{"model":"claude-fuzz","messages":[{"role":"user","content":[]}]}'),
)


def uncovered(path: str, violations: list[Violation], raw: bytes = b"") -> list[Violation]:
    """The violations of client body ``raw`` on ``path`` that no KNOWN_DEFECTS entry covers."""
    return [v for v in violations if not any(d.covers(path, v, raw) for d in KNOWN_DEFECTS)]
