"""End to end: our engine split in two processes (real SmolLM2, gloo, real KV moved), driven by
the proxy's vLLM-contract driver; the greedy answer is byte-identical to the colocated one."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import httpx
import pytest

from prefixgate.config.pd_settings import PDSettings
from prefixgate.proxy.routing.pd.drive import PDDriver
from tests.engine_pd.pd_pair import pd_pair
from tests.tiny_model import real_model_dir

BODY = {"model": "m", "messages": [{"role": "user", "content": "Name three colors of the rainbow."}],
        "max_tokens": 10, "temperature": 0}


@pytest.mark.slow
async def test_split_answer_is_byte_identical_to_colocated(tmp_path: Path) -> None:
    model = real_model_dir()
    with pd_pair(model, tmp_path) as (prefill, decode):
        async with httpx.AsyncClient(timeout=120) as client:
            colo = await client.post(prefill + "/chat/completions", json=BODY)  # no P/D: colocated
            colo_text = colo.json()["choices"][0]["message"]["content"]

            async def send(url: str, headers: Mapping[str, bytes], body: bytes,
                           timeout_s: float) -> httpx.Response:
                req = client.build_request("POST", url, content=body, headers={
                    "content-type": "application/json",
                    **{k: v.decode() for k, v in headers.items()}})
                return await client.send(req, stream=True)

            pd = PDSettings(prefill=prefill, decode=decode, protocol="vllm",
                            split_min_uncached_tokens=0)
            resp, dec = await PDDriver(send).drive(pd, "/chat/completions", BODY, {}, "e2e-1")
            await resp.aread()
            assert dec.split and resp.status_code == 200
            answer = resp.json()
            assert answer["choices"][0]["message"]["content"] == colo_text
            prompt = answer["usage"]["prompt_tokens"]
            # every prompt token's KV came over the link; none was recomputed
            assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt
            assert resp.headers["x-engine-cached-tokens"] == str(prompt)
            metrics = (await client.get(decode.removesuffix("/v1") + "/metrics")).text
            assert f'engine_prompt_tokens_by_source_total{{source="external_kv_transfer"}} ' \
                   f'{float(prompt)}' in metrics
            assert "engine_kv_transfer_pending 0.0" in metrics
