"""Fixtures: one tiny-model engine served by uvicorn for the whole module's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.servers import serve_app
from tests.tiny_model import make_tiny_model_dir

MAX_CONTEXT = 512  # tokens; small so the context-length test stays cheap


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="module")
def engine(tiny_dir: Path) -> Iterator[Any]:
    from prefixgate.local_engine.engine import Engine, EngineConfig

    eng = Engine(EngineConfig(
        model_path=str(tiny_dir), num_kv_slots=4096, max_context_len=MAX_CONTEXT,
        model_name="tiny",
    ))
    try:
        yield eng
    finally:
        eng.shutdown()


@pytest.fixture(scope="module")
def base_url(engine: Any) -> Iterator[str]:
    from prefixgate.local_engine.server import build_app

    with serve_app(build_app(engine)) as url:
        yield url
