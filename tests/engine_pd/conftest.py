"""Fixtures for P/D tests: tiny-model engines and a loopback link (no process group)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.tiny_model import make_tiny_model_dir


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny_llama_pd"))


@pytest.fixture
def make_engine(tiny_dir: Path) -> Iterator[Callable[..., Any]]:
    """``make_engine(**EngineConfig fields)`` -> an Engine on the tiny model, shut down after."""
    from prefixgate.local_engine.engine import Engine, EngineConfig

    made: list[Any] = []

    def make(**kw: Any) -> Any:
        kw.setdefault("num_kv_slots", 2048)
        kw.setdefault("max_context_len", 512)
        eng = Engine(EngineConfig(model_path=str(tiny_dir), **kw))
        made.append(eng)
        return eng

    yield make
    for eng in made:
        eng.shutdown()


class LoopbackLink:
    """``PDLink``'s sending surface, delivering straight to a ``DecodeRole`` in this process
    (what crosses the process group in production: tokens, salt, the filled KV view)."""

    def __init__(self, layout: Any) -> None:
        self.layout = layout
        self.secret = PD_SECRET
        self.timeout_s = 30.0
        self.dead = False
        self.ready = threading.Event()
        self.ready.set()
        self.decode: Any = None
        self.fail_next = False
        self.sent = 0

    def start(self) -> None:
        pass

    def close(self) -> None:
        self.dead = True

    def reset(self) -> None:
        self.dead = True
        self.ready.clear()

    def ping(self) -> None:
        self.pings = getattr(self, "pings", 0) + 1

    def send(self, transfer_id: int, start: int, tokens: list[int], extra_key: bytes | None,
             fill: Callable[[torch.Tensor], None]) -> None:
        from prefixgate.local_engine.pd.link import LinkDead, Received

        lay = self.layout
        view = torch.zeros(lay.layers, 2, len(tokens) - start, lay.heads, lay.head_dim,
                           dtype=lay.dtype)
        fill(view)
        if self.fail_next:
            self.dead = True
            raise LinkDead("peer gone mid-send")
        self.sent += 1
        self.decode.on_transfer(Received(transfer_id, start, list(tokens), extra_key, view))


PD_SECRET = b"test-pd-secret-0123456789abcdef"
"""The shared secret of the test pairs (``pd.auth``)."""
