"""``stable_prefix_hash`` hashes the same text whether the region is encoded in one call or
piece by piece (issue 25: the one-shot C encoder on the hot path, the piecewise one for huge
regions), so prompt_cache_key, affinity and the ledger keep their values."""

from __future__ import annotations

import hashlib
import json

import pytest

from prefixgate.rewriter.analysis import stable
from prefixgate.rewriter.analysis.stable import stable_prefix_hash, stable_region
from prefixgate.rewriter.wire import codec as wire
from tests.trace_requests import anthropic_fixture_bodies, tau_requests


def _reference(region: dict) -> str:
    text = json.dumps(region, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _prompts() -> list:
    out = [wire.parse(b, "openai") for run in tau_requests()[:2] for b in run[:2]]
    out += [wire.parse(b, "anthropic") for b in anthropic_fixture_bodies()[:3]]
    odd = {"model": "m", "messages": [{"role": "system", "content": "é\u2028\x01 \"q\" \\ 1.10"},
                                      {"role": "user", "content": "hi"}],
           "tools": [{"type": "function", "function": {"name": "f", "parameters": {"n": 1e16}}}]}
    return out + [wire.parse(odd, "openai")]


@pytest.mark.parametrize("items, chars", [(10**9, 10**9), (0, 10**9), (10**9, 0)])
def test_both_encodings_hash_the_documented_text(monkeypatch: pytest.MonkeyPatch, items: int,
                                                 chars: int) -> None:
    monkeypatch.setattr(stable, "ONE_SHOT_MAX_ITEMS", items)
    monkeypatch.setattr(stable, "ONE_SHOT_MAX_CHARS", chars)
    for p in _prompts():
        assert stable_prefix_hash(p) == _reference(stable_region(p))
