"""The providers' own cache-miss reasons reach the ledger row, ``report --breaks`` and
``/api/savings`` on every API, streamed or not (issue 35, item 3).

Fixture shapes (a scripted upstream answers them): Anthropic ``diagnostics.cache_miss_reason``
(``{"type", "cache_missed_input_tokens"}``, ``null`` while pending; on a stream in
``message_start``'s message), OpenAI Responses ``prompt_cache_diagnostics`` (``type``,
``reason``, ``cache_missed_tokens``, ``comparison_reusable_tokens``; on a stream in
``response.completed``'s response). Names from the providers' docs and SDK models, read
2026-12-06 (:mod:`prefixgate.proxy.core.diagnostics`).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from prefixgate.proxy.cli import app as cli
from prefixgate.proxy.core.diagnostics import anthropic_diagnosis, openai_diagnosis
from tests.proxy.upstream import Script, wait_rows

SYSTEM = "You are an airline agent. Follow the policy exactly. " * 60


def _diag(reason: Any, missed: int | None = 2048) -> dict[str, Any]:
    if reason is None:
        return {"cache_miss_reason": None}
    return {"cache_miss_reason": {"type": reason, "cache_missed_input_tokens": missed}}


def _message(diag: dict[str, Any] | None) -> dict[str, Any]:
    msg = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
           "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
           "usage": {"input_tokens": 100, "cache_read_input_tokens": 0,
                     "cache_creation_input_tokens": 900, "output_tokens": 1}}
    return {**msg, "diagnostics": diag} if diag is not None else msg


def _sse(events: list[tuple[str, dict[str, Any]]]) -> list[bytes]:
    return [f"event: {e}\ndata: {json.dumps(d)}\n\n".encode() for e, d in events]


def _anthropic_stream(diag: dict[str, Any]) -> list[bytes]:
    start = {**_message(diag), "content": [], "stop_reason": None}
    return _sse([("message_start", {"type": "message_start", "message": start}),
                 ("content_block_start", {"type": "content_block_start", "index": 0,
                                          "content_block": {"type": "text", "text": ""}}),
                 ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                          "delta": {"type": "text_delta", "text": "ok"}}),
                 ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                 ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                                    "usage": {"output_tokens": 1}}),
                 ("message_stop", {"type": "message_stop"})])


def _response(diag: dict[str, Any] | None) -> dict[str, Any]:
    r = {"id": "resp_1", "object": "response", "status": "completed", "model": "gpt-x",
         "output": [], "usage": {"input_tokens": 3000, "input_tokens_details": {"cached_tokens": 0},
                                 "output_tokens": 1}}
    return {**r, "prompt_cache_diagnostics": diag} if diag is not None else r


OPENAI_MISS = {"type": "cache_miss", "reason": "tools_changed", "cache_missed_tokens": 1536,
               "comparison_reusable_tokens": 2048}


@pytest.fixture
def rig(rig_factory: Any, upstream: Any) -> Any:
    return rig_factory(rewrite_fn="default",
                       backends={"oai": {"kind": "openai", "base_url": upstream[1] + "/v1"},
                                 "anth": {"kind": "anthropic", "base_url": upstream[1] + "/v1",
                                          "api_key": "${PG_TEST_ANTHROPIC_KEY}"}},
                       routes=[{"match": "claude-*", "backend": "anth"},
                               {"match": "gpt-*", "backend": "oai"}])


def _messages_body(stream: bool = False) -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": 9, "system": SYSTEM, "stream": stream,
            "messages": [{"role": "user", "content": "hi"}]}


def _chat_body(stream: bool = False) -> dict[str, Any]:
    return {"model": "claude-x", "stream": stream, "messages": [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]}


CASES = [
    # (endpoint, body, script, reason, missed, reusable)
    ("/v1/messages", _messages_body(), Script(body=_message(_diag("system_changed"))),
     "system_changed", 2048, None),
    ("/v1/messages", _messages_body(True), Script(pieces=_anthropic_stream(_diag("tools_changed"))),
     "tools_changed", 2048, None),
    ("/v1/messages", _messages_body(), Script(body=_message(_diag(None))), "pending", None, None),
    ("/v1/messages", _messages_body(), Script(body=_message(_diag("solar_flare_changed", 7))),
     "solar_flare_changed", 7, None),
    # an OpenAI client bridged to the Anthropic backend (O->A), both ways of answering
    ("/v1/chat/completions", _chat_body(), Script(body=_message(_diag("messages_changed"))),
     "messages_changed", 2048, None),
    ("/v1/chat/completions", _chat_body(True),
     Script(pieces=_anthropic_stream(_diag("model_changed"))), "model_changed", 2048, None),
    # OpenAI Responses, passed through
    ("/v1/responses", {"model": "gpt-x", "instructions": SYSTEM, "input": "hi"},
     Script(body=_response(OPENAI_MISS)), "tools_changed", 1536, 2048),
    ("/v1/responses", {"model": "gpt-x", "instructions": SYSTEM, "input": "hi", "stream": True},
     Script(pieces=_sse([("response.created", {"type": "response.created",
                                               "response": {"id": "resp_1"}}),
                         ("response.output_text.delta", {"type": "response.output_text.delta",
                                                         "delta": "ok"}),
                         ("response.completed", {"type": "response.completed",
                                                 "response": _response(
                                                     {"type": "cache_hit"})})])),
     "cache_hit", None, None),
]


@pytest.mark.parametrize(("endpoint", "body", "script", "reason", "missed", "reusable"), CASES,
                         ids=[f"{c[0]}-{c[3]}-{'stream' if c[1].get('stream') else 'json'}"
                              for c in CASES])
def test_every_diagnostic_field_reaches_the_ledger_row(rig: Any, endpoint: str, body: Any,
                                                        script: Script, reason: str,
                                                        missed: int | None,
                                                        reusable: int | None) -> None:
    rig.upstream.script = script
    r = httpx.post(rig.url + endpoint, json=body, timeout=10)
    assert r.status_code == 200, r.text
    r.read()
    row = wait_rows(rig.ledger, 1)[-1]
    assert (row["reported_miss"], row["reported_missed_tokens"],
            row["reported_reusable_tokens"]) == (reason, missed, reusable)
    assert row["predicted_miss"] == "none"  # the session's first request: nothing predicted


def test_answers_without_diagnostics_leave_the_columns_empty(rig: Any) -> None:
    rig.upstream.script = Script(body=_message(None))
    assert httpx.post(rig.url + "/v1/messages", json=_messages_body(), timeout=10).status_code == 200
    row = wait_rows(rig.ledger, 1)[-1]
    assert (row["reported_miss"], row["reported_missed_tokens"], row["predicted_miss"]) == (
        "", None, "")


def test_report_and_savings_show_predicted_against_reported(rig: Any, tmp_path: Any) -> None:
    """A session whose system prompt changes on its second request: prefixgate predicts a
    system break, the provider reports ``system_changed``; both in report --breaks (with
    agreement) and in /api/savings."""
    rig.upstream.script = Script(body=_message(None))
    first = _messages_body()
    headers = {"x-prefixgate-session": "sess-1"}
    assert httpx.post(rig.url + "/v1/messages", json=first, headers=headers,
                      timeout=10).status_code == 200
    rig.upstream.script = Script(body=_message(_diag("system_changed")))
    second = {**first, "system": "Policy v2. " + SYSTEM}
    assert httpx.post(rig.url + "/v1/messages", json=second, headers=headers,
                      timeout=10).status_code == 200
    row = wait_rows(rig.ledger, 2)[-1]
    assert (row["predicted_miss"], row["reported_miss"]) == ("system", "system_changed")
    doc = httpx.get(rig.url + "/api/savings?range=1h", timeout=10).json()
    pm = doc["provider_misses"]
    assert pm["reported"] == {"system_changed": 1} and pm["missed_tokens"] == 2048
    assert pm["agreement"]["system"] == {"misses": 1, "agree": 1, "share": 1.0,
                                         "predicted": {"system": 1}}
    out = CliRunner().invoke(cli, ["report", "--ledger", rig.ledger.path, "--breaks"])
    assert out.exit_code == 0, out.output
    assert "system_changed" in out.output and "predicted = reported, system: 1/1" in out.output


@pytest.mark.parametrize("shape", [
    {"diagnostics": "weird"}, {"diagnostics": {"cache_miss_reason": {"type": 5}}},
    {"diagnostics": {"cache_miss_reason": {"type": "x" * 500}}}, {"diagnostics": []}])
def test_odd_anthropic_shapes_are_ignored_never_an_error(shape: dict[str, Any]) -> None:
    assert anthropic_diagnosis(shape) is None


def test_openai_shapes() -> None:
    assert openai_diagnosis({"prompt_cache_diagnostics": {"type": "cache_miss"}}).reason == (  # type: ignore[union-attr]
        "cache_miss")
    d = openai_diagnosis({"prompt_cache_diagnostics": {
        "type": "cache_miss", "reason": "reasoning_effort_changed", "cache_missed_tokens": -1}})
    assert d is not None and d.reason == "reasoning_effort_changed" and d.missed_tokens is None
    assert openai_diagnosis({"prompt_cache_diagnostics": None}) is None


def _asking_rig(rig_factory: Any, upstream: Any, on: bool | None) -> Any:
    route: dict[str, Any] = {"match": "claude-*", "backend": "anth"}
    if on is not None:
        route["cache_diagnostics"] = on
    return rig_factory(rewrite_fn="default",
                       backends={"anth": {"kind": "anthropic", "base_url": upstream[1] + "/v1",
                                          "api_key": "${PG_TEST_ANTHROPIC_KEY}"}},
                       routes=[route])


def test_a_route_that_asks_sends_the_beta_and_the_previous_answer_id(
        rig_factory: Any, upstream: Any) -> None:
    rig = _asking_rig(rig_factory, upstream, True)
    headers = {"x-prefixgate-session": "s-ask", "anthropic-beta": "tools-2024-04-04"}
    rig.upstream.script = Script(body={**_message(None), "id": "msg_first"})
    assert httpx.post(rig.url + "/v1/messages", json=_messages_body(), headers=headers,
                      timeout=10).status_code == 200
    first = rig.upstream.seen[-1]
    assert first.json["diagnostics"] == {"previous_message_id": None}
    assert first.headers["anthropic-beta"] == "tools-2024-04-04,cache-diagnosis-2026-04-07"
    # the second turn, streamed: compared with the first answer; its own id is kept next
    rig.upstream.script = Script(pieces=_anthropic_stream(_diag("system_changed")))
    body = {**_messages_body(True), "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "more"}]}
    r = httpx.post(rig.url + "/v1/messages", json=body, headers=headers, timeout=10)
    assert r.status_code == 200
    r.read()
    assert rig.upstream.seen[-1].json["diagnostics"] == {"previous_message_id": "msg_first"}
    rig.upstream.script = Script(body=_message(None))
    body["stream"] = False
    httpx.post(rig.url + "/v1/messages", json=body, headers=headers, timeout=10)
    assert rig.upstream.seen[-1].json["diagnostics"] == {"previous_message_id": "msg_1"}
    assert wait_rows(rig.ledger, 3)[1]["reported_miss"] == "system_changed"


def test_nothing_is_asked_by_default_and_a_clients_own_request_is_kept(
        rig_factory: Any, upstream: Any) -> None:
    rig = _asking_rig(rig_factory, upstream, None)
    rig.upstream.script = Script(body=_message(None))
    httpx.post(rig.url + "/v1/messages", json=_messages_body(), timeout=10)
    seen = rig.upstream.seen[-1]
    assert "diagnostics" not in seen.json and "anthropic-beta" not in seen.headers
    rig = _asking_rig(rig_factory, upstream, True)
    mine = {**_messages_body(), "diagnostics": {"previous_message_id": "msg_mine"}}
    httpx.post(rig.url + "/v1/messages", json=mine, timeout=10,
               headers={"anthropic-beta": "cache-diagnosis-2026-04-07"})
    seen = rig.upstream.seen[-1]
    assert seen.json["diagnostics"] == {"previous_message_id": "msg_mine"}
    assert seen.headers["anthropic-beta"] == "cache-diagnosis-2026-04-07"


def test_a_responses_route_that_asks_compares_with_the_previous_response(
        rig_factory: Any, upstream: Any) -> None:
    rig = rig_factory(rewrite_fn="default",
                      backends={"oai": {"kind": "openai", "base_url": upstream[1] + "/v1"}},
                      routes=[{"match": "gpt-*", "backend": "oai", "cache_diagnostics": True}])
    headers = {"x-prefixgate-session": "s-resp"}
    body = {"model": "gpt-x", "instructions": SYSTEM, "input": "hi"}
    rig.upstream.script = Script(body={**_response(None), "id": "resp_first"})
    assert httpx.post(rig.url + "/v1/responses", json=body, headers=headers,
                      timeout=10).status_code == 200
    assert "prompt_cache_options" not in rig.upstream.seen[-1].json  # nothing to compare yet
    rig.upstream.script = Script(body={**_response(OPENAI_MISS), "id": "resp_second"})
    assert httpx.post(rig.url + "/v1/responses", json={**body, "input": "more"}, headers=headers,
                      timeout=10).status_code == 200
    sent = rig.upstream.seen[-1].json
    assert sent["prompt_cache_options"] == {"comparison_response_id": "resp_first"}
    assert sent["input"] == "more" and sent["instructions"] == SYSTEM
    mine = {**body, "prompt_cache_options": {"comparison_response_id": "resp_mine"}}
    httpx.post(rig.url + "/v1/responses", json=mine, headers=headers, timeout=10)
    assert rig.upstream.seen[-1].json["prompt_cache_options"] == {
        "comparison_response_id": "resp_mine"}
    assert wait_rows(rig.ledger, 3)[1]["reported_miss"] == "tools_changed"
