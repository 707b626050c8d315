"""Speculative decoding rules at the step level (issue 21), without a model.

``SpecDecoder.propose`` is driven with plain ``Sequence`` objects and a recording drafter, and
``SpecDecoder.verify`` with hand-made logits rows, so every figure below is computed by hand from
the module docstring of ``spec.decode``: the step's draft allowance is
``min(budget, max_batch_tokens - decodes)``, spread over the batch (``allowance // remaining``
each, at least 1 while any is left), only what a draft really holds is charged to it, a request
never drafts past ``max_tokens - completion - 1``, ``k`` grows by one after a fully accepted draft
(up to ``k_max``) and is ``accepted + 1`` otherwise, and a request whose acceptance estimate (EMA
0.3, start 0.7) is under 0.15 after at least 4 drafts pauses for 8 steps (then restarts at 0.5).
"""

from __future__ import annotations

import logging

import pytest
import torch

from prefixgate.local_engine.sched.api_types import SamplingParams
from prefixgate.local_engine.sched.sampler import SamplingError
from prefixgate.local_engine.sched.sequence import Sequence
from prefixgate.local_engine.spec.decode import (
    SpecDecoder,
    SpecMetrics,
    choose_k_cap,
    expected_tokens,
    interpolate,
)
from prefixgate.local_engine.spec.drafters import Draft

GREEDY = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
V = 16  # vocabulary of the hand-made logits rows


class Recorder:
    """A drafter that answers ``k`` tokens (or ``give`` of them, or a fixed list) and records
    every ``(request_id, k)`` it is asked for and every release."""

    name = "recorder"

    def __init__(self, give: int | None = None, tokens: list[int] | None = None,
                 fail: set[str] | None = None) -> None:
        self.give, self.tokens, self.fail = give, tokens, fail or set()
        self.asked: list[tuple[str, int]] = []
        self.released: list[str] = []

    def propose(self, seq: Sequence, k: int) -> Draft | None:
        self.asked.append((seq.request_id, k))
        if seq.request_id in self.fail:
            raise RuntimeError("drafter broke")
        if self.tokens is not None:
            return Draft(list(self.tokens))
        n = k if self.give is None else self.give
        return Draft([3] * n) if n else None

    def release(self, seq: Sequence) -> None:
        self.released.append(seq.request_id)


def request(rid: str, completion: int = 2, max_tokens: int = 64,
            params: SamplingParams = GREEDY, seed: int = 0) -> Sequence:
    """A decoding request with a 4-token prompt and ``completion`` tokens generated so far."""
    seq = Sequence(rid, [11, 12, 13, 14], params, max_tokens, None,  # type: ignore[arg-type]
                   torch.Generator().manual_seed(seed), None, set(), lambda out: None)
    seq.token_ids += [5] * completion
    return seq


def rows(*argmaxes: int) -> torch.Tensor:
    """Logits ``[len(argmaxes), V]`` whose row ``i`` peaks at ``argmaxes[i]``."""
    out = torch.zeros(len(argmaxes), V)
    for i, t in enumerate(argmaxes):
        out[i, t] = 10.0
    return out


def drafted(drafts: list[Draft | None]) -> list[int]:
    return [0 if d is None else len(d.tokens) for d in drafts]


# -- propose: the allowance and its spending ----------------------------------------------------

def test_spare_rows_are_spread_evenly_and_only_what_is_drafted_is_charged() -> None:
    rec = Recorder()
    spec = SpecDecoder(rec, k_max=4, max_batch_tokens=64)
    reqs = [request(f"r{i}") for i in range(3)]
    # allowance 7: 7 // 3 = 2, then 5 // 2 = 2, then 3 // 1 = 3 (the last takes what is left)
    assert drafted(spec.propose(reqs, budget=7)) == [2, 2, 3]
    assert rec.asked == [("r0", 2), ("r1", 2), ("r2", 3)]
    # a drafter that gives 1 token where 2 were allowed leaves the rest to the others
    short = Recorder(give=1)
    spec = SpecDecoder(short, k_max=4, max_batch_tokens=64)
    assert drafted(spec.propose(reqs, budget=7)) == [1, 1, 1]
    assert short.asked == [("r0", 2), ("r1", 3), ("r2", 4)]  # 6 // 2 = 3, then min(5, k_max 4)


def test_an_allowance_smaller_than_the_batch_gives_one_token_each_until_spent() -> None:
    rec = Recorder()
    spec = SpecDecoder(rec, k_max=4, max_batch_tokens=64)
    reqs = [request(f"r{i}") for i in range(3)]
    assert drafted(spec.propose(reqs, budget=2)) == [1, 1, 0]
    assert rec.asked == [("r0", 1), ("r1", 1)]  # the third is not even asked
    assert spec.metrics.decode_steps == 3 and spec.metrics.no_draft_steps == 1
    assert drafted(spec.propose(reqs, budget=0)) == [0, 0, 0] and len(rec.asked) == 2
    assert spec.metrics.decode_steps == 6 and spec.metrics.no_draft_steps == 4


def test_the_compute_bound_cap_limits_the_step_rows() -> None:
    rec = Recorder()
    spec = SpecDecoder(rec, k_max=4, max_batch_tokens=6)
    reqs = [request(f"r{i}") for i in range(2)]
    # rows = 2 decodes + drafts <= 6: allowance min(100, 6 - 2) = 4, spread 2 + 2
    assert drafted(spec.propose(reqs, budget=100)) == [2, 2]
    # the step budget binds when it is the smaller one
    assert drafted(spec.propose(reqs, budget=3)) == [1, 2]
    # a batch at the cap drafts nothing
    full = SpecDecoder(Recorder(), k_max=4, max_batch_tokens=2)
    assert drafted(full.propose(reqs, budget=100)) == [0, 0]


def test_k_never_passes_max_tokens() -> None:
    rec = Recorder()
    spec = SpecDecoder(rec, k_max=4, max_batch_tokens=64)
    # max_tokens 6, 3 generated: this step yields the next token + k drafts, so k <= 6 - 3 - 1
    near = [request("a", completion=3, max_tokens=6), request("b", completion=5, max_tokens=6),
            request("c", completion=4, max_tokens=6), request("d", completion=0, max_tokens=6)]
    assert drafted(spec.propose(near, budget=40)) == [2, 0, 1, 4]
    assert ("b", 0) not in rec.asked and [k for _, k in rec.asked] == [2, 1, 4]


def test_a_draft_longer_than_asked_is_cut_to_k_and_charged_as_cut() -> None:
    rec = Recorder(tokens=[3, 3, 3, 3, 3, 3])  # ignores k
    spec = SpecDecoder(rec, k_max=4, max_batch_tokens=64)
    reqs = [request("a", completion=3, max_tokens=6), request("b")]
    assert drafted(spec.propose(reqs, budget=5)) == [2, 3]  # a: max_tokens; b: 5 - 2 left


def test_constrained_requests_do_not_draft() -> None:
    rec = Recorder()
    spec = SpecDecoder(rec, k_max=4, max_batch_tokens=64)
    masked = SamplingParams(max_tokens=64, temperature=0.0, logits_processors=[lambda ids, x: x])
    reqs = [request("m", params=masked), request("free")]
    assert drafted(spec.propose(reqs, budget=8)) == [0, 4]
    assert [r for r, _ in rec.asked] == ["free"]


def test_a_failing_drafter_costs_that_request_its_draft_only(caplog: pytest.LogCaptureFixture) -> None:
    rec = Recorder(fail={"bad"})
    spec = SpecDecoder(rec, k_max=2, max_batch_tokens=64)
    bad, good = request("bad"), request("good")
    with caplog.at_level(logging.ERROR, logger="local_engine.spec"):
        assert drafted(spec.propose([bad, good], budget=8)) == [0, 2]
    assert rec.released == ["bad"] and spec.metrics.no_draft_steps == 1
    assert [r.getMessage() for r in caplog.records] == [
        "drafter recorder failed for one request; it decodes without a draft"]


def test_one_spare_row_still_asks_the_cost_model() -> None:
    steep = [(1, 50.0), (2, 100.0), (8, 400.0)]
    assert drafted(SpecDecoder(Recorder(), 4, 64, steep).propose([request("a")], 1)) == [0]
    assert drafted(SpecDecoder(Recorder(), 4, 64).propose([request("a")], 1)) == [1]


def test_a_paused_request_adds_no_draft_rows_to_the_cost_model() -> None:
    """Curve where one more draft row tips the cap: the fresh request (estimate 0.7, k 4) with a
    paused neighbour (k 1, estimate 0.5) gets cap 1; counting the paused one's k would give 0."""
    curve = [(2, 2.0), (3, 2.0), (7, 8.0)]
    spec = SpecDecoder(Recorder(), k_max=4, max_batch_tokens=64, cost_curve=curve)
    paused, fresh = request("p"), request("f")
    for _ in range(5):
        reject(spec, paused)
    assert drafted(spec.propose([fresh, paused], budget=8)) == [1, 0]


def test_a_cost_curve_that_makes_drafts_dear_stops_drafting() -> None:
    steep = [(1, 50.0), (2, 100.0), (8, 400.0)]
    flat = [(1, 50.0), (8, 51.0), (64, 60.0)]
    reqs = [request("a")]
    assert drafted(SpecDecoder(Recorder(), 4, 64, steep).propose(reqs, 8)) == [0]
    # alpha 0.7 (the first estimate): k = 3 expects 2.533 tokens, k = 4 2.773 for 0.3 % more
    # step time, 9 % better, under the 10 % a longer cap must win by: the cap is 3
    assert drafted(SpecDecoder(Recorder(), 4, 64, flat).propose(reqs, 8)) == [3]
    # the curve is sorted on the way in: the same points in any order decide the same
    assert drafted(SpecDecoder(Recorder(), 4, 64, flat[::-1]).propose(reqs, 8)) == [3]


# -- verify: counting and adapting k ------------------------------------------------------------

def test_verify_counts_drafts_tokens_and_accepted_positions() -> None:
    spec = SpecDecoder(Recorder(), k_max=4, max_batch_tokens=64)
    a, b = request("a"), request("b")
    assert spec.verify(a, rows(7, 8, 9, 1), Draft([7, 8, 2])) == ([7, 8], 9)
    assert spec.verify(b, rows(4, 6), Draft([5])) == ([], 4)
    assert spec.verify(a, rows(1, 2, 3), Draft([1, 2])) == ([1, 2], 3)
    m = spec.metrics
    assert (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens) == (3, 6, 4)
    assert m.accepted_per_pos == [2, 2, 0, 0]
    assert (a.spec_drafts, a.spec_draft_tokens, a.spec_accepted_tokens) == (2, 5, 4)
    assert (b.spec_drafts, b.spec_draft_tokens, b.spec_accepted_tokens) == (1, 1, 0)
    assert m.acceptance_rate == 4 / 6 and m.mean_accepted_len == 1 + 4 / 3
    st = spec.stats()
    assert st["spec_num_drafts"] == 3 and st["spec_num_draft_tokens"] == 6
    assert st["spec_num_accepted_tokens"] == 4 and st["spec_accepted_pos_1"] == 2
    assert st["spec_accepted_pos_2"] == 0 and "spec_suffix_index_bytes" not in st


def test_k_grows_after_full_acceptance_and_shrinks_to_accepted_plus_one() -> None:
    rec = Recorder()
    spec = SpecDecoder(rec, k_max=3, max_batch_tokens=64)
    r = request("r")

    def next_k() -> int:
        rec.asked.clear()
        spec.propose([r], budget=32)
        return rec.asked[0][1]

    assert next_k() == 3                                     # starts at k_max
    spec.verify(r, rows(1, 9, 9, 9), Draft([1, 2, 2]))       # 1 of 3 accepted
    assert next_k() == 2
    spec.verify(r, rows(1, 2, 9), Draft([1, 2]))             # all accepted: + 1
    assert next_k() == 3
    spec.verify(r, rows(1, 2, 3, 4), Draft([1, 2, 3]))       # all accepted at k_max: stays
    assert next_k() == 3
    spec.verify(r, rows(9, 9, 9, 9), Draft([1, 2, 3]))       # none accepted: 1, never 0
    assert next_k() == 1
    spec.verify(r, rows(1, 2), Draft([1]))
    assert next_k() == 2


def reject(spec: SpecDecoder, r: Sequence) -> None:
    spec.verify(r, rows(9, 9), Draft([1]))


def accept(spec: SpecDecoder, r: Sequence) -> None:
    spec.verify(r, rows(1, 9), Draft([1]))


def drafts_next(spec: SpecDecoder, r: Sequence, steps: int) -> list[int]:
    return [drafted(spec.propose([r], budget=8))[0] for _ in range(steps)]


def test_a_request_that_keeps_missing_pauses_for_eight_steps() -> None:
    spec = SpecDecoder(Recorder(), k_max=1, max_batch_tokens=64)
    r = request("r")
    for _ in range(4):  # EMA 0.7 -> 0.49 -> 0.343 -> 0.24 -> 0.168: still drafting
        reject(spec, r)
    assert drafts_next(spec, r, 1) == [1]
    reject(spec, r)     # 0.1176 < 0.15 after 5 drafts: pause
    assert drafts_next(spec, r, 9) == [0] * 8 + [1]
    assert spec.metrics.no_draft_steps == 8 and spec.metrics.decode_steps == 10
    # after the pause the estimate restarts at 0.5: 0.35, 0.245, 0.17, then 0.119 pauses again
    for _ in range(3):
        reject(spec, r)
    assert drafts_next(spec, r, 1) == [1]
    reject(spec, r)
    assert drafts_next(spec, r, 1) == [0]


def test_the_estimate_counts_the_rejection_as_a_trial() -> None:
    """4 misses bring the estimate to 0.168; a draft of 2 with 1 accepted (rate 1/2) lifts it to
    0.2676 and three more misses land on 0.0918 (paused); counting only the accepted token as
    the trials (rate 1/1) would give 0.1218 at the third miss — paused one draft earlier."""
    spec = SpecDecoder(Recorder(), k_max=2, max_batch_tokens=64)
    r = request("r")
    for _ in range(4):
        reject(spec, r)
    spec.verify(r, rows(1, 9, 9), Draft([1, 2]))
    reject(spec, r)
    reject(spec, r)  # 0.2676 -> 0.187 -> 0.131 < 0.15: paused here
    assert drafts_next(spec, r, 1) == [0]


def test_full_acceptance_raises_the_estimate_by_a_whole_trial() -> None:
    """Misses to 0.168, then one full acceptance: 0.7 * 0.168 + 0.3 = 0.4176; three misses then
    leave 0.143 < 0.15 (paused). Counting a trial too many (rate 1/2) would give 0.268 -> 0.092."""
    spec = SpecDecoder(Recorder(), k_max=1, max_batch_tokens=64)
    r = request("r")
    for _ in range(4):
        reject(spec, r)
    accept(spec, r)
    reject(spec, r)
    reject(spec, r)
    assert drafts_next(spec, r, 1) == [1]  # 0.2923, 0.2046: drafting
    reject(spec, r)
    assert drafts_next(spec, r, 1) == [0]  # 0.1432: paused


def test_a_paused_request_is_left_out_of_the_cost_model() -> None:
    flat = [(1, 50.0), (8, 51.0), (64, 60.0)]
    spec = SpecDecoder(Recorder(), k_max=2, max_batch_tokens=64, cost_curve=flat)
    r = request("r")
    for _ in range(5):
        reject(spec, r)
    assert drafts_next(spec, r, 8) == [0] * 8
    assert drafts_next(spec, r, 1) == [1]  # restarted with k = accepted + 1 = 1


def test_verify_applies_biases_with_the_history_at_each_draft_position() -> None:
    """A presence penalty on row ``i`` sees ``draft[:i]``: drafting token 1 twice, the second
    row is penalised for the first and its argmax moves, as the plain sampler's would."""
    spec = SpecDecoder(Recorder(), k_max=4, max_batch_tokens=64)
    pen = SamplingParams(max_tokens=64, temperature=0.0, presence_penalty=2.0)
    logits = torch.zeros(3, V)
    logits[:, 1], logits[:, 2] = 5.0, 4.0
    assert spec.verify(request("p", params=pen), logits.clone(), Draft([1, 1])) == ([1], 2)
    # the penalty counts completion tokens only: 12 is in the prompt, so row 0 keeps it on top
    logits12 = torch.zeros(2, V)
    logits12[:, 12], logits12[:, 3] = 5.0, 4.0
    assert spec.verify(request("q", params=pen), logits12, Draft([12])) == ([12], 3)
    biased = SamplingParams(max_tokens=64, temperature=0.0, logit_bias={6: 100.0})
    assert spec.verify(request("b", params=biased), logits.clone(), Draft([6, 6])) == ([6, 6], 6)
    assert spec.verify(request("g"), logits.clone(), Draft([1, 1])) == ([1, 1], 1)


def test_verify_rejects_a_greedy_row_without_a_distribution() -> None:
    spec = SpecDecoder(Recorder(), k_max=2, max_batch_tokens=64)
    bad = rows(1, 2)
    bad[1, :] = float("nan")
    with pytest.raises(SamplingError):
        spec.verify(request("r"), bad, Draft([1]))


def test_sampled_verification_draws_from_the_requests_own_generator() -> None:
    spec = SpecDecoder(Recorder(), k_max=4, max_batch_tokens=64)
    hot = SamplingParams(max_tokens=64, temperature=1.0)
    logits = torch.zeros(3, V)  # uniform: draft tokens are accepted with p = 1/16
    got = [spec.verify(request(f"s{i}", params=hot, seed=i % 2), logits, Draft([1, 2])) for i in range(6)]
    assert got[0] == got[2] == got[4] and got[1] == got[3] == got[5]
    # a token the target gives probability 1 is always accepted, then the bonus row is used
    sure = torch.full((2, V), -1e9)
    sure[0, 3], sure[1, 8] = 0.0, 0.0
    assert spec.verify(request("t", params=hot), sure, Draft([3])) == ([3], 8)


def test_release_forgets_the_request_and_tells_the_drafter() -> None:
    rec = Recorder()
    spec = SpecDecoder(rec, k_max=3, max_batch_tokens=64)
    never = request("never")
    spec.release(never)  # a request that never drafted: nothing to forget, no error
    assert rec.released == ["never"]
    rec.released.clear()
    r = request("r")
    spec.propose([r], budget=8)
    spec.verify(r, rows(9, 9, 9, 9), Draft([1, 2, 3]))  # k -> 1
    spec.release(r)
    assert rec.released == ["r"]
    rec.asked.clear()
    spec.propose([r], budget=8)
    assert rec.asked == [("r", 3)]  # a fresh state: k_max again


def test_k_max_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="^num_speculative_tokens must be >= 1$"):
        SpecDecoder(Recorder(), k_max=0)


def test_defaults_draft_four_tokens_within_sixteen_rows() -> None:
    spec = SpecDecoder(Recorder())
    assert drafted(spec.propose([request("a")], budget=100)) == [4]
    reqs = [request(f"r{i}") for i in range(15)]  # 15 decode rows of 16: one spare row
    assert drafted(SpecDecoder(Recorder()).propose(reqs, budget=100)) == [1] + [0] * 14


def test_a_partial_acceptance_counts_two_trials_not_three() -> None:
    """From 0.7, one of two accepted (rate 1/2): 0.64; then four misses give 0.154 (still
    drafting) and the fifth 0.108 (paused). A rate of 1/3 would pause at the fourth miss."""
    spec = SpecDecoder(Recorder(), k_max=2, max_batch_tokens=64)
    r = request("r")
    spec.verify(r, rows(1, 9, 9), Draft([1, 2]))
    for _ in range(4):
        reject(spec, r)
    assert drafts_next(spec, r, 1) == [1]
    reject(spec, r)
    assert drafts_next(spec, r, 1) == [0]


def test_stats_add_the_suffix_index_figures() -> None:
    class Index:
        def __init__(self, nbytes: int, ns: int, ev: int) -> None:
            self.nbytes, self.num_namespaces, self.evicted_docs = nbytes, ns, ev

    spec = SpecDecoder(Recorder(), k_max=2)
    spec.suffix_indexes = [Index(100, 2, 1), Index(50, 3, 4)]  # as spec_factory sets them
    st = spec.stats()
    assert (st["spec_suffix_index_bytes"], st["spec_suffix_namespaces"], st["spec_suffix_evicted_docs"]) \
        == (150, 5, 5)
    assert st["spec_accepted_pos_0"] == 0 and st["spec_accepted_pos_1"] == 0 and "spec_accepted_pos_2" not in st


def test_metrics_before_any_draft_are_zero() -> None:
    m = SpecMetrics()
    assert m.mean_accepted_len == 0.0 and m.acceptance_rate == 0.0
    d = SpecMetrics(num_drafts=2, num_draft_tokens=5, num_accepted_tokens=3, decode_steps=7,
                    no_draft_steps=4).as_dict()
    assert d == {"spec_num_drafts": 2, "spec_num_draft_tokens": 5, "spec_num_accepted_tokens": 3,
                 "spec_mean_accepted_len": 2.5, "spec_acceptance_rate": 0.6, "spec_decode_steps": 7,
                 "spec_no_draft_steps": 4}


# -- the cost model -----------------------------------------------------------------------------

def test_interpolate_is_linear_between_points_and_extends_past_the_last_two() -> None:
    curve = [(1, 10.0), (5, 30.0), (9, 38.0)]
    assert interpolate(curve, 0) == 10.0 and interpolate(curve, 1) == 10.0
    assert interpolate(curve, 3) == 20.0 and interpolate(curve, 5) == 30.0
    assert interpolate(curve, 7) == 34.0 and interpolate(curve, 9) == 38.0
    assert interpolate(curve, 13) == 46.0  # slope 2 of the last segment
    assert interpolate([(1, 10.0), (5, 30.0)], 7) == 40.0  # two points: their slope, 5 per row
    assert interpolate([(1, 1.0), (4, 7.0), (4, 9.0)], 4) == 7.0  # the first segment reaching it
    assert interpolate([(4, 7.0)], 10) == 7.0  # one point: flat
    assert interpolate([(4, 7.0), (4, 9.0)], 10) == 9.0


def test_expected_tokens_edges() -> None:
    assert expected_tokens(0.9, -1) == 1.0 and expected_tokens(0.9, 0) == 1.0
    assert expected_tokens(1.0, 3) == 4.0 and expected_tokens(1.5, 2) == 3.0
    assert expected_tokens(0.0, 3) == 1.0
    assert abs(expected_tokens(0.8, 2) - 2.44) < 1e-12


def test_k_cap_picks_the_best_rate_and_needs_a_ten_percent_gain() -> None:
    # one request, alpha 0.5: k=1 -> 1.5 tokens, k=2 -> 1.75, k=3 -> 1.875
    curve = [(1, 1.0), (2, 1.2), (3, 1.4), (4, 1.6)]
    # rates: plain 1.0; k=1 1.25; k=2 1.25 (not 10 % better than 1.25); k=3 1.17
    assert choose_k_cap([0.5], [3], curve, 3) == 1
    # a gain of exactly 10 %: 1.1 tokens at cost 1.0 is not enough (strictly more needed)
    assert choose_k_cap([0.1], [1], [(1, 1.0), (2, 1.0)], 1) == 0
    assert choose_k_cap([0.11], [1], [(1, 1.0), (2, 1.0)], 1) == 1
    # a request's own limit caps its draft inside the cost model
    assert choose_k_cap([0.99, 0.99], [1, 4], [(1, 1.0), (64, 1.0)], 4) == 4
    assert choose_k_cap([0.99], [4], [(1, 1.0), (64, 1.0)], 2) == 2
