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
            # every prompt token's KV came over the link; none was recomputed, and none is
            # reported as a cache hit (issue 34, item 13)
            assert answer["usage"]["prompt_tokens_details"] == {
                "cached_tokens": 0, "span_reused_tokens": 0, "kv_transfer_tokens": prompt}
            assert resp.headers["x-engine-cached-tokens"] == "0"
            assert resp.headers["x-engine-transfer-tokens"] == str(prompt)
            metrics = (await client.get(decode.removesuffix("/v1") + "/metrics")).text
            assert f'engine_prompt_tokens_by_source_total{{source="external_kv_transfer"}} ' \
                   f'{float(prompt)}' in metrics
            assert "engine_kv_transfer_pending 0.0" in metrics


def _wait(url: str, what: str, end: float) -> str:
    """GET ``url`` until its text holds ``what`` (or ``end``, monotonic s); the last text."""
    import time

    text = ""
    while time.monotonic() < end:
        try:
            text = httpx.get(url, timeout=2).text
            if what in text:
                return text
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    return text


@pytest.mark.slow
def test_a_restarted_decode_engine_pairs_again_and_splits_move_kv_again(tmp_path: Path) -> None:
    """Issue 34, item 9: the decode engine dies and is started again on the same addresses; the
    running prefill engine pairs with it (kv_link_repairs_total 1, /health says so) and the next
    split request's prompt comes over the link again (not decode-only)."""
    import time

    from tests.engine_pd.pd_pair import engine, free_port

    model = real_model_dir()
    pp, dp = free_port(), free_port()
    link = f"tcp://127.0.0.1:{free_port()}"
    procs = [engine(model, dp, "decode", link, None, tmp_path / "decode.log", 6.0),
             engine(model, pp, "prefill", link, f"http://127.0.0.1:{dp}",
                    tmp_path / "prefill.log", 6.0)]
    try:
        end = time.monotonic() + 300
        assert "engine_kv_link_up 1.0" in _wait(f"http://127.0.0.1:{pp}/metrics",
                                                "engine_kv_link_up 1.0", end)
        procs[0].kill()  # the decode engine dies
        procs[0].wait(30)
        assert "engine_kv_link_up 0.0" in _wait(f"http://127.0.0.1:{pp}/metrics",
                                                "engine_kv_link_up 0.0", end)
        procs[0] = engine(model, dp, "decode", link, None, tmp_path / "decode2.log", 6.0)
        health = _wait(f"http://127.0.0.1:{pp}/health", '"repairs":1', end)
        assert '"up":true' in health and '"repairs":1' in health, health
        assert '"up":true' in _wait(f"http://127.0.0.1:{dp}/health", '"up":true', end)
        client = httpx.Client(timeout=120)

        def send_sync(url: str, body: dict[str, object]) -> httpx.Response:
            return client.post(url, json=body)

        pre = send_sync(f"http://127.0.0.1:{pp}/v1/chat/completions",
                        {**BODY, "max_tokens": 1, "stream": False,
                         "kv_transfer_params": {"do_remote_decode": True}})
        params = pre.json()["kv_transfer_params"]
        assert params is not None and params["transfer_tokens"] > 0
        got = send_sync(f"http://127.0.0.1:{dp}/v1/chat/completions",
                        {**BODY, "kv_transfer_params": params})
        assert got.status_code == 200
        details = got.json()["usage"]["prompt_tokens_details"]
        metrics = httpx.get(f"http://127.0.0.1:{dp}/metrics").text
        assert details.get("kv_transfer_tokens") == got.json()["usage"]["prompt_tokens"], (
            details, [m for m in metrics.splitlines() if "kv_" in m and m[0] != "#"])
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except Exception:
                p.kill()
