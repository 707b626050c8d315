"""``prefixgate plan``'s queueing model, pinned on a hand-computed fixture, and the command.

Fixture: four requests at t = 0, 5, 10, 15 s (rate 3 / 15 = 0.2/s) with 1,000 / 1,000 / 3,000 /
3,000 uncached prompt tokens at 1,000 tokens/s: S = 1, 1, 3, 3 s, E[S] = 2 s, E[S²] = 5 s²;
decode step 50 ms; handoff 0.2 ms a token (E[u] = 2,000: 0.4 s), no orchestration cost.

- colocated n=1: W = 0.2·5 / (2·(1 - 0.4)) = 0.8333 s, TTFT 2.8333 s; TPOT 0.05 / 0.6 = 83.3 ms.
- colocated n=2: W = 0.1·5 / (2·0.8) = 0.3125 s, TTFT 2.3125 s; TPOT 0.05 / 0.8 = 62.5 ms.
- split (1, 1): TTFT 2 + 0.8333 + 0.4 = 3.2333 s; TPOT 50 ms.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefixgate.cache.ledger.store import Ledger, LedgerRow
from prefixgate.proxy.cli import app
from prefixgate.proxy.routing.pd.plan import RouteLoad, colocated, load_from_rows, mg1_wait, plan, split

UNCACHED = [1000, 1000, 3000, 3000]


def _rows() -> list[dict[str, object]]:
    return [{"ts": 100.0 + 5 * i, "status": "ok", "prompt_tokens": u + 500, "cached_tokens": 500,
             "output_tokens": 40, "prefill_ms": u * 1.0, "tpot_ms": tp}
            for i, (u, tp) in enumerate(zip(UNCACHED, [40.0, 50.0, 50.0, 90.0]))]


LOAD = RouteLoad(0.2, UNCACHED, [40] * 4, 1000.0, 0.05)


def test_the_load_comes_from_the_rows() -> None:
    got = load_from_rows(_rows() + [{"ts": 999.0, "status": "upstream_error"}])
    assert got.lam == pytest.approx(0.2) and got.uncached == UNCACHED
    assert got.prefill_tps == pytest.approx(1000.0)
    assert got.decode_step_s == pytest.approx(0.05)  # the p50 of 40, 50, 50, 90


def test_mg1_wait_and_its_saturation() -> None:
    assert mg1_wait(0.2, 2.0, 5.0) == pytest.approx(0.2 * 5 / (2 * 0.6))
    assert math.isinf(mg1_wait(0.5, 2.0, 5.0))


def test_each_option_on_the_fixture() -> None:
    c1 = colocated(LOAD, 1, 3.5, 0.07)
    assert c1.ttft_s == pytest.approx(2.8333, abs=1e-4) and c1.tpot_s == pytest.approx(0.083333,
                                                                                      abs=1e-6)
    assert not c1.meets_slo
    c2 = colocated(LOAD, 2, 3.5, 0.07)
    assert c2.ttft_s == pytest.approx(2.3125) and c2.tpot_s == pytest.approx(0.0625)
    s11 = split(LOAD, 1, 1, 3.5, 0.07, transfer_s_per_token=0.0002, overhead_s=0.0)
    assert s11.ttft_s == pytest.approx(3.2333, abs=1e-4) and s11.tpot_s == pytest.approx(0.05)
    # the measured orchestration (SPLIT_OVERHEAD_S, 4 ms) is added unless told otherwise
    assert split(LOAD, 1, 1, 3.5, 0.07, 0.0002).ttft_s == pytest.approx(s11.ttft_s + 0.004)
    assert split(LOAD, 1, 1, 3.5, 0.07, 0.0002, overhead_s=0.5).meets_slo is False
    with pytest.raises(ValueError):
        split(LOAD, 0, 2, 1, 1)


def test_a_tight_tpot_slo_recommends_one_prefill_and_one_decode() -> None:
    got = plan(LOAD, 3.5, 0.06, transfer_s_per_token=0.0002)
    assert got.recommendation == "split"
    assert got.chosen is not None and (got.chosen.prefill, got.chosen.decode) == (1, 1)
    assert got.alternative is not None and got.alternative.tpot_s == pytest.approx(0.0625)


def test_a_looser_tpot_slo_recommends_two_colocated() -> None:
    got = plan(LOAD, 3.5, 0.07, transfer_s_per_token=0.0002)
    assert got.recommendation == "colocate" and got.chosen is not None
    assert (got.chosen.prefill, got.chosen.decode) == (0, 2)


def test_an_unreachable_slo_says_none() -> None:
    got = plan(LOAD, 1.0, 0.07, max_instances=4)  # E[S] alone is 2 s
    assert got.recommendation == "none" and got.chosen is not None
    assert not got.chosen.meets_slo


def test_the_command_reads_the_routes_rows(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    led = Ledger(path)
    for r in _rows():
        led.write(LedgerRow(route="chat", **r))  # type: ignore[arg-type]
    led.write(LedgerRow(route="other", ts=50.0, prompt_tokens=9, output_tokens=1))
    led.close()
    res = CliRunner().invoke(app, ["plan", "--ledger", str(path), "--route", "chat",
                                   "--ttft-slo-ms", "3500", "--tpot-slo-ms", "60",
                                   "--transfer-ms-per-token", "0.2", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["recommendation"] == "split" and doc["load"]["requests"] == 4
    assert doc["chosen"] == {"kind": "split", "prefill": 1, "decode": 1, "ttft_ms": 3237.3,
                             "tpot_ms": 50.0, "meets_slo": True}
    res = CliRunner().invoke(app, ["plan", "--ledger", str(path), "--route", "nope",
                                   "--ttft-slo-ms", "1", "--tpot-slo-ms", "1"])
    assert res.exit_code == 1 and "usable ledger rows" in res.output
    res = CliRunner().invoke(app, ["plan", "--ledger", str(path), "--route", "chat",
                                   "--ttft-slo-ms", "3500", "--tpot-slo-ms", "70"])
    assert res.exit_code == 0 and "recommendation: colocate — 2 colocated" in res.output


def test_split_rows_count_as_load_but_do_not_measure_the_prefill_rate() -> None:
    """A split request's prefill ran on the prefill instance: the decode instance reports its
    transferred prompt as uncached (issue 34, item 13) and a prefill time of a few ms, which
    must not pass for a 1,000x faster prefill."""
    split_row = {"ts": 125.0, "status": "ok", "prompt_tokens": 3500, "cached_tokens": 500,
                 "output_tokens": 40, "prefill_ms": 3.0, "tpot_ms": 50.0,
                 "deployment": "eng/pd-split:split"}
    got = load_from_rows(_rows() + [split_row])
    assert got.uncached == UNCACHED + [3000]
    assert got.prefill_tps == pytest.approx(1000.0)
