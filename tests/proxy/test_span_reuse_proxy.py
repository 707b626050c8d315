"""Issue 33, the proxy side: our engine's ``span_reused_tokens`` (cached tokens it reused across a
changed span) is read from its usage on every API and both answer shapes, recorded in the
ledger, shown as the measured technique ``span reuse (engine)`` in ``/api/savings`` and
``prefixgate report``, and a break the engine bridged is reported as bridged, not as a loss."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from prefixgate.cache.ledger.attribution import SPAN_REUSE
from prefixgate.proxy.cli import app
from tests.proxy.test_cli_report_replay import clock_turns
from tests.proxy.upstream import DONE, Script, chunk, completion, wait_rows

USAGE = {"prompt_tokens": 1000, "completion_tokens": 2, "total_tokens": 1002,
         "prompt_tokens_details": {"cached_tokens": 900, "span_reused_tokens": 700}}
"""What our engine answers after reusing 700 tokens across a changed clock (200 by prefix)."""
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _technique(doc_rows: list[dict[str, Any]]) -> dict[str, Any]:
    return next(t for t in doc_rows if t["technique"] == SPAN_REUSE)


def test_a_non_streamed_answer_records_the_span_reuse_and_the_savings_show_it(rig: Any) -> None:
    rig.upstream.script = Script(body=completion(usage=USAGE))
    r = httpx.post(rig.url + "/v1/chat/completions", json=CHAT, timeout=30)
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens_details"]["span_reused_tokens"] == 700  # untouched
    assert r.headers["x-prefixgate-span-reused-tokens"] == "700"
    row = wait_rows(rig.ledger, 1)[0]
    # sent as is: the counterfactual is the client's body on a prefix cache, 900 - 700
    assert (row["cached_tokens"], row["span_reused_tokens"], row["cf_cached_tokens"]) == (
        900, 700, 200)
    doc = httpx.get(rig.url + "/api/savings", timeout=30).json()
    assert doc["totals"]["span_reused_tokens"] == 700
    assert doc["totals"]["saved_tokens"] == 700
    tech = _technique(doc["by_technique"])
    assert (tech["tokens_reusable"], tech["saved_tokens"]) == (700, 700)
    assert sum(t["saved_tokens"] for t in doc["by_technique"]) == doc["totals"]["saved_tokens"]


def test_a_backend_without_the_field_records_none_and_no_technique(rig: Any) -> None:
    rig.upstream.script = Script(body=completion())  # 4 cached of 10, no span field
    r = httpx.post(rig.url + "/v1/chat/completions", json=CHAT, timeout=30)
    assert "x-prefixgate-span-reused-tokens" not in r.headers
    row = wait_rows(rig.ledger, 1)[0]
    assert (row["span_reused_tokens"], row["cf_cached_tokens"]) == (None, 4)
    doc = httpx.get(rig.url + "/api/savings", timeout=30).json()
    assert all(t["technique"] != SPAN_REUSE for t in doc["by_technique"])


def test_a_stream_reads_it_from_the_usage_chunk(rig: Any) -> None:
    rig.upstream.script = Script(pieces=[chunk("he"), chunk("llo", finish="stop"),
                                         chunk(usage=USAGE), DONE])
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", rig.url + "/v1/chat/completions", json=body, timeout=30) as r:
        r.read()
    row = wait_rows(rig.ledger, 1)[0]
    assert (row["span_reused_tokens"], row["cf_cached_tokens"]) == (700, 200)


def test_a_stream_without_a_usage_chunk_reads_the_engine_headers(rig: Any) -> None:
    rig.upstream.script = Script(pieces=[chunk("hello", finish="stop"), DONE], headers={
        "x-engine-prompt-tokens": "1000", "x-engine-cached-tokens": "900",
        "x-engine-span-reused-tokens": "700"})
    with httpx.stream("POST", rig.url + "/v1/chat/completions", json={**CHAT, "stream": True},
                      timeout=30) as r:
        r.read()
        assert r.headers["x-prefixgate-span-reused-tokens"] == "700"
    row = wait_rows(rig.ledger, 1)[0]
    assert (row["prompt_tokens"], row["cached_tokens"], row["span_reused_tokens"]) == (
        1000, 900, 700)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_an_anthropic_client_on_our_engine_gets_it_recorded(rig: Any, stream: bool) -> None:
    if stream:
        rig.upstream.script = Script(pieces=[chunk("hi", finish="stop"), chunk(usage=USAGE),
                                             DONE])
    else:
        rig.upstream.script = Script(body=completion(usage=USAGE))
    body = {"model": "m", "max_tokens": 8, "stream": stream,
            "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", rig.url + "/v1/messages", json=body, timeout=30) as r:
        r.read()
        assert r.status_code == 200
    if not stream:
        assert json.loads(r.content)["usage"]["cache_read_input_tokens"] == 900
        assert r.headers["x-prefixgate-span-reused-tokens"] == "700"
    row = wait_rows(rig.ledger, 1)[0]
    assert (row["cached_tokens"], row["span_reused_tokens"]) == (900, 700)


def test_a_responses_client_on_a_chat_backend_sees_and_records_it(rig: Any) -> None:
    rig.upstream.script = Script(body=completion(usage=USAGE))
    r = httpx.post(rig.url + "/v1/responses", json={"model": "m", "input": "hi"}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["input_tokens_details"] == {"cached_tokens": 900,
                                                         "span_reused_tokens": 700}
    row = wait_rows(rig.ledger, 1)[0]
    assert (row["cached_tokens"], row["span_reused_tokens"]) == (900, 700)


def test_report_lists_span_reuse_as_its_own_technique(rig: Any) -> None:
    rig.upstream.script = Script(body=completion(usage=USAGE))
    httpx.post(rig.url + "/v1/chat/completions", json=CHAT, timeout=30)
    wait_rows(rig.ledger, 1)
    res = CliRunner().invoke(app, ["report", "--ledger", rig.ledger.path, "--json"])
    doc = json.loads(res.output)
    assert _technique(doc["by_technique"])["saved_tokens"] == 700
    assert doc["saved"]["saved_tokens"] == 700
    res = CliRunner().invoke(app, ["report", "--ledger", rig.ledger.path],
                             env={"COLUMNS": "120"})
    assert res.exit_code == 0, res.output
    assert "span reuse (engine) 700" in res.output


def _clock_session(rig: Any, usage2: dict[str, Any]) -> str:
    """Two turns whose clock changed; the second answered with ``usage2``; report --breaks."""
    answers = iter([completion(), completion(usage=usage2)])
    rig.upstream.script = lambda body: Script(body=next(answers))
    for body in clock_turns():
        httpx.post(rig.url + "/v1/chat/completions", json=body, timeout=30,
                   headers={"x-prefixgate-session": "s", "x-prefixgate-rewrite": "off"})
    wait_rows(rig.ledger, 2)
    assert len(rig.ledger.breaks()) == 1
    res = CliRunner().invoke(app, ["report", "--ledger", rig.ledger.path, "--breaks"],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    return " ".join(res.output.split())  # lines wrapped at 80 columns


def test_breaks_a_span_reuse_bridged_are_reported_as_bridged_not_lost(rig: Any) -> None:
    out = _clock_session(rig, USAGE)
    assert "volatile_span" in out  # the cause is kept
    assert "bridged by the engine (700 tokens reused across the changed span)" in out
    assert "0 prefix tokens lost" in out
    assert "hoist_volatile" not in out  # no move advised for it


def test_breaks_without_span_reuse_stay_losses_with_the_advice(rig: Any) -> None:
    out = _clock_session(rig, {"prompt_tokens": 1000, "completion_tokens": 2,
                               "prompt_tokens_details": {"cached_tokens": 20}})
    assert "bridged" not in out
    assert "0 prefix tokens lost" not in out
    assert "hoist_volatile" in out
