"""Token ids the engine takes from a client are integers in the vocabulary, never coerced nor
silently dropped: ``/tokenize`` and ``/v1/completions`` ``prompt`` ids, ``/v1/cache/match``
``input_ids`` (and its ``cache_salt`` a string) — a boolean, float, negative or out-of-vocabulary
id is a 400 in OpenAI's shape naming the field (``[true]`` used to count as token 1, and
``/v1/cache/match`` used to answer for the ids left after dropping the bad ones)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.engine_server import conftest as engine_fixtures

# the tiny-model engine of tests/engine_server (module-scoped fixtures)
tiny_dir, engine, base_url = (engine_fixtures.tiny_dir, engine_fixtures.engine,
                              engine_fixtures.base_url)

BAD_IDS = [[True], [1, False], [1.0], [1, 1.5], [-5], [10**9], [1, "1"], [[True]]]


def _err(resp: httpx.Response, param: str) -> None:
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"].startswith(param)


@pytest.mark.parametrize("ids", BAD_IDS, ids=[repr(i) for i in BAD_IDS])
def test_prompt_ids_that_are_not_vocabulary_integers_are_a_400(base_url: str,
                                                                ids: list[Any]) -> None:
    _err(httpx.post(base_url + "/tokenize", json={"prompt": ids}, timeout=30), "prompt")
    _err(httpx.post(base_url + "/v1/completions", json={"prompt": ids, "max_tokens": 1},
                    timeout=30), "prompt")


@pytest.mark.parametrize("ids", [i for i in BAD_IDS if not isinstance(i[0], list)],
                         ids=[repr(i) for i in BAD_IDS if not isinstance(i[0], list)])
def test_cache_match_ids_that_are_not_vocabulary_integers_are_a_400(base_url: str,
                                                                     ids: list[Any]) -> None:
    _err(httpx.post(base_url + "/v1/cache/match", json={"input_ids": ids}, timeout=30),
         "input_ids")


@pytest.mark.parametrize("salt", [5, True, ["a"], {"a": 1}])
def test_cache_match_salt_must_be_a_string(base_url: str, salt: Any) -> None:
    _err(httpx.post(base_url + "/v1/cache/match", json={"input_ids": [1], "cache_salt": salt},
                    timeout=30), "cache_salt")


def test_valid_ids_still_work(base_url: str) -> None:
    r = httpx.post(base_url + "/v1/cache/match", json={"input_ids": [1, 2], "cache_salt": "s"},
                   timeout=30)
    assert r.status_code == 200 and r.json()["prompt_tokens"] == 2
    r = httpx.post(base_url + "/tokenize", json={"prompt": [[1, 2]]}, timeout=30)
    assert r.status_code == 200 and r.json()["tokens"] == [1, 2]
