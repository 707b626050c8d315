"""Every model endpoint takes the one pipeline (issue 18): deployments, breakers, retries,
fallbacks, and a ledger row with the full cost fields — not only chat and messages.

Each test breaks one step for one endpoint: with the side endpoints on their old single-send
path (one POST to the primary backend's base URL, no retry, no cost), each would fail.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from prefixgate.proxy.observe.insight import input_cost_usd
from tests.proxy.upstream import Script, ScriptedUpstream, completion, wait_rows
from tests.servers import serve_app

MODEL = "gpt-4o"  # priced in config/prices: input_usd can be filled
RESPONSE = {"id": "resp_1", "object": "response", "status": "completed", "model": MODEL,
            "output": [], "usage": {"input_tokens": 1200, "output_tokens": 3,
                                    "input_tokens_details": {"cached_tokens": 1024}}}
EMBEDDING = {"object": "list", "model": MODEL, "data": [{"object": "embedding", "index": 0,
                                                        "embedding": [0.1, 0.2]}],
             "usage": {"prompt_tokens": 5, "total_tokens": 5}}
COMPLETION = {"id": "c1", "object": "text_completion", "model": MODEL,
              "choices": [{"index": 0, "text": "hi", "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 1100, "completion_tokens": 1, "total_tokens": 1101,
                        "prompt_tokens_details": {"cached_tokens": 1024}}}


def _policy(tmp: Path, kind: str, urls: list[str], **extra: Any) -> Any:
    deps = [{"name": f"d{i + 1}", "base_url": u + "/v1"} for i, u in enumerate(urls)]
    return parse_policy({
        "backends": {"e": {"kind": kind, "deployments": deps, "affinity": {"mode": "round_robin"}}},
        "routes": [{"match": "*", "backend": "e"}],
        "retry": {"attempts": 2, "backoff_base_s": 0, "backoff_max_s": 0},
        "ledger": {"path": str(tmp / "l.sqlite")}, **extra})


def test_a_responses_request_is_retried_on_503_then_falls_back_to_the_next_deployment(
        tmp_path: Path) -> None:
    # the 503 says when to come back: retried there once, then the next deployment
    down = ScriptedUpstream(script=Script(body={"error": {"message": "busy"}}, status=503,
                                          headers={"retry-after": "0"}))
    up = ScriptedUpstream(script=Script(body=RESPONSE))
    with serve_app(down.app()) as d1, serve_app(up.app()) as d2:
        app = build_app(_policy(tmp_path, "openai", [d1, d2]), rewrite_fn=None, analyze=False)
        with serve_app(app) as url:
            r = httpx.post(url + "/v1/responses", json={"model": MODEL, "input": "hi"}, timeout=30)
        rows = wait_rows(app.state.proxy.ledger, 1)
    assert r.status_code == 200 and r.json()["id"] == "resp_1"
    assert [s.path for s in down.seen] == ["/v1/responses"] * 2  # tried, then retried
    assert [s.path for s in up.seen] == ["/v1/responses"]  # then the next deployment
    row = rows[-1]
    assert (row["deployment"], row["attempts"]) == ("d2", 3)
    assert row["attempt_reasons"] == "d1:status-503,d1:status-503"
    assert app.state.responses.get("resp_1").backend == "e"  # the pointer names the backend


def test_an_embeddings_request_skips_a_deployment_whose_breaker_is_open(tmp_path: Path) -> None:
    down = ScriptedUpstream(script=Script(body={"error": {"message": "down"}}, status=500))
    up = ScriptedUpstream(script=Script(body=EMBEDDING))
    with serve_app(down.app()) as d1, serve_app(up.app()) as d2:
        policy = _policy(tmp_path, "openai_compat", [d1, d2],
                         breaker={"consecutive_failures": 1, "cooldown_s": 60})
        app = build_app(policy, rewrite_fn=None, analyze=False)
        with serve_app(app) as url:
            body = {"model": MODEL, "input": "hi"}
            first = httpx.post(url + "/v1/embeddings", json=body, timeout=30)
            seen_before = len(down.seen)
            rest = [httpx.post(url + "/v1/embeddings", json=body, timeout=30) for _ in range(3)]
        rows = wait_rows(app.state.proxy.ledger, 4)
    assert first.status_code == 200 and seen_before == 1  # d1 failed once: its breaker opened
    assert [r.status_code for r in rest] == [200, 200, 200]
    assert len(down.seen) == seen_before  # round robin would have sent one there: skipped
    assert [row["deployment"] for row in rows] == ["d2"] * 4
    assert all(row["attempts"] == 1 for row in rows[1:])


def _cost_fields_case(tmp: Path, path: str, body: dict[str, Any], answer: dict[str, Any]
                      ) -> dict[str, Any]:
    up = ScriptedUpstream(script=Script(body=answer, headers={"x-engine-prefill-ms": "12.5"}))
    with serve_app(up.app()) as u:
        app = build_app(_policy(tmp, "openai", [u]), rewrite_fn=None, analyze=False)
        with serve_app(app) as url:
            r = httpx.post(url + path, json=body, timeout=30)
        assert r.status_code == 200, r.text
        return wait_rows(app.state.proxy.ledger, 1)[-1]


@pytest.mark.parametrize("path, body, answer", [
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
     completion(usage={"prompt_tokens": 1100, "completion_tokens": 1,
                       "prompt_tokens_details": {"cached_tokens": 1024}})),
    ("/v1/responses", {"model": MODEL, "input": "hi"}, RESPONSE),
    ("/v1/completions", {"model": MODEL, "prompt": "hi"}, COMPLETION),
    ("/v1/embeddings", {"model": MODEL, "input": "hi"}, EMBEDDING),
], ids=["chat", "responses", "completions", "embeddings"])
def test_every_endpoints_row_has_its_usage_cost_and_engine_timings(
        tmp_path: Path, path: str, body: dict[str, Any], answer: dict[str, Any]) -> None:
    row = _cost_fields_case(tmp_path, path, body, answer)
    usage = answer["usage"]
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    assert row["prompt_tokens"] == prompt
    assert row["input_usd"] is not None and row["input_usd"] > 0
    assert row["prefill_ms"] == 12.5  # the backend's own timing header
    uncached = input_cost_usd(MODEL, prompt, 0, None)
    if row["cached_tokens"]:  # priced from the usage: the cached prefix at the cached rate
        assert row["input_usd"] < uncached
        # the body went as the client sent it: its own measured counterfactual
        assert row["cf_source"] == "measured" and row["cf_input_usd"] == row["input_usd"]
    else:
        assert row["input_usd"] == pytest.approx(uncached)
