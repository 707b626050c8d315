"""``prefixgate report`` and the meaning guard (issue 36): the trials' cost on its own line, and
``--guard``: each move's latest verdict per route and tenant (from the trial rows' ``edits``),
today's trial spend against the route's budget, and for a hosted route without a budget what
hoisting would save there and what one trial would cost at the price table
(:mod:`prefixgate.proxy.cli.guard_report`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml
from typer.testing import CliRunner

from prefixgate.cache.ledger.store import Ledger, LedgerRow
from prefixgate.proxy.cli import app
from prefixgate.proxy.pipeline.guard_trial import verdict_json


class _V:  # a MoveVerdict's fields (the core's dataclass; only these are read)
    def __init__(self, state: str, pairs: int, move_rate: float, floor_rate: float,
                 expires_at: float) -> None:
        self.state, self.pairs, self.move_rate = state, pairs, move_rate
        self.floor_rate, self.expires_at = floor_rate, expires_at


def _ledger(tmp: Path) -> Path:
    now = time.time()
    path = tmp / "l.sqlite"
    led = Ledger(path)
    for i in range(4):  # a hosted route's client traffic with a clock break in its system text
        led.write(LedgerRow(ts=now - 60 + i, route="gpt-*", backend="openai", model="gpt-4o",
                            prompt_tokens=2000, cached_tokens=0, output_tokens=10,
                            input_usd=0.005, cf_input_usd=0.005, session="s"))
        led.write_break("s", {"kind": "volatile_span", "region": "system", "tokens_lost": 1500,
                              "volatile_kinds": ["datetime"], "route": "gpt-*",
                              "model": "gpt-4o", "excerpt": "Now: <datetime>"})
    led.write(LedgerRow(ts=now - 30, route="local*", backend="eng", model="local-m",
                        prompt_tokens=900, cached_tokens=800, output_tokens=5, session="t"))
    verdicts = [_V("trialling", 1, 0.0, 0.0, 0.0), _V("on", 40, 0.0, 0.025, now + 3600)]
    for k, v in enumerate(verdicts):  # two trials on the local route, tenant "a"
        for j in range(3):
            led.write(LedgerRow(ts=now - 20 + k, route="local*", backend="eng", model="local-m",
                                tenant="a", prompt_tokens=900, output_tokens=16,
                                trial="hoist_volatile", edits=verdict_json(v) if j == 2 else ""))
    led.close()
    return path


def _policy(tmp: Path) -> Path:
    p = tmp / "policy.yaml"
    p.write_text(yaml.safe_dump({
        "backends": {"openai": {"kind": "openai", "base_url": "https://api.openai.com/v1",
                                "api_key": "${OPENAI_API_KEY}"},
                     "eng": {"kind": "openai_compat", "base_url": "http://e:8081/v1"}},
        "routes": [{"match": "gpt-*", "backend": "openai"}, {"match": "local*", "backend": "eng"}],
        "ledger": {"path": str(tmp / "l.sqlite")}}))
    return p


def test_report_has_the_trials_cost_line_and_the_guard_table(tmp_path: Path) -> None:
    path, policy = _ledger(tmp_path), _policy(tmp_path)
    r = CliRunner().invoke(app, ["report", "--ledger", str(path), "--policy", str(policy),
                                 "--guard"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "meaning-guard trials: 6 requests, 5496 tokens, $0.0000" in r.output
    assert "local* | a | hoist_volatile | on | 40 | 0.00 vs 0.03 |" in r.output
    assert "local*: 6/1200 requests, 5496/3000000 tokens" in r.output
    assert "gpt-*: 0/0 requests" in r.output
    assert "hoist_volatile would save about 6000 prompt tokens" in r.output
    # one trial on gpt-4o: 3 x (2000 + 64) input tokens at $2.50/M + 3 x 16 output at $10/M
    assert f"one trial (3 sends) would cost ${(3 * 2064 * 2.5 + 48 * 10) / 1e6:.4f}" in r.output


def test_report_json_carries_trials_and_guard(tmp_path: Path) -> None:
    path, policy = _ledger(tmp_path), _policy(tmp_path)
    r = CliRunner().invoke(app, ["report", "--ledger", str(path), "--policy", str(policy),
                                 "--guard", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["trials"] == {"requests": 6, "tokens": 5496, "usd": 0.0}
    assert [(v["route"], v["tenant"], v["move"], v["state"], v["pairs"])
            for v in doc["guard"]["verdicts"]] == [("local*", "a", "hoist_volatile", "on", 40)]
    routes = {r["route"]: r for r in doc["guard"]["routes"]}
    assert routes["gpt-*"]["budget"]["requests_per_day"] == 0 and "no_budget" in routes["gpt-*"]
    assert "no_budget" not in routes["local*"]
    # the client figures never count the trial sends
    assert sum(g["requests"] for g in doc["groups"]) == 5
