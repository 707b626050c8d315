"""The P/D plan's queueing model holds for every instance count, not only one of each (issue 38
item 5: a split's prefill queue got the whole arrival rate instead of its share across the
prefill instances; every test had one prefill instance, where both give the same answer).

The dimension varied: the number of prefill and decode instances (and the load), with the
expected figures computed here from the model's stated formulas (DistServe §3; M/G/1 by
Pollaczek-Khinchine; Little's law), independently of the module.
"""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.proxy.routing.pd.plan import RouteLoad, colocated, split

X, OVERHEAD = 0.00003, 0.004  # transfer s/token and orchestration s


def _pk_wait(lam: float, s: list[float]) -> float:
    es, es2 = statistics.fmean(s), statistics.fmean(v * v for v in s)
    return math.inf if lam * es >= 1 else lam * es2 / (2 * (1 - lam * es))


loads = st.builds(
    RouteLoad,
    lam=st.floats(0.05, 8.0),
    uncached=st.lists(st.integers(1, 4000), min_size=1, max_size=6),
    output=st.just([64]),
    prefill_tps=st.floats(200.0, 5000.0),
    decode_step_s=st.floats(0.005, 0.08),
).map(lambda ld: RouteLoad(ld.lam, ld.uncached, [64] * len(ld.uncached), ld.prefill_tps,
                           ld.decode_step_s))


@settings(max_examples=200, deadline=None)
@given(load=loads, n_p=st.integers(1, 6), n_d=st.integers(1, 6))
def test_a_split_queues_each_prefill_instance_at_its_share_of_the_arrivals(
        load: RouteLoad, n_p: int, n_d: int) -> None:
    s = load.service_s
    want = statistics.fmean(s) + _pk_wait(load.lam / n_p, s) + X * statistics.fmean(load.uncached) + OVERHEAD
    got = split(load, n_p, n_d, 10.0, 10.0, X, OVERHEAD).ttft_s
    assert got == pytest.approx(want, rel=1e-9) or (math.isinf(got) and math.isinf(want))


@settings(max_examples=200, deadline=None)
@given(load=loads, n=st.integers(1, 6))
def test_colocated_instances_share_the_arrivals_and_stretch_decode(load: RouteLoad, n: int) -> None:
    s = load.service_s
    opt = colocated(load, n, 10.0, 10.0)
    want_ttft = statistics.fmean(s) + _pk_wait(load.lam / n, s)
    rho = load.lam / n * statistics.fmean(s)
    want_tpot = math.inf if rho >= 1 else load.decode_step_s / (1 - rho)
    for got, want in ((opt.ttft_s, want_ttft), (opt.tpot_s, want_tpot)):
        assert got == pytest.approx(want, rel=1e-9) or (math.isinf(got) and math.isinf(want))


@pytest.mark.parametrize("n_p", [1, 2, 3, 4])
def test_more_prefill_instances_shorten_the_queue_exactly_as_their_share(n_p: int) -> None:
    """A fixed load near one instance's saturation (rho 0.9): the wait falls as lam / n_p."""
    load = RouteLoad(0.9, [1000], [64], 1000.0, 0.02)  # S = 1 s each, deterministic
    wait = split(load, n_p, 1, 10.0, 10.0, 0.0, 0.0).ttft_s - 1.0
    lam = 0.9 / n_p
    assert wait == pytest.approx(lam * 1.0 / (2 * (1 - lam)))  # M/D/1: l·E[S²] / 2(1 - l·E[S])


@pytest.mark.parametrize("n_d, fits", [(1, False), (2, False), (4, True), (8, True)])
def test_decode_instances_hold_their_share_of_the_running_requests(n_d: int, fits: bool) -> None:
    """Little's law per decode instance: lam / n_d · E[out] · t_d running; over max_batch the
    decode side never keeps up."""
    load = RouteLoad(100.0, [10], [300], 1e6, 0.01)  # 300 running in all
    tpot = split(load, 1, n_d, 10.0, 10.0, 0.0, 0.0, max_batch=100).tpot_s
    assert math.isfinite(tpot) is fits
