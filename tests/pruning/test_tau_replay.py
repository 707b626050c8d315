"""Real agent runs (tau-bench airline, GPT-4o) replayed with history pruning on: every request is
valid for its API and turns between compactions are append-only."""

from __future__ import annotations

from typing import Any

import pytest

from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.ir import Api
from prefixgate.rewriter.wire.validate import violations
from tests.paths import DATA
from tests.rewriter.helpers import replay

TRACE = DATA / "traces" / "tau_bench_airline_gpt4o.json"


def _bodies(api: Api, run: Any) -> list[dict[str, Any]]:
    from prefixgate.proxy.sim.traces import openai_body, to_anthropic

    if api == "openai":
        return [openai_body("gpt-4o", run.tools, r.messages) for r in run.requests]
    return [to_anthropic("claude-x", run.tools, r.messages) for r in run.requests]


@pytest.mark.skipif(not TRACE.exists(), reason="shared tau-bench trace not present")
@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_tau_runs_stay_valid_and_append_only_under_a_small_budget(api: Api) -> None:
    from prefixgate.proxy.sim.traces import load_tau

    total_compactions = 0
    for run in load_tau(TRACE, DATA / "tools" / "tau_bench_airline.json", runs=3):
        results = replay(_bodies(api, run), api, hoist_volatile=False, prune_history=True,
                         history_high_watermark_tokens=1500, history_low_watermark_tokens=700)
        compacted = 0
        prev: list[dict[str, Any]] | None = None
        for res in results:
            assert not violations(wire.parse(res.body, api))
            msgs = res.body["messages"]
            first = msgs[1] if api == "openai" else msgs[0]
            assert first["role"] == "user"
            edit = next(e for e in res.edits if e.pass_name == "prune_history")
            if "compaction #" in edit.detail:
                compacted += 1
            elif prev is not None:
                assert msgs[:len(prev)] == prev
            prev = msgs
        assert compacted <= len(results) // 3 + 1  # not a sliding window
        total_compactions += compacted
    assert total_compactions >= 1
