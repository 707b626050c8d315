"""bench/meaning_guard_engine.py's corpus: the engine part of ``bench/meaning_guard.py`` reads
tau-bench sessions through :mod:`bench.stability_corpus` (it crashed on an import the stop-40
merge moved, after the scripted backends' 7 minutes had run)."""

from __future__ import annotations

from bench.meaning_guard_engine import _cases


def test_the_engine_corpus_is_sessions_of_turns_in_order_with_their_clock_ticked() -> None:
    sessions = _cases(2, 3, 16)
    assert len(sessions) == 2
    for turns in sessions:
        assert [c.turn for c in turns] == sorted(c.turn for c in turns) and len(turns) >= 2
        assert len({c.session for c in turns}) == 1
        for c in turns:
            assert c.clock and c.body != c.tick          # only the clock differs: it advanced
            assert c.body["messages"][1:] == c.tick["messages"][1:]
