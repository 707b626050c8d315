"""A ``pd`` backend behind the proxy: two tiny engines as prefill and decode (loopback KV link)
serve a chat request split (the decode side holds nothing: vLLM contract, real KV imported) with
the colocated answer; the follow-up turn, whose prefix the decode side holds, is colocated."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from prefixgate.proxy.routing.pd.drive import DECISIONS
from tests.engine_pd.conftest import LoopbackLink
from tests.proxy.upstream import wait_rows
from tests.servers import serve_app
from tests.tiny_model import make_tiny_model_dir


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str, Any, Any]]:
    from prefixgate.local_engine.engine import Engine, EngineConfig
    from prefixgate.local_engine.pd.roles import DecodeRole, PrefillRole
    from prefixgate.local_engine.server import build_app as engine_app
    from prefixgate.local_engine.server.pd_handoff import PDHandoff
    from prefixgate.local_engine.server.pd_setup import layout_of

    tiny = make_tiny_model_dir(tmp_path_factory.mktemp("tiny_llama_pd_proxy"))
    with ExitStack() as stack:
        engines = []
        for _ in range(3):
            eng = Engine(EngineConfig(model_path=str(tiny), num_kv_slots=4096,
                                      max_context_len=1024, model_name="tiny"))
            stack.callback(eng.shutdown)
            engines.append(eng)
        colo, pre, dec = engines
        link = LoopbackLink(layout_of(pre, 1024))
        prole, drole = PrefillRole(pre, link), DecodeRole(dec, link)  # type: ignore[arg-type]
        link.decode = drole
        prole.start()
        stack.callback(prole.stop)
        d_url = stack.enter_context(serve_app(engine_app(dec, pd=PDHandoff("decode", decode_role=drole))))
        p_url = stack.enter_context(serve_app(engine_app(pre, pd=PDHandoff(
            "prefill", prefill_role=prole, peer_url=d_url + "/v1"))))
        c_url = stack.enter_context(serve_app(engine_app(colo)))
        yield p_url + "/v1", d_url + "/v1", c_url + "/v1", dec, link


def test_a_pd_backend_splits_then_colocates_the_follow_up(pair: tuple[str, str, str, Any, Any],
                                                           tmp_path: Path) -> None:
    prefill, decode, colo, dec, link = pair
    policy = parse_policy({
        "backends": {"pd": {"kind": "openai_compat", "base_url": decode,
                            "pd": {"prefill": prefill, "decode": decode, "protocol": "vllm",
                                   "split_min_uncached_tokens": 30}}},
        "routes": [{"match": "*", "backend": "pd"}],
        "ledger": {"path": str(tmp_path / "ledger.sqlite")}})
    ledger = Ledger(policy.ledger.path)
    app = build_app(policy, ledger=ledger, rewrite_fn=None, analyze=False)
    msgs = [{"role": "user", "content": "Plan a trip to the sea, day by day, with a budget."}]
    body = {"model": "tiny", "messages": msgs, "max_tokens": 4, "temperature": 0}
    split0 = DECISIONS[("split", "split")]
    with serve_app(app) as url, httpx.Client(timeout=60) as client:
        want = client.post(colo + "/chat/completions", json=body).json()
        got = client.post(url + "/v1/chat/completions", json=body)
        assert got.status_code == 200, got.text[:300]
        assert got.json()["choices"][0]["message"]["content"] == \
            want["choices"][0]["message"]["content"]
        assert DECISIONS[("split", "split")] == split0 + 1
        assert dec.stats()["cache_hit_tokens_total"] >= got.json()["usage"]["prompt_tokens"] - 1
        follow = {**body, "messages": msgs + [
            {"role": "assistant", "content": got.json()["choices"][0]["message"]["content"]},
            {"role": "user", "content": "Shorter."}]}
        colocated0 = sum(n for (d, _), n in DECISIONS.items() if d == "colocate")
        assert client.post(url + "/v1/chat/completions", json=follow).status_code == 200
        assert sum(n for (d, _), n in DECISIONS.items() if d == "colocate") == colocated0 + 1
        assert client.get(url + "/healthz").json()["pd_links"]["pd"]["link"] == "up"
        link.dead = True  # the engines' KV link is lost: the next split runs decode-only
        lost = {**body, "messages": [{"role": "user", "content": "Another trip, to the mountains "
                                      "this time: plan it day by day for two weeks, with a budget, "
                                      "a packing list, the trains to take and where to sleep."}]}
        assert client.post(url + "/v1/chat/completions", json=lost).status_code == 200
        health = client.get(url + "/healthz").json()
        assert health["pd_links"]["pd"]["link"] == "down" and health["status"] == "ok"
        link.dead = False
    rows = wait_rows(ledger, 3)
    assert [r["deployment"] for r in rows] == ["pd/pd-split:split", "pd/pd-colocate:short_uncached",
                                               "pd/pd-colocate:prefill_failed"]
    # the split's prompt came over the link: no cache hit in the ledger (issue 34, item 13)
    assert rows[0]["prompt_tokens"] > 0 and rows[0]["cached_tokens"] == 0
