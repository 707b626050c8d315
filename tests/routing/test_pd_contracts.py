"""The P/D driver against contract-exact fakes of vLLM, SGLang and llm-d (aiohttp on loopback):
each side receives exactly what its project's own proxy sends, and the decode answer comes back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import pytest
from aiohttp import web

from prefixgate.config.pd_settings import PDSettings
from prefixgate.proxy.routing.pd.drive import DECISIONS, PDDriver

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi " * 40}], "max_tokens": 7,
        "stream": True, "stream_options": {"include_usage": True}, "min_tokens": 2}
PREFILL_PARAMS = {"do_remote_prefill": True, "do_remote_decode": False,
                  "remote_engine_id": "eng-1", "remote_block_ids": [3, 4, 5],
                  "remote_host": "10.0.0.1", "remote_port": 5600, "tp_size": 1}


class Fake:
    """One fake server: records (path, headers, body) of each request."""

    def __init__(self, answer: Any, status: int = 200, cached: int = 0, prompt: int = 2000,
                 match_status: int = 200) -> None:
        self.seen: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.answer, self.status, self.cached, self.prompt = answer, status, cached, prompt
        self.match_status = match_status
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.seen.append((request.path, {k.lower(): v for k, v in request.headers.items()}, body))
        if request.path.endswith("/cache/match"):
            return web.json_response({"cached_tokens": self.cached, "prompt_tokens": self.prompt},
                                     status=self.match_status)
        answer = self.answer(body) if callable(self.answer) else self.answer
        return web.json_response(answer, status=self.status)

    def completions(self) -> list[tuple[str, dict[str, str], dict[str, Any]]]:
        return [s for s in self.seen if not s[0].endswith("/cache/match")]


async def _serve(fake: Fake) -> web.AppRunner:
    app = web.Application()
    app.router.add_post("/{tail:.*}", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    fake.url = f"http://127.0.0.1:{port}/v1"
    return runner


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as c:
        yield c


def _driver(client: httpx.AsyncClient) -> PDDriver:
    async def send(url: str, headers: Mapping[str, bytes], body: bytes,
                   timeout_s: float) -> httpx.Response:
        req = client.build_request("POST", url, headers={k: v.decode() for k, v in headers.items()},
                                   content=body)
        return await client.send(req, stream=True)
    return PDDriver(send)


async def _run(client: httpx.AsyncClient, prefill: Fake, decode: Fake, **pd: Any
               ) -> tuple[dict[str, Any], Any]:
    runners = [await _serve(prefill), await _serve(decode)]
    try:
        settings = PDSettings(prefill=prefill.url, decode=decode.url, **pd)
        resp, dec = await _driver(client).drive(settings, "/chat/completions", BODY,
                                                {"authorization": b"Bearer k"}, "req-42")
        data = (await resp.aread())
        await resp.aclose()
        await asyncio.sleep(0.05)  # SGLang's prefill answer is drained in the background
        import json
        return json.loads(data), dec
    finally:
        for r in runners:
            await r.cleanup()


async def test_vllm_prefill_request_and_params_handed_verbatim(client: httpx.AsyncClient) -> None:
    prefill = Fake({"choices": [{"message": {"content": "x"}}], "kv_transfer_params": PREFILL_PARAMS})
    decode = Fake({"choices": [{"message": {"content": "decoded"}}]})
    answer, dec = await _run(client, prefill, decode, protocol="vllm")
    assert answer["choices"][0]["message"]["content"] == "decoded"
    assert dec.split and dec.reason == "split"
    [(path, ph, pbody)] = prefill.completions()
    assert path == "/v1/chat/completions"
    assert pbody["max_tokens"] == 1 and pbody["stream"] is False
    assert "stream_options" not in pbody and "min_tokens" not in pbody
    assert pbody["kv_transfer_params"] == {
        "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
        "remote_block_ids": None, "remote_host": None, "remote_port": None}
    assert pbody["messages"] == BODY["messages"]
    [(_, dh, dbody)] = decode.completions()
    assert dbody["kv_transfer_params"] == PREFILL_PARAMS
    assert {k: v for k, v in dbody.items() if k != "kv_transfer_params"} == BODY
    assert ph["x-request-id"] == dh["x-request-id"] == "req-42"
    assert ph["authorization"] == dh["authorization"] == "Bearer k"


async def test_vllm_failed_prefill_falls_back_to_decode_only(client: httpx.AsyncClient) -> None:
    prefill = Fake({"error": {"message": "down"}}, status=503)
    decode = Fake({"choices": [{"message": {"content": "alone"}}]})
    answer, dec = await _run(client, prefill, decode, protocol="vllm")
    assert answer["choices"][0]["message"]["content"] == "alone"
    assert not dec.split and dec.reason == "prefill_failed"
    [(_, _, dbody)] = decode.completions()
    assert "kv_transfer_params" not in dbody and dbody == BODY


async def test_sglang_same_bootstrap_body_to_both(client: httpx.AsyncClient) -> None:
    prefill = Fake({"choices": [{"message": {"content": "p"}}]})
    decode = Fake({"choices": [{"message": {"content": "d"}}]})
    answer, dec = await _run(client, prefill, decode, protocol="sglang", bootstrap_port=8998)
    assert answer["choices"][0]["message"]["content"] == "d" and dec.split
    [(_, ph, pbody)] = prefill.completions()
    [(_, dh, dbody)] = decode.completions()
    assert pbody == dbody
    assert pbody["bootstrap_host"] == "127.0.0.1" and pbody["bootstrap_port"] == 8998
    assert isinstance(pbody["bootstrap_room"], int) and 0 <= pbody["bootstrap_room"] < 2 ** 63
    assert {k: v for k, v in pbody.items() if not k.startswith("bootstrap_")} == BODY
    assert ph["x-request-id"] == dh["x-request-id"]


async def test_llmd_names_the_prefiller_in_a_header(client: httpx.AsyncClient) -> None:
    prefill = Fake({"never": "called"})
    decode = Fake({"choices": [{"message": {"content": "d"}}]})
    answer, dec = await _run(client, prefill, decode, protocol="llmd")
    assert prefill.completions() == [] and dec.split
    [(_, dh, dbody)] = decode.completions()
    port = prefill.url.split(":")[-1].split("/")[0]
    assert dh["x-prefiller-host-port"] == f"127.0.0.1:{port}"
    assert dbody == BODY


async def test_a_decode_side_prefix_hit_colocates(client: httpx.AsyncClient) -> None:
    prefill = Fake({"never": "called"})
    decode = Fake({"choices": [{"message": {"content": "d"}}]}, cached=3000, prompt=4000)
    before = DECISIONS[("colocate", "prefix_hit")]
    _, dec = await _run(client, prefill, decode, protocol="vllm")
    assert not dec.split and dec.reason == "prefix_hit" and dec.cached_tokens == 3000
    assert prefill.completions() == [] and decode.completions()[0][2] == BODY
    assert DECISIONS[("colocate", "prefix_hit")] == before + 1


async def test_a_short_uncached_part_colocates(client: httpx.AsyncClient) -> None:
    prefill = Fake({"never": "called"})
    decode = Fake({"choices": []}, cached=0, prompt=100)
    _, dec = await _run(client, prefill, decode, protocol="sglang")
    assert not dec.split and dec.reason == "short_uncached" and prefill.completions() == []


async def test_without_a_cache_match_the_prompt_is_estimated(client: httpx.AsyncClient) -> None:
    prefill = Fake({"choices": [], "kv_transfer_params": PREFILL_PARAMS})
    decode = Fake({"choices": []}, match_status=404)
    _, dec = await _run(client, prefill, decode, protocol="vllm", split_min_uncached_tokens=10)
    assert dec.cached_tokens == 0 and dec.prompt_tokens > 10 and dec.split


async def test_decisions_reach_the_proxy_metrics(client: httpx.AsyncClient) -> None:
    from prometheus_client import generate_latest

    from prefixgate.proxy.observe.metrics import ProxyMetrics

    decode = Fake({"choices": []}, cached=0, prompt=10)
    await _run(client, Fake({}), decode, protocol="vllm")
    n = DECISIONS[("colocate", "short_uncached")]
    text = generate_latest(ProxyMetrics().registry).decode()
    assert f'prefixgate_pd_decisions_total{{decision="colocate",reason="short_uncached"}} {float(n)}' \
        in text


async def test_a_token_prompt_is_matched_by_its_ids(client: httpx.AsyncClient) -> None:
    decode = Fake({"choices": []}, cached=3000, prompt=4000)
    runners = [await _serve(decode)]
    try:
        pd = PDSettings(prefill="http://127.0.0.1:9/v1", decode=decode.url)
        body = {"model": "m", "prompt": list(range(50)), "max_tokens": 2}
        resp, dec = await _driver(client).drive(pd, "/completions", body, {})
        await resp.aread()
        await resp.aclose()
    finally:
        for r in runners:
            await r.cleanup()
    match = [s for s in decode.seen if s[0].endswith("/cache/match")]
    assert match[0][2] == {"input_ids": list(range(50))}
    assert not dec.split and dec.reason == "prefix_hit"
