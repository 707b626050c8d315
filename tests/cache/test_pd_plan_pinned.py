"""``prefixgate plan``'s model pinned at its edges (issue 38: bounds at their edge, error
classes, the loop's first and last instance counts): an SLO met exactly, a utilisation of
exactly one, a decode batch exactly full, the rows the load is read from (each reason a row is
skipped), the report's rounding, and the messages a user reads when the rows cannot feed it."""

from __future__ import annotations

import math

import pytest

from prefixgate.proxy.routing.pd.plan import (
    Option,
    Plan,
    RouteLoad,
    colocated,
    load_from_rows,
    plan,
    split,
)

LOAD = RouteLoad(0.123456789, [1234, 987, 1000], [33, 45, 50], 1234.5678, 0.0123456)


def _below(v: float) -> float:
    return math.nextafter(v, -math.inf)


@pytest.mark.parametrize("option", [
    lambda t, p: split(LOAD, 1, 1, t, p), lambda t, p: split(LOAD, 2, 3, t, p),
    lambda t, p: colocated(LOAD, 1, t, p), lambda t, p: colocated(LOAD, 3, t, p)])
def test_an_slo_met_exactly_is_met_and_one_ulp_less_is_not(option: object) -> None:
    o = option(10.0, 10.0)  # type: ignore[operator]
    assert option(o.ttft_s, o.tpot_s).meets_slo  # type: ignore[operator]
    assert not option(_below(o.ttft_s), o.tpot_s).meets_slo  # type: ignore[operator]
    assert not option(o.ttft_s, _below(o.tpot_s)).meets_slo  # type: ignore[operator]


def test_a_utilisation_of_exactly_one_never_drains() -> None:
    load = RouteLoad(1.0, [1000], [10], 1000.0, 0.01)  # E[S] = 1 s at one request a second
    c = colocated(load, 1, 10.0, 10.0)
    assert math.isinf(c.ttft_s) and math.isinf(c.tpot_s) and not c.meets_slo
    assert math.isinf(split(load, 1, 1, 10.0, 10.0).ttft_s)
    assert math.isfinite(colocated(load, 2, 10.0, 10.0).tpot_s)


def test_a_decode_batch_exactly_full_keeps_up_one_more_does_not() -> None:
    full = RouteLoad(256.0, [1], [1], 1e9, 1.0)  # 256 running on one decode instance
    assert split(full, 1, 1, 10.0, 10.0).tpot_s == 1.0  # the default max_batch is 256
    over = RouteLoad(257.0, [1], [1], 1e9, 1.0)
    assert math.isinf(split(over, 1, 1, 10.0, 10.0).tpot_s)
    assert split(over, 1, 1, 10.0, 10.0, max_batch=257).tpot_s == 1.0


@pytest.mark.parametrize("n_p, n_d", [(0, 1), (1, 0), (0, 0)])
def test_a_split_without_both_kinds_is_refused_by_name(n_p: int, n_d: int) -> None:
    with pytest.raises(ValueError, match="^a split needs at least one prefill and one decode instance$"):
        split(LOAD, n_p, n_d, 1.0, 1.0)


def test_no_colocated_instance_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="^at least one instance$"):
        colocated(LOAD, 0, 1.0, 1.0)


def test_the_report_rounds_each_figure_as_documented() -> None:
    p = plan(LOAD, 0.001, 0.001, max_instances=1)
    assert p.load == {"requests": 3, "rate_per_s": 0.1235, "uncached_tokens_mean": 1073.7,
                      "output_tokens_mean": 42.7, "prefill_tokens_per_s": 1234.6,
                      "decode_step_ms": 12.35, "ttft_slo_ms": 1.0, "tpot_slo_ms": 1.0}
    d = Option(2, 3, 0.12345, math.inf, True).to_dict()
    assert d == {"kind": "split", "prefill": 2, "decode": 3, "ttft_ms": 123.5, "tpot_ms": None,
                 "meets_slo": True}
    assert Option(0, 2, 0.5, 0.25, False).to_dict()["kind"] == "colocate"
    chosen, alt = Option(0, 1, 1.0, 1.0, True), Option(1, 1, 2.0, 1.0, False)
    assert Plan("colocate", chosen, alt, {"x": 1}).to_dict() == {
        "recommendation": "colocate", "chosen": chosen.to_dict(), "alternative": alt.to_dict(),
        "load": {"x": 1}}
    assert Plan("none", None, None).to_dict() == {"recommendation": "none", "chosen": None,
                                                  "alternative": None, "load": {}}


def test_the_plan_tries_one_instance_first_and_stops_at_max_instances() -> None:
    light = RouteLoad(0.01, [100], [10], 1000.0, 0.01)
    p = plan(light, 1.0, 1.0)
    assert p.recommendation == "colocate" and p.chosen is not None and p.chosen.decode == 1
    assert p.alternative is None  # one instance: no split exists
    # 20 requests/s of 0.1 s prefills: colocation meets a 0.16 s TTFT only from n = 4 on, and a
    # transfer of 1 s per token keeps every split out
    heavy = RouteLoad(20.0, [100], [10], 1000.0, 0.001)
    need = next(n for n in range(1, 20) if colocated(heavy, n, 0.16, 1.0).meets_slo)
    assert need == 4
    at = plan(heavy, 0.16, 1.0, max_instances=need, transfer_s_per_token=1.0)
    assert at.recommendation == "colocate" and at.chosen.decode == need  # type: ignore[union-attr]
    assert at.alternative is not None and at.alternative.prefill + at.alternative.decode == need
    short = plan(heavy, 0.16, 1.0, max_instances=need - 1, transfer_s_per_token=1.0)
    assert short.recommendation == "none"
    assert short.chosen == colocated(heavy, need - 1, 0.16, 1.0)  # the last size tried
    assert short.alternative is not None and short.alternative.prefill + short.alternative.decode == need - 1


def test_the_best_split_meets_the_slo_before_it_is_fastest() -> None:
    """Tight TPOT: colocation never meets it; among splits, one meeting both SLOs wins over a
    faster one that misses TPOT (its decode side is over max_batch)."""
    load = RouteLoad(2.0, [100], [400], 1e5, 0.2)  # 160 running in all; max_batch 100
    p = plan(load, 10.0, 0.2, max_instances=3, max_batch=100)
    assert p.recommendation == "split" and p.chosen is not None and p.chosen.meets_slo
    assert (p.chosen.prefill, p.chosen.decode) == (1, 2)


ROWS = [{"ts": 100.0, "prompt_tokens": 1000, "cached_tokens": 200, "output_tokens": 10,
         "prefill_ms": 400.0, "tpot_ms": 20.0},
        {"ts": 104.0, "prompt_tokens": 500, "cached_tokens": None, "output_tokens": 30,
         "prefill_ms": 100.0, "tpot_ms": 40.0, "status": "ok"},
        {"ts": 102.0, "prompt_tokens": 300, "cached_tokens": 300, "output_tokens": 5,
         "prefill_ms": 7.0, "tpot_ms": 10.0}]


def test_the_load_is_read_from_the_usable_rows() -> None:
    load = load_from_rows(ROWS)
    assert load.lam == pytest.approx(2 / 4)          # (n - 1) / span
    assert load.uncached == [800, 500, 0]            # a None cached count is 0
    assert load.output == [10, 30, 5]
    assert load.prefill_tps == pytest.approx(1300 / 0.5)  # the fully cached row has no prefill
    assert load.decode_step_s == pytest.approx(0.020)     # the median tpot
    given = load_from_rows(ROWS, prefill_tps=7.0, decode_step_s=0.5)
    assert (given.prefill_tps, given.decode_step_s) == (7.0, 0.5)


@pytest.mark.parametrize("bad", [{"status": "error"}, {"prompt_tokens": None},
                                 {"output_tokens": None}, {"status": "client_disconnect"}])
def test_each_kind_of_unusable_row_is_skipped(bad: dict[str, object]) -> None:
    rows = [*ROWS, {**ROWS[0], "ts": 500.0, **bad}]
    assert load_from_rows(rows).uncached == [800, 500, 0]


def test_more_cached_than_prompt_counts_zero_and_a_row_without_prefill_time_is_not_timed() -> None:
    rows = [{**ROWS[0], "cached_tokens": 5000}, {**ROWS[1], "prefill_ms": 0},
            {**ROWS[2], "cached_tokens": 1, "prefill_ms": 100.0},
            {**ROWS[2], "ts": 103.0, "cached_tokens": 299, "prefill_ms": 1.0}]
    load = load_from_rows(rows)
    assert load.uncached == [0, 500, 299, 1]
    assert load.prefill_tps == pytest.approx(300 / 0.101)  # a one-token prefill is timed too


def test_two_rows_are_enough_and_half_a_second_is_a_span() -> None:
    assert load_from_rows([ROWS[0], {**ROWS[1], "ts": 100.5}]).lam == pytest.approx(2.0)


@pytest.mark.parametrize("rows, message", [
    ([ROWS[0]], "^1 usable ledger rows: the model needs at least two$"),
    ([ROWS[0], {**ROWS[1], "status": "error"}], "^1 usable ledger rows: the model needs at least two$"),
    ([ROWS[0], {**ROWS[1], "ts": 100.0}], "^the rows span no time: no arrival rate$"),
    ([{**r, "prefill_ms": None} for r in ROWS], "^no row reports prefill_ms: give the prefill rate$"),
    ([{**r, "tpot_ms": None} for r in ROWS], "^no row reports tpot_ms: give the decode step$"),
])
def test_rows_that_cannot_feed_the_model_say_why(rows: list[dict[str, object]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_from_rows(rows)


def _need(lam: float) -> int:
    load = RouteLoad(lam, [100], [10], 1000.0, 0.001)
    return next(n for n in range(1, 100) if colocated(load, n, 0.16, 1.0).meets_slo)


def test_sixteen_instances_are_tried_by_default_and_no_more() -> None:
    lam16 = next(x / 10 for x in range(10, 2000) if _need(x / 10) == 16)
    lam17 = next(x / 10 for x in range(10, 2000) if _need(x / 10) == 17)
    assert plan(RouteLoad(lam16, [100], [10], 1000.0, 0.001), 0.16, 1.0,
                transfer_s_per_token=1.0).recommendation == "colocate"
    assert plan(RouteLoad(lam17, [100], [10], 1000.0, 0.001), 0.16, 1.0,
                transfer_s_per_token=1.0).recommendation == "none"


def test_no_instance_tried_recommends_nothing() -> None:
    assert plan(LOAD, 1.0, 1.0, max_instances=0) == Plan("none", None, None, plan(
        LOAD, 1.0, 1.0, max_instances=0).load)


def test_the_plans_decode_batch_defaults_to_256_running() -> None:
    """257 running: one decode instance is over the default batch, so the split needs two; the
    colocated deployment misses a TPOT of exactly the decode step (prefill stretches it)."""
    load = RouteLoad(257.0, [1], [1], 1e9, 1.0)
    p = plan(load, 10.0, 1.0, max_instances=3)
    assert p.recommendation == "split" and (p.chosen.prefill, p.chosen.decode) == (1, 2)  # type: ignore[union-attr]
