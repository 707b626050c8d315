"""``bench/answer_stability.py``'s rules (issue 36): the ``line_removed`` control and the default
placement by teacher-forced KL at equal reuse."""

from __future__ import annotations

from typing import Any

from bench.answer_stability import line_removed, tf_figures, winner

CLOCK = "2024-05-15 15:01:19 EST"


def test_line_removed_takes_only_the_clock_line_out_of_the_system_prompt() -> None:
    body = {"model": "m", "messages": [
        {"role": "system", "content": f"Policy.\nThe current time is {CLOCK}.\nConversation ID: abc"},
        {"role": "user", "content": f"What happened at {CLOCK}?"}]}
    got = line_removed(body, CLOCK)
    assert got["messages"][0]["content"] == "Policy.\nConversation ID: abc"
    assert got["messages"][1] == body["messages"][1]  # the user's own text is not the system prompt
    assert CLOCK in body["messages"][0]["content"]  # the input is not edited


def _placement(share: float, kl: float, mentions: int = 0, changed: int = 0) -> dict[str, Any]:
    return {"turn3_on_cached_share": share, "kl_mean": kl, "mentions_note": mentions,
            "changed_by_rewrite": changed}


def test_the_default_is_the_lowest_kl_among_the_placements_that_keep_the_prefix() -> None:
    """``last_user`` has the lowest KL but re-reads a tool loop (0.767 against 0.812): out;
    ``reminder`` beats ``end`` on KL although it mentions the note more."""
    by = {"openai/end": _placement(0.812, 0.10, mentions=1),
          "openai/last_user": _placement(0.767, 0.04),
          "openai/system_end": _placement(0.812, 0.60),
          "openai/reminder": _placement(0.804, 0.08, mentions=5)}
    assert winner(by, "openai") == "openai/reminder"
    by["openai/end"]["kl_mean"] = 0.08  # a KL tie: the fewer mentions win
    assert winner(by, "openai") == "openai/end"


def test_tf_figures_rename_the_summary_for_the_results_file() -> None:
    got = tf_figures([{"kl_mean": 0.2, "top1": 0.5, "nll_delta": 0.1, "missing": 2}])
    assert got == {"kl_mean": 0.2, "top1_agreement": 0.5, "nll_delta": 0.1, "tf_requests": 1,
                   "tf_missing_positions": 2}
