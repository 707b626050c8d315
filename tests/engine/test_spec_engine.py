"""Speculative decoding in the engine: greedy output identical to plain greedy (≥ 20 prompts,
drafted and undrafted requests in one batch), drafts from n-gram / suffix / a draft model, metrics.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from prefixgate.local_engine.sched.api_types import SamplingParams
from tests.tiny_model import make_tiny_model_dir

GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


def prompts(n: int = 20) -> list[list[int]]:
    """Prompts that repeat spans (as agent inputs do) and some that do not."""
    rng = random.Random(7)
    out = []
    for i in range(n):
        span = [rng.randrange(100, 40000) for _ in range(rng.randint(4, 12))]
        noise = [rng.randrange(100, 40000) for _ in range(rng.randint(3, 20))]
        out.append(noise + span + noise[:3] + span if i % 3 else noise + span)
    return out


@pytest.fixture(scope="module")
def reference(tiny_dir: Path) -> list[list[int]]:
    from prefixgate.local_engine.engine import Engine, EngineConfig

    eng = Engine(EngineConfig(model_path=str(tiny_dir), num_kv_slots=8192, max_context_len=512))
    try:
        return eng.generate_batch(prompts(), GREEDY)
    finally:
        eng.shutdown()


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A different random-weight model on the same tokenizer (1 layer, wider MLP)."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny_draft"), num_hidden_layers=1,
                               intermediate_size=96)


def test_ngram_and_suffix_greedy_equals_plain_greedy(make_engine: Any,
                                                     reference: list[list[int]]) -> None:
    """Half the prompts ran before: their earlier outputs sit in the tree, so the suffix drafter
    proposes them (the random model never repeats itself, so n-gram lookup rarely fires); the
    other half get no draft — drafted and undrafted requests decode in the same batches."""
    eng = make_engine(max_context_len=512, speculative="ngram+suffix", spec_max_batch_tokens=512)
    assert eng.generate_batch(prompts()[:12], GREEDY) == reference[:12]
    assert eng.stats()["spec_num_drafts"] == 0
    assert eng.generate_batch(prompts(), GREEDY) == reference
    st = eng.stats()
    assert st["spec_num_drafts"] > 0 and st["spec_acceptance_rate"] > 0.9
    assert st["spec_no_draft_steps"] > 8 * 14  # the unseen prompts never had a draft


def test_draft_model_with_the_target_weights_accepts_everything(
        make_engine: Any, tiny_dir: Path, reference: list[list[int]]) -> None:
    eng = make_engine(max_context_len=512, speculative="draft", draft_model_path=str(tiny_dir),
                      num_speculative_tokens=3, spec_max_batch_tokens=512)
    assert eng.generate_batch(prompts(), GREEDY) == reference
    st = eng.stats()
    assert st["spec_acceptance_rate"] == 1.0 and st["spec_mean_accepted_len"] > 3.0
    assert st["spec_accepted_pos_0"] == st["spec_num_drafts"] >= st["spec_accepted_pos_2"] > 0


def test_random_draft_model_is_rejected_often_and_changes_nothing(
        make_engine: Any, draft_dir: Path, reference: list[list[int]]) -> None:
    eng = make_engine(max_context_len=512, speculative="draft", draft_model_path=str(draft_dir),
                      num_speculative_tokens=4, spec_max_batch_tokens=512)
    assert eng.generate_batch(prompts(), GREEDY) == reference
    st = eng.stats()
    assert st["spec_num_drafts"] > 0 and st["spec_acceptance_rate"] < 0.9


def test_compute_bound_cap_turns_drafting_off(make_engine: Any,
                                              reference: list[list[int]]) -> None:
    eng = make_engine(max_context_len=512, speculative="suffix", spec_max_batch_tokens=8)
    eng.generate_batch(prompts(), GREEDY)
    assert eng.generate_batch(prompts(), GREEDY) == reference
    # 20 requests decode together: past the cap of 8 rows no draft is proposed at all
    assert eng.stats()["spec_num_drafts"] == 0
    assert eng.generate_batch(prompts(4), GREEDY) == reference[:4]  # 4 rows: drafts again
    assert eng.stats()["spec_num_drafts"] > 0


def test_page_size_and_rollback_keep_outputs(make_engine: Any, draft_dir: Path,
                                             reference: list[list[int]]) -> None:
    """Pages of 4 and a small pool (eviction, retraction) with drafts rejected and accepted."""
    eng = make_engine(max_context_len=512, speculative="suffix+draft", page_size=4,
                      spec_max_batch_tokens=512, num_kv_slots=1024,
                      draft_model_path=str(draft_dir))
    assert eng.generate_batch(prompts(), GREEDY) == reference
    assert eng.generate_batch(prompts(), GREEDY) == reference  # now with suffix drafts too
    assert eng.stats()["spec_num_accepted_tokens"] > 0
    assert eng.stats()["kv_slots_used"] == eng.cache.total_size  # drafts' slots all returned


def test_sampled_requests_are_reproducible_with_a_seed(make_engine: Any, tiny_dir: Path) -> None:
    p = SamplingParams(max_tokens=16, temperature=0.8, top_p=0.9, seed=11, ignore_eos=True)
    runs = []
    for _ in range(2):
        eng = make_engine(max_context_len=512, speculative="draft", draft_model_path=str(tiny_dir))
        runs.append(eng.generate_batch(prompts(4), p))
        assert eng.stats()["spec_num_accepted_tokens"] > 0
    assert runs[0] == runs[1] and all(len(x) == 16 for x in runs[0])


def test_unknown_method_and_missing_draft_path_are_rejected(make_engine: Any) -> None:
    with pytest.raises(ValueError, match="unknown speculative"):
        make_engine(speculative="medusa")
    with pytest.raises(ValueError, match="draft_model_path"):
        make_engine(speculative="draft")


@pytest.mark.parametrize(("curve", "drafts"), [([(1, 50.0), (2, 100.0), (64, 3200.0)], False),
                                               ([(1, 50.0), (64, 60.0)], True)])
def test_measured_cost_curve_decides_whether_to_draft(make_engine: Any, reference: list[list[int]],
                                                      curve: list[tuple[int, float]],
                                                      drafts: bool) -> None:
    eng = make_engine(max_context_len=512, speculative="suffix", spec_max_batch_tokens=512,
                      spec_cost_curve=curve)
    eng.generate_batch(prompts(4), GREEDY)
    assert eng.generate_batch(prompts(4), GREEDY) == reference[:4]
    assert (eng.stats()["spec_num_drafts"] > 0) is drafts


def test_a_constrained_request_is_never_drafted_and_keeps_its_mask(make_engine: Any) -> None:
    """Constrained decoding (tool_choice masks, ``logits_processors``) and speculation: the
    verifier does not run the mask at draft positions, so such a request gets no draft — its
    tokens all obey the mask even where the suffix drafter holds a continuation for it."""
    import torch

    eng = make_engine(max_context_len=512, speculative="ngram+suffix", spec_max_batch_tokens=512)
    eng.generate_batch(prompts()[:4], GREEDY)  # their outputs are now in the tree: draftable

    def only_7(ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        out = torch.full_like(logits, float("-inf"))
        out[7] = 0.0
        return out

    masked = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True,
                            logits_processors=[only_7])
    before = eng.stats()["spec_num_drafts"]
    assert eng.generate_batch(prompts()[:4], masked) == [[7] * 16] * 4
    assert eng.stats()["spec_num_drafts"] == before
    assert eng.generate_batch(prompts()[:4], GREEDY) and eng.stats()["spec_num_drafts"] > before
