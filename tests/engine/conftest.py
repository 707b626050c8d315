"""Fixtures for engine-core tests: the tiny random Llama directory and an engine factory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.tiny_model import make_tiny_model_dir


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny_llama_core"))


@pytest.fixture
def make_engine(tiny_dir: Path) -> Iterator[Callable[..., Any]]:
    """``make_engine(**EngineConfig fields)`` → an Engine on the tiny model, shut down after."""
    from prefixgate.local_engine.engine import Engine, EngineConfig

    made: list[Any] = []

    def make(**kw: Any) -> Any:
        kw.setdefault("num_kv_slots", 4096)
        kw.setdefault("max_context_len", 1024)
        eng = Engine(EngineConfig(model_path=str(kw.pop("model_path", tiny_dir)), **kw))
        made.append(eng)
        return eng

    yield make
    for eng in made:
        eng.shutdown()


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One shared default engine on the tiny model (module scope)."""
    from prefixgate.local_engine.engine import Engine, EngineConfig

    d = make_tiny_model_dir(tmp_path_factory.mktemp("tiny_llama_shared"))
    eng = Engine(EngineConfig(model_path=str(d), num_kv_slots=8192, max_context_len=1024))
    yield eng
    eng.shutdown()
