"""Real clients through the proxy in front of the real local engine (tiny random Llama; one slow
test on SmolLM2): OpenAI SDK sync/async x stream/non-stream, LangChain, Anthropic SDK (A->O)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from tests.proxy.upstream import wait_rows
from tests.servers import serve_app
from tests.tiny_model import make_tiny_model_dir, real_model_dir

SYSTEM = "You are a terse assistant for an airline. " * 8
MSGS = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello there"}]


def _engine_app(model_dir: Path, name: str, max_context: int = 1024) -> Any:
    from prefixgate.local_engine.engine import Engine, EngineConfig
    from prefixgate.local_engine.server import build_app as engine_app

    eng = Engine(EngineConfig(model_path=str(model_dir), num_kv_slots=8192,
                              max_context_len=max_context, model_name=name))
    return eng, engine_app(eng)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Ledger]]:
    """(proxy URL, ledger): proxy -> tiny engine, rewriting with the real pipeline."""
    tiny = make_tiny_model_dir(tmp_path_factory.mktemp("tiny"))
    eng, app = _engine_app(tiny, "tiny")
    try:
        with serve_app(app) as engine_url:
            policy = parse_policy({
                "backends": {"local": {"kind": "openai_compat", "base_url": engine_url + "/v1"}},
                "routes": [{"match": "*", "backend": "local"}],
                "ledger": {"path": str(tmp_path_factory.mktemp("l") / "ledger.sqlite")}})
            ledger = Ledger(policy.ledger.path)
            with serve_app(build_app(policy, ledger=ledger)) as url:
                yield url, ledger
    finally:
        eng.shutdown()


def test_openai_sdk_sync_non_stream_reports_cached_tokens_on_repeat(stack: Any) -> None:
    from openai import OpenAI

    url, ledger = stack
    client = OpenAI(base_url=url + "/v1", api_key="sk-proxy-test", max_retries=0)
    first = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=4,
                                           temperature=0)
    raw = client.chat.completions.with_raw_response.create(model="tiny", messages=MSGS,
                                                           max_tokens=4, temperature=0)
    second = raw.parse()
    assert first.choices[0].message.content == second.choices[0].message.content
    assert second.usage.prompt_tokens == first.usage.prompt_tokens > 20
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens - 16
    assert raw.headers["x-prefixgate-cached-tokens"] == str(cached)
    row = ledger.rows()[-1]
    assert (row["status"], row["cached_tokens"], row["stream"]) == ("ok", cached, 0)
    # a non-streamed answer: the TTFT is the engine's own (X-Engine-TTFT-Ms), marked as reported
    assert row["ttft_ms"] > 0 and row["ttft_source"] == "reported" and row["total_ms"] > 0
    # the engine's queue (arrival -> scheduled) and prefill (scheduled -> first token) beside it
    assert row["queue_ms"] >= 0 and row["prefill_ms"] > 0
    assert abs(row["queue_ms"] + row["prefill_ms"] - row["ttft_ms"]) <= 0.15


def test_openai_sdk_sync_stream(stack: Any) -> None:
    from openai import OpenAI

    url, ledger = stack
    before = len(ledger.rows())
    client = OpenAI(base_url=url + "/v1", api_key="sk-proxy-test", max_retries=0)
    chunks = list(client.chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert text and usage.completion_tokens == 6
    row = wait_rows(ledger, before + 1)[-1]
    assert row["stream"] == 1 and row["output_tokens"] == 6
    assert row["prompt_tokens"] == usage.prompt_tokens
    assert row["ttft_ms"] is not None and row["tpot_ms"] is not None


async def test_openai_sdk_async_stream_and_non_stream(stack: Any) -> None:
    from openai import AsyncOpenAI

    url, _ = stack
    client = AsyncOpenAI(base_url=url + "/v1", api_key="sk-proxy-test", max_retries=0)
    full = await client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=5,
                                                temperature=0)
    stream = await client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=5,
                                                  temperature=0, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == full.choices[0].message.content
    await client.close()


def test_openai_sdk_bad_input_raises_the_sdk_error_types(stack: Any) -> None:
    import openai
    from openai import OpenAI

    url, _ = stack
    client = OpenAI(base_url=url + "/v1", api_key="sk-proxy-test", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[], max_tokens=2)
    assert e.value.body["param"] == "messages"


def test_langchain_chat_openai_through_the_proxy(stack: Any) -> None:
    from langchain_openai import ChatOpenAI

    url, ledger = stack
    llm = ChatOpenAI(base_url=url + "/v1", api_key="sk-proxy-test", model="tiny",
                     max_tokens=4, temperature=0, max_retries=0)
    out = llm.invoke("Hello there")
    assert isinstance(out.content, str) and out.content
    assert ledger.rows()[-1]["status"] == "ok"


def test_anthropic_sdk_to_openai_engine_maps_usage_b08(stack: Any) -> None:
    import anthropic

    url, _ = stack
    client = anthropic.Anthropic(base_url=url, api_key="sk-proxy-test", max_retries=0)
    kw: dict[str, Any] = {"model": "tiny", "max_tokens": 5, "system": SYSTEM,
                          "messages": [{"role": "user", "content": "Hello there"}]}
    first = client.messages.create(**kw)
    second = client.messages.create(**kw)
    assert first.content[0].type == "text"
    u = second.usage
    assert u.cache_read_input_tokens > 0 and u.cache_creation_input_tokens == 0
    assert u.input_tokens + u.cache_read_input_tokens == (first.usage.input_tokens
                                                         + first.usage.cache_read_input_tokens)
    with client.messages.stream(**kw) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == "".join(b.text for b in final.content if b.type == "text")
    assert final.usage.cache_read_input_tokens == u.cache_read_input_tokens
    assert final.usage.output_tokens == 5


def test_disconnect_mid_stream_frees_the_engine_request(stack: Any) -> None:
    import httpx

    url, ledger = stack
    body = {"model": "tiny", "messages": MSGS, "max_tokens": 200, "stream": True,
            "temperature": 0}
    with httpx.Client(timeout=60) as c, c.stream("POST", url + "/v1/chat/completions",
                                                 json=body) as r:
        next(r.iter_raw())
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and ledger.rows()[-1]["status"] != "client_disconnect":
        time.sleep(0.05)
    assert ledger.rows()[-1]["status"] == "client_disconnect"


@pytest.mark.slow
def test_real_smollm2_through_the_proxy_caches_the_repeated_prefix(
        tmp_path: Path) -> None:
    from openai import OpenAI

    eng, app = _engine_app(real_model_dir(), "smollm2", max_context=2048)
    try:
        with serve_app(app) as engine_url:
            policy = parse_policy({
                "backends": {"local": {"kind": "local", "base_url": engine_url + "/v1"}},
                "routes": [{"match": "*", "backend": "local"}],
                "rewrite": {"hoist_volatile": True},  # opt-in (MOVES_THE_MODEL_READS)
                "ledger": {"path": str(tmp_path / "ledger.sqlite")}})
            with serve_app(build_app(policy)) as url:
                client = OpenAI(base_url=url + "/v1", api_key="sk-proxy-test", max_retries=0)
                msgs = [{"role": "system", "content": "The current time is 2024-05-15 15:00:01 "
                         "EST. " + SYSTEM},
                        {"role": "user", "content": "What is the capital of France?"}]
                r1 = client.chat.completions.create(model="smollm2", messages=msgs,
                                                    max_tokens=8, temperature=0)
                msgs[0]["content"] = msgs[0]["content"].replace("15:00:01", "15:00:09")
                r2 = client.chat.completions.create(model="smollm2", messages=msgs,
                                                    max_tokens=8, temperature=0)
                msgs[0]["content"] = msgs[0]["content"].replace("15:00:09", "15:00:17")
                r3 = client.chat.completions.create(model="smollm2", messages=msgs,
                                                    max_tokens=8, temperature=0)
    finally:
        eng.shutdown()
    assert r1.choices[0].message.content
    # the clock moves once it is seen changing (turn 2, whose prefix differs anyway); from turn 3
    # on the system prefix is stable: most of turn 3's prompt came from the cache
    assert r3.usage.prompt_tokens_details.cached_tokens >= 0.6 * r3.usage.prompt_tokens
    assert r2.usage.prompt_tokens_details.cached_tokens < 0.6 * r2.usage.prompt_tokens


def test_stream_without_include_usage_still_records_cached_tokens(stack: Any) -> None:
    import httpx

    url, ledger = stack
    before = len(ledger.rows())
    body = {"model": "tiny", "messages": MSGS, "max_tokens": 3, "stream": True,
            "temperature": 0}
    httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
    assert b'"usage"' not in r.content  # the client's stream is untouched
    cached = int(r.headers["x-prefixgate-cached-tokens"])
    row = wait_rows(ledger, before + 2)[-1]
    assert row["cached_tokens"] == cached > 0 and row["prompt_tokens"] > cached
