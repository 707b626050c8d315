"""Engine.call(paced=True): one paced call after each step while requests run (a staged P/D
import delays each running decode by one piece), all at once when the engine is idle, in the
order queued, cancelled on shutdown."""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

import pytest

from tests.engine_pd.test_pd_roles import _keep_busy


def test_paced_calls_queued_together_run_one_per_step_in_order(make_engine: Any) -> None:
    eng = make_engine()
    busy = _keep_busy(eng, "busy")
    ran: list[tuple[str, int]] = []
    futs = [eng.call(lambda i=i: ran.append((f"paced{i}", eng.steps_run)), paced=True)
            for i in range(4)]
    plain = eng.call(lambda: ran.append(("plain", eng.steps_run)))
    concurrent.futures.wait([*futs, plain], timeout=10)
    eng.abort("busy")
    busy.join(timeout=10)
    names = [n for n, _ in ran]
    assert [n for n in names if n.startswith("paced")] == ["paced0", "paced1", "paced2", "paced3"]
    steps = [s for n, s in ran if n.startswith("paced")]
    assert all(b > a for a, b in zip(steps, steps[1:]))  # never two in one step gap
    assert names.index("plain") < names.index("paced1")  # a plain call does not wait behind them


def test_paced_calls_run_at_once_on_an_idle_engine(make_engine: Any) -> None:
    eng = make_engine()
    eng.call(lambda: None).result(timeout=10)
    before = eng.steps_run
    t0 = time.monotonic()
    got = [eng.call(lambda i=i: i, paced=True) for i in range(3)]
    assert [f.result(timeout=5) for f in got] == [0, 1, 2]
    assert eng.steps_run == before and time.monotonic() - t0 < 5


def test_paced_calls_waiting_for_a_step_are_cancelled_at_shutdown(make_engine: Any) -> None:
    eng = make_engine()
    busy = _keep_busy(eng, "busy")
    futs = [eng.call(lambda: time.sleep(0.05), paced=True) for _ in range(200)]
    eng.shutdown()
    busy.join(timeout=10)
    done, not_done = concurrent.futures.wait(futs, timeout=10)
    assert not not_done  # every caller is answered
    assert any(f.cancelled() for f in futs)
    with pytest.raises(RuntimeError):
        eng.call(lambda: None, paced=True)
