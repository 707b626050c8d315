"""``prefixgate simulate --think-time`` and the ``ttl-*`` strategies, with costs computed by hand
on a synthetic run (token counter: one token per ``w``)."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest
from typer.testing import CliRunner

from prefixgate.proxy.cli import app
from prefixgate.proxy.sim.simulate import SimConfig, Simulator, schedule
from prefixgate.proxy.sim.think_time import message_kind, parse
from prefixgate.proxy.sim.traces import SimRequest, SimRun, load_trace
from tests.paths import DATA

TRACE = DATA / "traces" / "tau_bench_airline_gpt4o.json"
PRICE_IN = 3.0 / 1e6  # claude-sonnet-4-5, USD per input token (prefixgate/config/prices.py)


def test_think_time_specs() -> None:
    rng = random.Random(0)
    assert parse("fixed:30s").sample(rng) == 30.0
    assert parse("fixed:2m").sample(rng) == 120.0 and parse("fixed:45").sample(rng) == 45.0
    mix = parse("mix:tool=fixed:5s;user=fixed:1h")
    assert (mix.sample(rng, "tool"), mix.sample(rng, "user")) == (5.0, 3600.0)
    draws = [parse("lognormal:4.5,1.2").sample(random.Random(i)) for i in range(2000)]
    past_5m = sum(d > 300 for d in draws) / len(draws)
    assert 0.12 < past_5m < 0.20  # P(z > (ln 300 - 4.5) / 1.2 = 1.0) = 0.159
    for bad in ("fixed:-3s", "fixed:abc", "lognormal:1", "mix:tool=fixed:5s",
                "mix:tool=fixed:1s;user=mix:tool=fixed:1s", "poisson:3"):
        with pytest.raises(ValueError, match="bad think time"):
            parse(bad)


def test_message_kind() -> None:
    assert message_kind([{"role": "user", "content": "hi"}]) == "user"
    assert message_kind([{"role": "tool", "tool_call_id": "a", "content": "x"}]) == "tool"
    assert message_kind([{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "a", "content": "x"}]}]) == "tool"


def test_schedule_uses_the_think_time() -> None:
    runs = load_trace(TRACE, runs=2)
    ev = schedule(runs, SimConfig(think_time=parse("fixed:30s")))
    for (t1, r1, _), (t2, r2, _) in itertools.pairwise(ev):
        if r1 == r2:
            assert t2 - t1 == pytest.approx(30.0)


def _w(n: int) -> str:
    return " ".join(["w"] * n)


def _run(requests: int) -> SimRun:
    """A 2000-token system prompt, then user turns of 100 tokens (answers of 0 tokens)."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": _w(2000)}]
    reqs = []
    for _ in range(requests):
        msgs = [*msgs, {"role": "user", "content": _w(100)}]
        reqs.append(SimRequest(list(msgs), {"role": "assistant", "content": "ok"}))
        msgs = [*msgs, {"role": "assistant", "content": "ok"}]
    return SimRun("r1", [], reqs)


def test_ttl_costs_by_hand_with_400_second_gaps() -> None:
    """Six requests 400 s apart; breakpoints at the end of the system prompt and of the last
    message. Request k (1-based) holds 2000 + 100k tokens.

    * ttl-5m: every entry has expired when the next request comes: each request writes its whole
      prefix, 2100 + ... + 2600 = 14100 tokens at 1.25x.
    * ttl-1h: request 1 writes 2100 at 2x; each later one reads the previous prefix
      (2100 + ... + 2500 = 11500 at 0.1x) and writes its 100 new tokens at 2x (2600 in all).
    * ttl-auto: 5m until 3 gaps are known (requests 1-4: 2100 + 2200 + 2300 + 2400 = 9000 at
      1.25x). At request 5 the gaps (400 s each) give p(>5m) = 0.875 and p(>1h) ~ 0, so both
      segments cost less at 1h (system: 2000 x 0.1 = 200 against 2000 x 1.106 = 2212; the
      conversation, 500 tokens of which 100 new: 2 x 100 + 50 = 250 against 678). Request 5
      finds everything expired and writes 2500 at 2x; request 6 reads 2500 and writes 100 at 2x.
    """
    fig = Simulator(SimConfig(think_time=parse("fixed:400s"),
                              strategies=("ttl-5m", "ttl-1h", "ttl-auto")),
                    count_tokens=lambda s: s.count("w")).run([_run(6)])
    s = fig["strategies"]
    assert (s["ttl-5m"]["write_tokens"], s["ttl-5m"]["cached_read_tokens"]) == (14100, 0)
    assert (s["ttl-1h"]["write_tokens"], s["ttl-1h"]["cached_read_tokens"]) == (2600, 11500)
    assert (s["ttl-auto"]["write_tokens"], s["ttl-auto"]["cached_read_tokens"]) == (11600, 2500)
    assert s["ttl-5m"]["input_cost_usd"] == pytest.approx(14100 * 1.25 * PRICE_IN, abs=1e-4)
    assert s["ttl-1h"]["input_cost_usd"] == pytest.approx(
        (2600 * 2.0 + 11500 * 0.1) * PRICE_IN, abs=1e-4)
    assert s["ttl-auto"]["input_cost_usd"] == pytest.approx(
        (9000 * 1.25 + 2600 * 2.0 + 2500 * 0.1) * PRICE_IN, abs=1e-4)


def test_ttl_auto_matches_5m_when_every_gap_is_short() -> None:
    fig = Simulator(SimConfig(think_time=parse("fixed:30s"), strategies=("ttl-5m", "ttl-auto")),
                    count_tokens=lambda s: s.count("w")).run([_run(8)])
    a, b = fig["strategies"]["ttl-5m"], fig["strategies"]["ttl-auto"]
    assert (a["write_tokens"], a["cached_read_tokens"]) == (b["write_tokens"],
                                                            b["cached_read_tokens"])
    # request 1 writes 2100; each later one reads the previous prefix and writes 100 new
    assert (a["write_tokens"], a["cached_read_tokens"]) == (2100 + 7 * 100,
                                                            sum(2100 + 100 * k for k in range(7)))


def test_cli_think_time_and_ttl_strategy() -> None:
    res = CliRunner().invoke(app, ["simulate", str(TRACE), "--runs", "1", "--strategy", "ttl",
                                   "--think-time", "fixed:30s", "--json"])
    assert res.exit_code == 0, res.output
    fig = json.loads(res.output)
    assert fig["think_time"] == "fixed:30s"
    assert set(fig["strategies"]) == {"ttl-5m", "ttl-1h", "ttl-auto"}
    bad = CliRunner().invoke(app, ["simulate", str(TRACE), "--think-time", "fixed:soon"])
    assert bad.exit_code == 2 and "bad think time" in bad.output
