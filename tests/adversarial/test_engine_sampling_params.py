"""Sampling parameters over HTTP (issue 20, High 2): a temperature inside OpenAI's 0-2 that the
sampler cannot divide by (1e-40, 1e-320, the smallest denormal) is greedy and answers 200 while
other streams finish; every other edge is a 400 naming its field, never a 500, never silently
dropped (``min_p``, penalties and ``logit_bias`` are applied, not ignored)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.engine_server import conftest as engine_fixtures

tiny_dir, engine, base_url = (engine_fixtures.tiny_dir, engine_fixtures.engine,
                              engine_fixtures.base_url)

BODY = {"model": "tiny", "prompt": "the cat sat on", "max_tokens": 6, "ignore_eos": True}


def _post(url: str, **extra: Any) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json={**BODY, **extra}, timeout=60)


def test_tiny_temperatures_are_greedy_and_others_finish(base_url: str) -> None:
    greedy = _post(base_url, temperature=0).json()["choices"][0]["text"]

    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=base_url, timeout=60) as c:
            bodies = [{**BODY, "temperature": t} for t in (1e-40, 1e-320, 5e-324, 0)]
            bodies += [{**BODY, "temperature": 0.8, "seed": 3, "stream": True}]
            return await asyncio.gather(*(c.post("/v1/completions", json=b) for b in bodies))

    answers = asyncio.run(main())
    assert [r.status_code for r in answers] == [200] * 5
    assert [r.json()["choices"][0]["text"] for r in answers[:4]] == [greedy] * 4
    assert answers[4].text.rstrip().endswith("data: [DONE]") and '"error"' not in answers[4].text


REFUSED = [
    ("temperature", 2.5), ("temperature", -0.1), ("top_p", 0), ("top_k", -2), ("min_p", 1.5),
    ("presence_penalty", 2.5), ("frequency_penalty", -3), ("repetition_penalty", 0),
    ("repetition_penalty", 1e300), ("seed", 2**64), ("seed", -(2**63) - 1),
    ("logit_bias", {"-1": 5}), ("logit_bias", {"49152": 5}), ("logit_bias", {" 5": 5}),
    ("logit_bias", {"٥": 5}), ("logit_bias", {"5": 101}), ("logit_bias", {"x": 1}),
]


@pytest.mark.parametrize("field,value", REFUSED, ids=[f"{f}={v!r}" for f, v in REFUSED])
def test_edges_are_400_naming_the_field(base_url: str, field: str, value: Any) -> None:
    r = _post(base_url, **{field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


@pytest.mark.parametrize("extra", [{"seed": 2**64 - 1}, {"seed": -(2**63)}, {"top_k": 0},
                                   {"top_k": -1}, {"min_p": 1.0}, {"repetition_penalty": 1e6},
                                   {"frequency_penalty": -2, "presence_penalty": 2},
                                   {"logit_bias": {"0": -100, "49151": 100}}])
def test_the_ends_of_each_range_are_served(base_url: str, extra: dict[str, Any]) -> None:
    assert _post(base_url, temperature=0.9, **extra).status_code == 200


def test_logit_bias_is_applied_not_dropped(base_url: str) -> None:
    forced = _post(base_url, temperature=0, logit_bias={"1000": 100}, max_tokens=3).json()
    with httpx.Client(base_url=base_url, timeout=30) as c:
        text = c.post("/detokenize", json={"tokens": [1000] * 3}).json()["prompt"]
    assert forced["choices"][0]["text"] == text
