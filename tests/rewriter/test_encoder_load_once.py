"""An encoding is loaded once however many threads ask for it at the same time (issue 25)."""

from __future__ import annotations

import threading
import time

import pytest

from prefixgate.rewriter.analysis import tokens


def test_concurrent_first_uses_load_the_encoding_once(monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[str] = []

    def slow_load(name: str) -> object:
        loads.append(name)
        time.sleep(0.05)
        return object()

    monkeypatch.setattr(tokens, "_load_encoder", slow_load)
    monkeypatch.setattr(tokens, "_ENCODERS", {})
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(tokens._encoder("x_base")))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert loads == ["x_base"]
    assert len(got) == 8 and all(g is got[0] for g in got)
    tokens._encoder("y_base")
    assert loads == ["x_base", "y_base"]  # another encoding is its own load


def test_warming_loads_every_encoding_a_model_can_name(monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[str] = []
    monkeypatch.setattr(tokens, "_load_encoder", lambda name: loads.append(name) or object())
    monkeypatch.setattr(tokens, "_ENCODERS", {})
    tokens.warm_encodings()
    named = {tokens.encoding_for_model(m) for m in ("gpt-4o", "gpt-4", "claude-x", "smollm2")}
    assert set(loads) == named == set(tokens.ENCODINGS)
    tokens.warm_encodings()
    assert len(loads) == len(tokens.ENCODINGS)  # once each
