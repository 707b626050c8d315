"""Issue 33 end to end: the proxy in front of our engine (tiny random Llama) — a session whose
clock changes between two turns is served by span reuse, the proxy records the engine's
``span_reused_tokens``, credits them to ``span reuse (engine)`` and marks the break bridged."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from prefixgate.cache.ledger.attribution import SPAN_REUSE
from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from prefixgate.proxy.cli import app as cli
from tests.proxy.upstream import wait_rows
from tests.servers import serve_app
from tests.tiny_model import make_tiny_model_dir

RULES = " ".join(f"Rule {i}: verify the booking code, quote the fare class and be brief."
                 for i in range(12))


def _turn(clock: str, questions: int) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [{"role": "system",
                                   "content": f"The current time is {clock}.\n{RULES}"}]
    for i in range(questions):
        msgs += [{"role": "user", "content": f"Question {i}: can I change my flight?"},
                 {"role": "assistant", "content": f"Answer {i}: yes, for a fee."}]
    msgs.append({"role": "user", "content": "And my seat?"})
    return {"model": "tiny", "max_tokens": 2, "temperature": 0, "messages": msgs}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Ledger]]:
    from prefixgate.local_engine.engine import Engine, EngineConfig
    from prefixgate.local_engine.server import build_app as engine_app

    if "span_reuse" not in EngineConfig.__dataclass_fields__:
        pytest.skip("the engine has no span reuse yet (branch s32/span-engine)")
    tiny = make_tiny_model_dir(tmp_path_factory.mktemp("tiny"))
    eng = Engine(EngineConfig(model_path=str(tiny), num_kv_slots=8192, max_context_len=1024,
                              model_name="tiny"))
    try:
        with serve_app(engine_app(eng)) as engine_url:
            policy = parse_policy({
                "backends": {"local": {"kind": "openai_compat", "base_url": engine_url + "/v1"}},
                "routes": [{"match": "*", "backend": "local"}],
                "ledger": {"path": str(tmp_path_factory.mktemp("l") / "ledger.sqlite")}})
            ledger = Ledger(policy.ledger.path)
            with serve_app(build_app(policy, ledger=ledger)) as url:
                yield url, ledger
    finally:
        eng.shutdown()


def test_a_changed_clock_is_bridged_by_the_engine_and_recorded(stack: Any) -> None:
    url, ledger = stack
    headers = {"x-prefixgate-session": "clock"}
    httpx.post(url + "/v1/chat/completions", json=_turn("2025-03-04 10:15", 1), timeout=120,
               headers=headers)
    r = httpx.post(url + "/v1/chat/completions", json=_turn("2025-03-04 10:16", 2), timeout=120,
                   headers=headers)
    usage = r.json()["usage"]
    span = usage["prompt_tokens_details"]["span_reused_tokens"]
    assert span > 50  # the rules after the clock, and the first turn, were reused
    assert r.headers["x-prefixgate-span-reused-tokens"] == str(span)
    row = wait_rows(ledger, 2)[-1]
    assert row["span_reused_tokens"] == span
    assert row["cf_cached_tokens"] == row["cached_tokens"] - span  # a prefix cache's share
    res = CliRunner().invoke(cli, ["report", "--ledger", ledger.path, "--json"])
    tech = next(t for t in json.loads(res.output)["by_technique"] if t["technique"] == SPAN_REUSE)
    assert tech["saved_tokens"] == span
    res = CliRunner().invoke(cli, ["report", "--ledger", ledger.path, "--breaks"])
    assert res.exit_code == 0, res.output
    assert f"bridged by the engine ({span} tokens reused" in " ".join(res.output.split())
