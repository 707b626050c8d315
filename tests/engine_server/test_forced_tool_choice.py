"""A forced tool_choice binds on the engine: 100 % valid calls of allowed tools (tiny model,
random weights = worst case), tool_choice "none" forbids calls, bad choices are 400s."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.engine_server.forced_tools import CHOICES, PROMPTS, TOOLS, valid_forced_answer
from tests.servers import serve_app

pytest.importorskip("llguidance")


@pytest.fixture(scope="module")
def engine(tiny_dir: Path) -> Iterator[Any]:
    from prefixgate.local_engine.engine import Engine, EngineConfig

    eng = Engine(EngineConfig(model_path=str(tiny_dir), num_kv_slots=8192,
                              max_context_len=2048, model_name="tiny"))
    try:
        yield eng
    finally:
        eng.shutdown()


@pytest.fixture(scope="module")
def base_url(engine: Any) -> Iterator[str]:
    from prefixgate.local_engine.server import build_app

    with serve_app(build_app(engine)) as url:
        yield url


def _chat(base_url: str, prompt: str, choice: Any, **extra: Any) -> httpx.Response:
    body = {"model": "tiny", "messages": [{"role": "user", "content": prompt}], "tools": TOOLS,
            "tool_choice": choice, "max_tokens": 400, "seed": 3, **extra}
    return httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)


@pytest.mark.parametrize("choice", CHOICES, ids=["required", "named", "allowed_tools"])
def test_forced_choice_always_yields_a_valid_call(base_url: str, choice: Any) -> None:
    for prompt in PROMPTS:
        for temperature in (0.0, 1.0):
            r = _chat(base_url, prompt, choice, temperature=temperature)
            assert r.status_code == 200, r.text
            assert valid_forced_answer(r.json(), choice), r.json()["choices"][0]


def test_forced_choice_streams_a_valid_call(base_url: str) -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", timeout=120, json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
            "tool_choice": choice, "max_tokens": 400, "stream": True}) as r:
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: {")]
    text = "".join(lines)
    assert '"name":"get_weather"' in text.replace(" ", "") and '"tool_calls"' in text


def test_none_forbids_calls(base_url: str) -> None:
    r = _chat(base_url, "Weather in Paris?", "none", max_tokens=60)
    msg = r.json()["choices"][0]["message"]
    assert r.status_code == 200 and not msg.get("tool_calls")
    assert "<tool_call>" not in (msg["content"] or "")


def test_unknown_named_tool_is_a_400(base_url: str) -> None:
    r = _chat(base_url, "hi", {"type": "function", "function": {"name": "nope"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"


@pytest.mark.slow
def test_forced_choice_on_smollm2_is_always_a_valid_call() -> None:
    from prefixgate.local_engine.engine import Engine, EngineConfig
    from prefixgate.local_engine.server import build_app
    from tests.tiny_model import real_model_dir

    eng = Engine(EngineConfig(model_path=str(real_model_dir()), max_context_len=2048))
    try:
        with serve_app(build_app(eng)) as url:
            for choice in CHOICES:
                for prompt in PROMPTS[:2]:
                    r = _chat(url, prompt, choice, temperature=0, max_tokens=200)
                    assert valid_forced_answer(r.json(), choice), r.json()["choices"][0]
    finally:
        eng.shutdown()
