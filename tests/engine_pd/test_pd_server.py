"""The engine's HTTP side with P/D roles (tiny model, loopback link): a vLLM-shaped prefill
request answers with kv_transfer_params, the decode request carrying them is served from the
imported KV with the colocated answer, and misuse is a 400 naming the field."""

from __future__ import annotations

import json
from typing import Any

import httpx

from prefixgate.local_engine.pd.auth import ticket_tag
from prefixgate.local_engine.pd.roles import DecodeRole, PrefillRole
from prefixgate.local_engine.server import build_app
from prefixgate.local_engine.server.pd_handoff import PDHandoff
from prefixgate.local_engine.server.pd_setup import layout_of
from tests.engine_pd.conftest import PD_SECRET, LoopbackLink

PROMPT = list(range(400, 450))
BODY = {"model": "m", "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
PREFILL = {**BODY, "max_tokens": 1, "stream": False,
           "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}}


def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://e")


async def test_prefill_then_decode_over_http_matches_colocated(make_engine: Any) -> None:
    colo_eng, pre, dec = make_engine(), make_engine(), make_engine()
    link = LoopbackLink(layout_of(pre, 256))
    prole, drole = PrefillRole(pre, link), DecodeRole(dec, link)  # type: ignore[arg-type]
    link.decode = drole
    prole.start()
    p_app = build_app(pre, pd=PDHandoff("prefill", prefill_role=prole, port=1))
    d_app = build_app(dec, pd=PDHandoff("decode", decode_role=drole))
    async with _client(build_app(colo_eng)) as c, _client(p_app) as pc, _client(d_app) as dc:
        colo = (await c.post("/v1/completions", json=BODY)).json()
        first = (await pc.post("/v1/completions", json=PREFILL)).json()
        params = first["kv_transfer_params"]
        assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
        assert params["transfer_tokens"] == len(PROMPT) and params["transfer_id"] > 0
        assert len(params["first_token_ids"]) == 1  # the token the prefill request sampled
        answer = (await dc.post("/v1/completions", json={**BODY, "kv_transfer_params": params}))
        assert answer.status_code == 200
        got = answer.json()
        assert got["choices"][0]["text"] == colo["choices"][0]["text"]
        # the transferred prompt is no cache hit: reported apart (issue 34, item 13)
        assert got["usage"]["prompt_tokens_details"] == {"cached_tokens": 0, "span_reused_tokens": 0,
                                                         "kv_transfer_tokens": len(PROMPT)}
        assert answer.headers["x-engine-cached-tokens"] == "0"
        assert answer.headers["x-engine-transfer-tokens"] == str(len(PROMPT))
        assert got["usage"]["completion_tokens"] == BODY["max_tokens"]
        assert dec.stats()["decode_tokens_total"] == BODY["max_tokens"] - 1  # none for token 1
        metrics = (await dc.get("/metrics")).text
        assert f'engine_prompt_tokens_by_source_total{{source="external_kv_transfer"}} ' \
               f'{float(len(PROMPT))}' in metrics
        assert 'engine_prompt_tokens_by_source_total{source="computed"} 0.0' in metrics
        dec.call(lambda: None).result(timeout=10)
        assert dec.cache.protected_size == 0 and drole.pending_count() == 0
        # a streamed decode request: the handed-over first token, then the rest; the import's
        # lock is dropped when it ends
        prompt2 = list(range(500, 540))
        pre2 = {**PREFILL, "prompt": prompt2}
        params2 = (await pc.post("/v1/completions", json=pre2)).json()["kv_transfer_params"]
        colo2 = (await c.post("/v1/completions", json={**BODY, "prompt": prompt2})).json()
        parts: list[str] = []
        async with dc.stream("POST", "/v1/completions", json={
                **BODY, "prompt": prompt2, "stream": True, "kv_transfer_params": params2,
                "stream_options": {"include_usage": True}}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    parts.append(line)
        chunks = [json.loads(x[6:]) for x in parts]
        texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
        usage = [c["usage"] for c in chunks if c.get("usage")][-1]
        assert usage["prompt_tokens_details"] == {"cached_tokens": 0, "span_reused_tokens": 0,
                                                  "kv_transfer_tokens": len(prompt2)}
        assert "".join(texts) == colo2["choices"][0]["text"] and len(texts) >= 2
        dec.call(lambda: None).result(timeout=10)
        assert dec.cache.protected_size == 0 and drole.pending_count() == 0
        # misuse: a streamed prefill request, a prefill request on the decode side
        bad = await pc.post("/v1/completions", json={**PREFILL, "stream": True})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "stream"
        wrong = await dc.post("/v1/completions", json=PREFILL)
        assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "kv_transfer_params"
    prole.stop()


async def test_a_decode_request_whose_kv_never_came_recomputes(make_engine: Any) -> None:
    colo_eng, dec = make_engine(), make_engine()
    link = LoopbackLink(layout_of(dec, 256))
    drole = DecodeRole(dec, link, timeout_s=0.2)  # type: ignore[arg-type]
    d_app = build_app(dec, pd=PDHandoff("decode", decode_role=drole))
    async with _client(build_app(colo_eng)) as c, _client(d_app) as dc:
        colo = (await c.post("/v1/completions", json=BODY)).json()
        params = {"do_remote_prefill": True, "do_remote_decode": False, "transfer_id": 99,
                  "transfer_tag": ticket_tag(PD_SECRET, 99, [], PROMPT, None)}
        got = (await dc.post("/v1/completions", json={**BODY, "kv_transfer_params": params})).json()
        assert got["choices"][0]["text"] == colo["choices"][0]["text"]
        assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert drole.stats()["kv_transfer_failures_total:not_arrived"] == 1
