"""Sampling with speculation keeps the distribution, end to end: the second completion token (the
first one a draft can cover) has the same distribution with and without a draft model — a
two-sample χ² homogeneity test — and the verifier's ``p`` is the sampler's distribution.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from prefixgate.local_engine.sched.api_types import SamplingParams
from prefixgate.local_engine.sched.sampler import probs_of, sample
from tests.tiny_model import make_tiny_model_dir

# χ² critical values at α = 0.001 by degrees of freedom (NIST/SEMATECH e-Handbook 1.3.6.7.4)
CHI2_999 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322,
            8: 26.124, 9: 27.877, 10: 29.588, 11: 31.264, 12: 32.909, 13: 34.528, 14: 36.123,
            15: 37.697, 16: 39.252}
N = 400


def homogeneity(a: Counter[int], b: Counter[int]) -> tuple[float, int]:
    """Two-sample χ² statistic and degrees of freedom; categories with < 10 pooled are merged."""
    pooled = a + b
    keys = [k for k, n in pooled.items() if n >= 10]
    other = lambda c: sum(n for k, n in c.items() if k not in keys)  # noqa: E731
    rows = [[a[k] for k in keys] + [other(a)], [b[k] for k in keys] + [other(b)]]
    cols = [x + y for x, y in zip(*rows)]
    cols_idx = [i for i, c in enumerate(cols) if c > 0]
    na, nb = sum(rows[0]), sum(rows[1])
    stat = 0.0
    for r, n in zip(rows, (na, nb)):
        for i in cols_idx:
            e = cols[i] * n / (na + nb)
            stat += (r[i] - e) ** 2 / e
    return stat, len(cols_idx) - 1


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny_draft_dist"), num_hidden_layers=1,
                               intermediate_size=96)


PROMPT = [1500, 1600, 1700, 1800, 1900]


def second_tokens(eng: Any, seed0: int) -> Counter[int]:
    prompt = PROMPT
    params = [SamplingParams(max_tokens=3, temperature=1.0, top_k=4, seed=seed0 + i,
                             ignore_eos=True) for i in range(N)]
    return Counter(out[1] for out in eng.generate_batch([prompt] * N, params))


def test_draft_model_sampling_keeps_the_second_token_distribution(
        make_engine: Any, draft_dir: Path) -> None:
    plain = second_tokens(make_engine(max_context_len=256), 0)
    spec_eng = make_engine(max_context_len=256, speculative="draft",
                           draft_model_path=str(draft_dir), num_speculative_tokens=1,
                           spec_max_batch_tokens=4096)
    spec = second_tokens(spec_eng, 10_000)
    # the random draft's top-4 misses the target's: min(1, p/q) rejects, max(0, p - q) samples
    assert spec_eng.stats()["spec_num_drafts"] == N
    stat, df = homogeneity(plain, spec)
    assert df >= 2 and stat < CHI2_999[df], (stat, df, plain, spec)


def test_deterministic_drafts_keep_the_second_token_distribution(make_engine: Any) -> None:
    """The suffix drafter proposes the greedy continuation (held in the tree): accepted with
    p(x), else the token is drawn from p without x."""
    plain = second_tokens(make_engine(max_context_len=256), 20_000)
    spec_eng = make_engine(max_context_len=256, speculative="suffix", num_speculative_tokens=1,
                           spec_max_batch_tokens=4096)
    spec_eng.generate_batch([PROMPT], SamplingParams(max_tokens=3, temperature=0.0))
    spec = second_tokens(spec_eng, 30_000)
    st = spec_eng.stats()
    assert st["spec_num_drafts"] >= 20 and 0 < st["spec_acceptance_rate"] < 1
    stat, df = homogeneity(plain, spec)
    assert df >= 2 and stat < CHI2_999[df], (stat, df, plain, spec)


def test_verifier_target_distribution_is_the_samplers() -> None:
    torch.manual_seed(0)
    logits = torch.randn(1, 12) * 2
    params = SamplingParams(temperature=0.7, top_k=6, top_p=0.9)
    p = probs_of(logits, params)[0]
    gens = [torch.Generator().manual_seed(i) for i in range(3000)]
    counts = Counter(sample(logits.expand(3000, 12).contiguous(), [params] * 3000, gens))
    support = [i for i in range(12) if p[i] > 0]
    assert set(counts) <= set(support)  # top-k / top-p cut the same tokens
    stat = sum((counts[i] - 3000 * float(p[i])) ** 2 / (3000 * float(p[i])) for i in support)
    assert stat < CHI2_999[len(support) - 1]
