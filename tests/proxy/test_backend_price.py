"""A self-hosted backend's own price and the time it saved (issue 19, item 8): ``price_per_mtok``
/ ``usd_per_hour`` on a policy backend (``prefixgate/config/schema.py``), the ledger's
``input_usd`` / ``cf_input_usd`` from it (``prefixgate/proxy/pipeline/record.py``), and the
prefill seconds on ``/api/savings`` from a llama.cpp-shaped engine's own timings."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from prefixgate.config.prices import backend_input_usd, backend_priced
from prefixgate.config.schema import Backend
from tests.proxy.upstream import Script, completion, wait_rows

ASK = {"messages": [{"role": "user", "content": "x"}]}


def priced_backends(url: str, **price: Any) -> dict[str, Any]:
    """The test policy's backends and routes with ``price`` on the OpenAI-compatible one."""
    return {"backends": {"up": {"kind": "openai_compat", "base_url": url + "/v1", **price}},
            "routes": [{"match": "*", "backend": "up"}]}


@pytest.fixture
def priced(rig_factory: Any, upstream: Any) -> Any:
    _, url = upstream
    rig = rig_factory(**priced_backends(url, price_per_mtok=2.0, cached_price_per_mtok=0.5))
    rig.upstream.script = Script(body=completion())  # 10 prompt tokens, 4 of them cached
    return rig


def test_an_unpriced_model_is_priced_at_its_backends_own_price(priced: Any) -> None:
    assert httpx.post(priced.url + "/v1/chat/completions", json={"model": "m", **ASK},
                      timeout=30).status_code == 200
    r = wait_rows(priced.ledger, 1)[0]
    assert r["input_usd"] == pytest.approx((6 * 2.0 + 4 * 0.5) / 1e6)
    assert r["cf_input_usd"] == pytest.approx(r["input_usd"])  # sent as is: measured, same price


def test_a_table_priced_model_keeps_the_dated_table(priced: Any) -> None:
    httpx.post(priced.url + "/v1/chat/completions", json={"model": "gpt-4o", **ASK}, timeout=30)
    r = wait_rows(priced.ledger, 1)[0]
    assert r["input_usd"] == pytest.approx((6 * 2.50 + 4 * 1.25) / 1e6)  # gpt-4o's, not 2.0


def test_a_self_hosted_table_row_gives_way_to_the_backends_price(priced: Any) -> None:
    assert backend_priced("local-llama") and backend_priced("smollm2") and not backend_priced("gpt-4o")
    httpx.post(priced.url + "/v1/chat/completions", json={"model": "local-llama", **ASK}, timeout=30)
    assert wait_rows(priced.ledger, 1)[0]["input_usd"] == pytest.approx(1.4e-5)


def test_without_a_price_an_unpriced_model_stays_unpriced(rig: Any) -> None:
    rig.upstream.script = Script(body=completion())
    httpx.post(rig.url + "/v1/chat/completions", json={"model": "m", **ASK}, timeout=30)
    r = wait_rows(rig.ledger, 1)[0]
    assert r["input_usd"] is None and r["cf_input_usd"] is None


def test_the_schema_takes_one_kind_of_price_and_no_negative_one() -> None:
    ok = Backend(kind="local", base_url="http://h/v1", usd_per_hour=2.5)
    assert ok.usd_per_hour == 2.5 and ok.price_per_mtok is None and ok.cached_price_per_mtok == 0.0
    with pytest.raises(ValidationError, match="not both"):
        Backend(kind="local", base_url="http://h/v1", usd_per_hour=2.5, price_per_mtok=0.1)
    with pytest.raises(ValidationError):
        Backend(kind="local", base_url="http://h/v1", price_per_mtok=-1)
    assert backend_input_usd(1.0, 0.0, None, 5) is None
    assert backend_input_usd(1.0, 0.0, 100, 500) == 0.0  # cached never above the prompt


def llamacpp(prompt: int, cache_n: int) -> bytes:
    """A llama.cpp answer whose engine prefilled ``prompt - cache_n`` tokens at 7 + 0.05 ms each."""
    timings = {"cache_n": cache_n, "prompt_n": prompt - cache_n,
               "prompt_ms": 7.0 + 0.05 * (prompt - cache_n), "predicted_n": 2, "predicted_ms": 20.0}
    return json.dumps({"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                       "choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": "hi"}}],
                       "usage": {"prompt_tokens": prompt, "completion_tokens": 2,
                                 "total_tokens": prompt + 2},
                       "timings": timings}).encode()


def test_a_llamacpp_backend_shows_the_prefill_time_it_saved(rig_factory: Any, upstream: Any) -> None:
    _, url = upstream
    rig = rig_factory(**priced_backends(url, usd_per_hour=3.6))
    for i in range(6):
        rig.upstream.script = Script(pieces=[llamacpp(2000 + 100 * i, 1500)],
                                     media_type="application/json")
        assert httpx.post(rig.url + "/v1/chat/completions", json={"model": "m", **ASK},
                          timeout=30).status_code == 200
    wait_rows(rig.ledger, 6)
    doc = httpx.get(rig.url + "/api/savings?range=1h", timeout=30).json()
    t, route = doc["totals"], doc["routes"][0]
    assert route["prefill_ms_per_token"] == pytest.approx(0.05) and route["prefill_rate_method"] == "slope"
    assert t["prefill_s_cached"] == pytest.approx(6 * 1500 * 0.05 / 1000)
    # sent as the client sent it (no rewriting here): measured counterfactual, nothing gained
    assert t["prefill_s_saved"] == 0 and t["prefill_usd_saved"] == 0


def test_a_rewritten_requests_counterfactual_is_priced_the_same_way(rig_factory: Any,
                                                                    upstream: Any) -> None:
    from prefixgate.proxy.pipeline.rewrite import default_rewrite_fn

    _, url = upstream
    # a request that is rewritten: the clock hoisted (opt-in, MOVES_THE_MODEL_READS)
    rig = rig_factory(rewrite_fn=default_rewrite_fn(), rewrite={"hoist_volatile": True},
                      **priced_backends(url, price_per_mtok=2.0, cached_price_per_mtok=0.5))
    rules = "Follow the airline policy. Be brief. Verify the user id first. " * 40
    for minute in (15, 16):
        rig.upstream.script = Script(body=completion(usage={
            "prompt_tokens": 900, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 800}}))
        body = {"model": "m", "messages": [
            {"role": "system", "content": f"You are Helper. Now: 2025-03-04 10:{minute}. {rules}"},
            {"role": "user", "content": "Q1"}]}
        httpx.post(rig.url + "/v1/chat/completions", json=body, timeout=30,
                   headers={"x-prefixgate-session": "s"})
    r = wait_rows(rig.ledger, 2)[1]
    assert "hoist_volatile" in r["edits"] and r["cf_cached_tokens"] is not None
    assert r["cf_input_usd"] == pytest.approx(backend_input_usd(2.0, 0.5, 900, r["cf_cached_tokens"]))
