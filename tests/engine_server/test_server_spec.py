"""Speculative decoding over HTTP: usage extension in answers, spec_decode families in /metrics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.servers import serve_app


@pytest.fixture(scope="module")
def spec_url(tiny_dir: Path) -> Iterator[str]:
    from prefixgate.local_engine.engine import Engine, EngineConfig
    from prefixgate.local_engine.server import build_app

    # the draft model is the target itself: every draft token is accepted (greedy)
    eng = Engine(EngineConfig(model_path=str(tiny_dir), num_kv_slots=4096, max_context_len=512,
                              model_name="tiny", speculative="draft",
                              draft_model_path=str(tiny_dir), num_speculative_tokens=3))
    try:
        with serve_app(build_app(eng)) as url:
            yield url
    finally:
        eng.shutdown()


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_completion_usage_reports_accepted_predictions(spec_url: str) -> None:
    body: dict[str, Any] = {"model": "tiny", "prompt": [[101, 202, 303, 404]], "max_tokens": 13,
                            "temperature": 0}
    usage = httpx.post(spec_url + "/v1/completions", json=body, timeout=60).json()["usage"]
    assert usage["completion_tokens"] == 13
    details = usage["completion_tokens_details"]
    # first token comes from prefill; 12 decode tokens in drafts of 3 accepted + 1 bonus
    assert details == {"accepted_prediction_tokens": 9, "rejected_prediction_tokens": 0}
    assert usage["speculative"]["num_drafts"] == 3
    assert usage["speculative"]["mean_accepted_length"] == 4.0


def test_metrics_expose_spec_decode_families(spec_url: str) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9,
            "temperature": 0}
    assert httpx.post(spec_url + "/v1/chat/completions", json=body, timeout=60).status_code == 200
    text = httpx.get(spec_url + "/metrics").text
    drafts = _metric(text, "engine_spec_decode_num_drafts_total")
    assert drafts >= 2
    assert _metric(text, "engine_spec_decode_num_accepted_tokens_total") == _metric(
        text, "engine_spec_decode_num_draft_tokens_total")
    assert 'engine_spec_decode_num_accepted_tokens_per_pos_total{position="0"}' in text
    assert _metric(text, "engine_spec_decode_draft_acceptance_rate") == 1.0
