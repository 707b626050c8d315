"""The default note placement per API is the one the answer-stability benchmark measured best
(issue 19, item 1: "choose the default per API by measurement"; issue 36: by teacher-forced KL at
equal prefix reuse)."""

from __future__ import annotations

import json
from pathlib import Path

from prefixgate.config.schema import HOIST_TARGET_BY_API, RewriteSettings

RESULT = Path(__file__).resolve().parents[2] / "bench" / "results" / "answer_stability.json"


def test_auto_is_the_default_and_resolves_to_the_measured_winner_per_api() -> None:
    assert RewriteSettings().hoist_target == "auto"
    measured = json.loads(RESULT.read_text())["figures"]["default_placement"]
    assert HOIST_TARGET_BY_API == measured


def test_the_measured_winner_keeps_the_prefix_then_has_the_lowest_kl() -> None:
    """The rule of ``bench/answer_stability.py`` (``winner``, issue 36), restated: placements
    whose cached share from the third request on is within 0.02 of the API's best, then the
    lowest mean teacher-forced KL over the original's answer, then the fewest answers about the
    note, then the fewest changed answers."""
    figs = json.loads(RESULT.read_text())["figures"]
    for api, placement in figs["default_placement"].items():
        rows = {k: v for k, v in figs["by_placement"].items()
                if k.startswith(f"{api}/") and k != f"{api}/defaults"}
        top = max(v["turn3_on_cached_share"] for v in rows.values())
        kept = [v for v in rows.values() if v["turn3_on_cached_share"] >= top - 0.02]
        best = min((v["kl_mean"], v["mentions_note"], v["changed_by_rewrite"]) for v in kept)
        won = rows[f"{api}/{placement}"]
        assert won in kept and (won["kl_mean"], won["mentions_note"], won["changed_by_rewrite"]) == best
