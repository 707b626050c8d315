"""The pure parts of ``bench/span_reuse.py`` (issue 33): answer positions, teacher-forced KL and
top-1 agreement, the figures and goals, the adversarial pairs and their verdicts."""

from __future__ import annotations

import bisect
import math
import os
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.span_reuse import GOALS, adversarial_cases, changed_window, figures, verdict
from bench.teacher_forced import answer_positions, compare, kl_rows

MODEL_DIR = Path(os.environ.get("PREFIXGATE_MODEL_DIR")
                 or "~/.cache/prefixgate/models/SmolLM2-135M-Instruct").expanduser()


class Rows:
    """A stand-in for the engine's ``PromptLogprobs``: rows by position, some missing."""

    def __init__(self, positions: list[int], rows: torch.Tensor) -> None:
        self.positions, self.rows = positions, rows

    def row(self, pos: int) -> Any:
        i = bisect.bisect_left(self.positions, pos)
        return self.rows[i] if i < len(self.positions) and self.positions[i] == pos else None


def _logsoftmax(probs: list[list[float]]) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float32).log()


def test_the_answer_rows_start_at_the_last_prompt_position() -> None:
    assert answer_positions(10, 3) == [9, 10, 11]  # each predicts the next answer token
    assert answer_positions(10, 0) == []


def test_kl_is_zero_on_equal_rows_and_matches_a_hand_computed_value() -> None:
    p = _logsoftmax([[0.5, 0.5], [0.25, 0.75]])
    q = _logsoftmax([[0.9, 0.1], [0.25, 0.75]])
    got = kl_rows(p, q)
    want = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert got[0] == pytest.approx(want, rel=1e-6) and got[1] == pytest.approx(0.0, abs=1e-9)
    assert kl_rows(p, p) == [0.0, 0.0]


def test_compare_uses_the_positions_both_computed_and_counts_top1_against_the_answer() -> None:
    ref = Rows([4, 5, 6], _logsoftmax([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]))
    other = Rows([5, 6], _logsoftmax([[0.3, 0.7], [0.4, 0.6]]))  # position 4 was reused
    got = compare(ref, other, [4, 5, 6], [4, 5, 6], answer=[0, 1, 0])
    assert (got["positions"], got["missing"]) == (2, 1)
    assert got["top1"] == 0.5  # position 5 agrees (1), position 6 does not (argmax 1, answer 0)
    k5 = 0.2 * math.log(0.2 / 0.3) + 0.8 * math.log(0.8 / 0.7)
    k6 = 0.6 * math.log(0.6 / 0.4) + 0.4 * math.log(0.4 / 0.6)
    assert got["kl_mean"] == pytest.approx((k5 + k6) / 2, rel=1e-5)
    assert got["kl_max"] == pytest.approx(max(k5, k6), rel=1e-5)


def test_compare_follows_shifted_positions_of_the_clock_tick() -> None:
    rows = _logsoftmax([[0.9, 0.1], [0.2, 0.8]])
    got = compare(Rows([4, 5], rows), Rows([7, 8], rows), [4, 5], [7, 8], answer=[0, 1])
    assert (got["kl_mean"], got["top1"], got["positions"]) == (0.0, 1.0, 2)


def _row(turn: int, *, p: int = 1000, on: int = 900, off: int = 100, span: int = 800,
         same: bool = True, kl: float = 1e-6, tick: float = 1e-6, t_on: float = 100.0,
         t_off: float = 400.0) -> dict[str, Any]:
    return {"turn": turn, "prompt_tokens": p, "cached_on": on, "cached_off": off,
            "span_reused": span, "greedy_identical": same, "kl_mean": kl, "kl_max": kl * 3,
            "top1": 1.0, "kl_clock_tick": tick, "ttft_ms_on": t_on, "ttft_ms_off": t_off}


def test_figures_take_shares_and_ratios_from_the_third_request_on() -> None:
    rows = [_row(0, on=0, off=0, span=0), _row(1), _row(2), _row(3, kl=3e-6, tick=2e-6)]
    f = figures(rows)
    assert (f["requests"], f["late_requests"], f["span_reused_requests"]) == (4, 2, 3)
    assert f["cached_share_turn3_on"] == 0.9 and f["cached_share_turn3_off"] == 0.1
    assert f["prefill_tokens_ratio"] == round(200 / 1800, 4)
    assert f["ttft_p50_ratio"] == 0.25
    assert f["kl_mean"] == pytest.approx((1e-6 * 3 + 3e-6) / 4)
    assert f["kl_max"] == 3e-6 and f["kl_max_position"] == pytest.approx(9e-6)
    assert all(f["goals"].values()) and set(f["goals"]) == set(GOALS)
    split = f["kl_by_turn"]
    assert split["first_request_of_a_session"]["requests"] == 1
    assert split["later_requests"]["kl_max"] == 3e-6
    assert f["worst"][0]["turn"] == 3


def test_a_changed_answer_or_a_large_kl_fails_its_goal() -> None:
    f = figures([_row(2, same=False), _row(3, kl=5e-3)])
    assert f["goals"]["greedy_identical_share"] is False
    assert f["goals"]["kl_max"] is False and f["goals"]["kl_mean"] is False


def test_an_adversarial_case_is_refused_within_bounds_or_out_of_bounds() -> None:
    assert verdict({**_row(2, span=0), "kl_mean": 1.0}) == "refused"
    assert verdict(_row(2)) == "within_bounds"
    assert verdict(_row(2, same=False)) == "out_of_bounds"
    assert verdict(_row(2, kl=2e-3)) == "out_of_bounds"


def test_changed_window_measures_the_change_without_the_shared_ends() -> None:
    assert changed_window([1, 2, 3, 4, 5], [1, 2, 9, 9, 9, 4, 5]) == [2, 1, 3]
    assert changed_window([1, 2], [1, 2]) == [2, 0, 0]


BASE = {"model": "local", "max_tokens": 8, "messages": [
    {"role": "system", "content": " ".join(f"Policy line {i}: agents must verify the user id, "
                                           "state the fare rules and never invent a refund."
                                           for i in range(14))},
    {"role": "user", "content": "I want to cancel my reservation ABC123."}]}


@pytest.mark.skipif(not (MODEL_DIR / "tokenizer.json").exists(), reason="no model tokenizer")
def test_the_adversarial_pairs_change_what_their_names_say() -> None:
    from prefixgate.local_engine.model.files import load_tokenizer
    from prefixgate.local_engine.server.chat import encode_chat

    tok = load_tokenizer(str(MODEL_DIR))

    def ids(body: dict[str, Any]) -> list[int]:
        return list(encode_chat(tok, body["messages"], body.get("tools")))

    cases = {name: (ids(a), ids(b)) for name, (a, b) in adversarial_cases(BASE).items()}
    start, in_a, in_b = changed_window(*cases["span_right_before_the_answer"])
    assert len(cases["span_right_before_the_answer"][1]) - (start + in_b) <= 12  # at the end
    _, in_a, in_b = changed_window(*cases["span_of_200_tokens"])
    assert min(in_a, in_b) >= 200
    start, _, _ = changed_window(*cases["span_at_the_very_start"])
    assert start <= 8
    a, b = cases["many_small_spans"]
    spans = [op for op in SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
             if op[0] != "equal"]
    assert len(spans) >= 8  # one id line changed per eighth of the system prompt
    assert sum(max(i2 - i1, j2 - j1) for _, i1, i2, j1, j2 in spans) <= 8 * 24  # each small
