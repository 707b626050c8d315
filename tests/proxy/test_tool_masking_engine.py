"""Tools masked instead of removed, end to end: a client -> the proxy (prune_tools on) -> our
engine (backend kind ``local``). LangChain's ``with_structured_output(method="function_calling")``
returns the object (it forces the tool); pruning keeps the tool list and binds the kept set."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, Field

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from tests.pruning.test_prune_tools import catalog
from tests.servers import serve_app
from tests.tiny_model import make_tiny_model_dir, real_model_dir

pytest.importorskip("llguidance")


class Weather(BaseModel):
    """Weather report for a city."""

    city: str = Field(max_length=30)
    degrees: int
    sunny: bool


def _stack(model_dir: Path, tmp: Path) -> Iterator[str]:
    from prefixgate.local_engine.engine import Engine, EngineConfig
    from prefixgate.local_engine.server import build_app as engine_app

    eng = Engine(EngineConfig(model_path=str(model_dir), num_kv_slots=16384,
                              max_context_len=4096, model_name="m"))
    try:
        with serve_app(engine_app(eng)) as engine_url:
            policy = parse_policy({
                "backends": {"local": {"kind": "local", "base_url": engine_url + "/v1"}},
                "routes": [{"match": "*", "backend": "local"}],
                "rewrite": {"prune_tools": True},
                "ledger": {"path": str(tmp / "ledger.sqlite")}})
            with serve_app(build_app(policy, ledger=Ledger(policy.ledger.path))) as url:
                yield url
    finally:
        eng.shutdown()


@pytest.fixture(scope="module")
def tiny_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tiny = make_tiny_model_dir(tmp_path_factory.mktemp("tiny"), max_position_embeddings=4096)
    yield from _stack(tiny, tmp_path_factory.mktemp("l"))


def _structured(url: str) -> Any:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=url + "/v1", api_key="sk-proxy-test", model="m", max_tokens=300,
                     temperature=0, max_retries=0)
    return llm.with_structured_output(Weather, method="function_calling")


def test_langchain_structured_output_returns_the_object_tiny(tiny_url: str) -> None:
    out = _structured(tiny_url).invoke("Weather in Oslo: 3 degrees, cloudy.")
    assert isinstance(out, Weather)


@pytest.mark.slow
def test_langchain_structured_output_returns_the_object_smollm2(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    for url in _stack(real_model_dir(), tmp_path_factory.mktemp("l")):
        for prompt in ("Weather in Oslo: 3 degrees, cloudy.", "Paris is sunny at 25 degrees."):
            assert isinstance(_structured(url).invoke(prompt), Weather)


def test_pruned_tools_are_masked_not_removed_on_the_engine(tiny_url: str) -> None:
    tools = catalog("openai")
    r = httpx.post(f"{tiny_url}/v1/chat/completions", timeout=120, json={
        "model": "m", "tools": tools, "tool_choice": "required", "max_tokens": 300,
        "temperature": 1.0, "seed": 5,
        "messages": [{"role": "user", "content": "Weather forecast for Oslo tomorrow?"}]})
    assert r.status_code == 200, r.text
    assert "prune_tools" in r.headers["x-prefixgate-edits"]
    assert r.json()["usage"]["prompt_tokens"] > 40 * 40  # all 40 tools still in the prompt
    calls = r.json()["choices"][0]["message"]["tool_calls"]
    assert len(calls) == 1 and not calls[0]["function"]["name"].startswith("filler_tool")
