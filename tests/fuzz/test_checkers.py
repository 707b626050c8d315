"""The fuzzer's own checkers catch what they claim to and pass what the passes may do.

A checker that cannot fail proves nothing: each test hands the meaning / shape / number checks
a hand-made pair (client body, upstream body) with exactly one defect — or with one permitted
change — and asserts the verdict.
"""

from __future__ import annotations

from typing import Any

from tests.fuzz.check import applied_passes
from tests.fuzz.fields import field_violations
from tests.fuzz.jsontext import Num, dumps, loads, number_literals
from tests.fuzz.meaning import Allow, meaning_violations, passage_spans
from tests.fuzz.shapes import anthropic_request_problems, error_problems, openai_request_problems
from tests.fuzz.transcript import transcript


def kinds(client: dict[str, Any], c_api: str, upstream: dict[str, Any], u_api: str,
          allow: Allow | None = None) -> list[str]:
    c = transcript(loads(dumps(client)), c_api)
    u = transcript(loads(dumps(upstream)), u_api)
    return [v.kind for v in meaning_violations(c, u, allow or Allow())]


def oai(*msgs: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "messages": list(msgs)}


def test_identical_bodies_keep_meaning() -> None:
    body = oai({"role": "system", "content": "rules"}, {"role": "user", "content": "hi 🙂"})
    assert kinds(body, "openai", body, "openai") == []


def test_one_dropped_character_is_caught() -> None:
    assert kinds(oai({"role": "user", "content": "order 42"}), "openai",
                 oai({"role": "user", "content": "order 4"}), "openai") == ["text_missing_or_moved"]


def test_reordered_turns_are_caught() -> None:
    a, b = {"role": "user", "content": "first"}, {"role": "user", "content": "second"}
    assert kinds(oai(a, b), "openai", oai(b, a), "openai") == ["text_missing_or_moved"]


def test_added_text_around_the_clients_is_allowed() -> None:
    assert kinds(oai({"role": "user", "content": "hi"}), "openai",
                 oai({"role": "user", "content": "hi"}, {"role": "user", "content": "(note)"}),
                 "openai") == []


def test_bridged_tool_round_trip_keeps_calls_and_results() -> None:
    client = {"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": "find"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f",
                                           "input": {"id": Num("12345678901234567890123")}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]}
    up = oai({"role": "user", "content": "find"},
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "t1", "type": "function",
                  "function": {"name": "f", "arguments": '{"id": 12345678901234567890123}'}}]},
             {"role": "tool", "tool_call_id": "t1", "content": "ok"})
    assert kinds(client, "anthropic", up, "openai") == []
    up["messages"][1]["tool_calls"][0]["function"]["arguments"] = '{"id": 1.2345678901234568e+22}'
    assert kinds(client, "anthropic", up, "openai") == ["call_number_text_changed"]
    up["messages"][1]["tool_calls"][0]["function"]["arguments"] = '{"id": 7}'
    assert kinds(client, "anthropic", up, "openai") == ["call_args_changed"]


def test_a_pdf_title_carried_as_the_file_name_keeps_meaning_and_a_lost_one_is_caught() -> None:
    title = "Berlin \u0000 audit"
    pdf = {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}
    client = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "document", "title": title, "source": pdf}, {"type": "text", "text": "sum up"}]}]}

    def up(name: str) -> dict[str, Any]:
        return oai({"role": "user", "content": [
            {"type": "file", "file": {"filename": name, "file_data": "data:application/pdf;base64,JVBE"}},
            {"type": "text", "text": "sum up"}]})
    assert kinds(client, "anthropic", up(title), "openai") == []
    assert kinds(client, "anthropic", up("document.pdf"), "openai") == ["text_missing_or_moved"]


def test_a_document_title_in_a_json_escaped_tag_attribute_keeps_meaning() -> None:
    title = 'delta "Paris" beta'
    client = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "document", "title": title, "source": {"type": "text", "data": "body"}}]}]}

    def up(tag: str) -> dict[str, Any]:
        return oai({"role": "user", "content": [{"type": "text", "text": tag},
                                                 {"type": "text", "text": "body"},
                                                 {"type": "text", "text": "</document>"}]})
    assert kinds(client, "anthropic", up('<document title="delta \\"Paris\\" beta">'), "openai") == []
    assert kinds(client, "anthropic", up('<document title="delta Paris beta">'), "openai") == [
        "text_missing_or_moved"]


def test_glued_blocks_are_caught() -> None:
    client = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "1. milk"}, {"type": "text", "text": "2. eggs"}]}]}
    assert kinds(client, "anthropic", oai({"role": "user", "content": "1. milk2. eggs"}), "openai") \
        == ["glued_blocks"]
    assert kinds(client, "anthropic", oai({"role": "user", "content": "1. milk\n\n2. eggs"}),
                 "openai") == []


def test_history_pruning_may_drop_old_turns_but_never_the_first_user_turn() -> None:
    turns = [{"role": "user", "content": "TASK"}, {"role": "assistant", "content": "old answer"},
             {"role": "user", "content": "newest"}]
    kept = [turns[0], turns[2]]
    history = Allow(history=True)
    assert kinds(oai(*turns), "openai", oai(*kept), "openai", history) == []
    assert kinds(oai(*turns), "openai", oai(*kept), "openai") == ["text_missing_or_moved"]
    assert kinds(oai(*turns), "openai", oai(turns[2]), "openai", history) == ["first_user_turn_lost"]


def test_rag_pruning_may_drop_and_reorder_whole_passages_only() -> None:
    text = "question?\n\n<doc id=\"1\">alpha beta</doc>\n<doc id=\"2\">gamma delta</doc>"
    rag = Allow(rag=True)
    kept = "question?\n\n<doc id=\"2\">gamma delta</doc>"
    assert kinds(oai({"role": "user", "content": text}), "openai",
                 oai({"role": "user", "content": kept}), "openai", rag) == []
    assert kinds(oai({"role": "user", "content": text}), "openai",
                 oai({"role": "user", "content": "<doc id=\"2\">gamma delta</doc>"}), "openai", rag) \
        == ["text_missing_or_moved"]  # the user's own question is not a passage
    assert passage_spans("[1] a\n[2] b\n\nafter", ()) == [(0, 5), (6, 11)]


def test_hoisted_system_text_must_still_arrive_somewhere() -> None:
    client = oai({"role": "system", "content": "Rules.\nTime: 10:15"}, {"role": "user", "content": "hi"})
    moved = oai({"role": "system", "content": "Rules.\nTime: [see note 1]"},
                {"role": "user", "content": "hi"}, {"role": "user", "content": "[1] Time: 10:15"})
    assert kinds(client, "openai", moved, "openai", Allow(hoist=True)) == []
    lost = oai({"role": "system", "content": "Rules."}, {"role": "user", "content": "hi"})
    assert kinds(client, "openai", lost, "openai", Allow(hoist=True)) == ["system_text_lost"]


def test_number_literals_keep_their_text_through_the_fuzzers_json() -> None:
    raw = b'{"a":1.10,"b":123456789012345678901234567890,"c":"{\\"x\\":2.50}"}'
    assert dumps(loads(raw)) == raw
    assert number_literals(loads(raw), frozenset({"c"})) == {"1.10": 1, "123456789012345678901234567890": 1,
                                                             "2.50": 1}


def test_bridge_field_accounting() -> None:
    client = loads(b'{"model":"m","temperature":0.70,"seed":7,"messages":[]}')
    up = loads(b'{"model":"m","temperature":0.7,"messages":[]}')
    assert sorted(v.kind for v in field_violations(client, up, "openai")) == \
        ["field_dropped", "number_text_changed"]


def test_request_validators_flag_what_each_api_rejects() -> None:
    assert openai_request_problems(loads(b'{"model":"m","messages":[{"role":"tool","content":"x"}]}')) \
        == ["tool_without_id", "orphan_tool_result"]
    five = [{"type": "text", "text": "t", "cache_control": {"type": "ephemeral"}}] * 4
    nested = [{"type": "tool_result", "tool_use_id": "a", "content": [five[0]]}]
    body = loads(dumps({"model": "m", "max_tokens": 1, "messages": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]},
        {"role": "user", "content": nested + five}]}))
    assert anthropic_request_problems(body) == ["too_many_breakpoints"]


def test_error_shape_and_param_naming() -> None:
    assert error_problems(400, {"error": {"message": "bad", "type": "x", "param": "stop"}}, "openai") == []
    assert error_problems(400, {"error": {"message": "bad field", "type": "x", "param": None}}, "openai") \
        == ["error_names_no_param"]
    assert error_problems(400, {"error": {"message": "x"}}, "anthropic") == ["error_not_in_caller_shape"]
    anthropic = {"type": "error", "error": {"type": "invalid_request_error", "message": ""}}
    for message, ok in (("'ù°í?/(' cannot be translated", True), ("'a\\u0020b' is bad", True),
                        ("the model's backend's field is bad", False), ("no name here", False)):
        anthropic["error"]["message"] = message
        assert (error_problems(400, anthropic, "anthropic") == []) == ok, message
    assert applied_passes("canonicalize_tools;prune_tools:2-812;!hoist_volatile") == \
        {"canonicalize_tools", "prune_tools"}
    for sent_as_is in ("none", "off", "unavailable", "over_budget"):
        assert applied_passes(sent_as_is) == set(), sent_as_is
