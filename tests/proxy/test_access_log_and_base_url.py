"""What a user sees in the terminal and in a wrong ``base_url``'s answer (issue 37, items 4 and
10): one access line per client request with method, path, status, model and TTFT (never the
prompt), and a 404 for ``/v1/v1/...`` that says which ``base_url`` to use."""

from __future__ import annotations

import logging
import time
from typing import Any

import anthropic
import httpx
import pytest

from tests.proxy.upstream import DONE, Script, chunk

SECRET = "the prompt text must never be logged"


def test_one_access_line_per_request_without_prompt_text(rig: Any,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="prefixgate.access")
    rig.upstream.script = Script(pieces=[chunk("o"), chunk("k", finish="stop"), DONE])
    r = httpx.post(rig.url + "/v1/chat/completions", timeout=30, json={
        "model": "m", "stream": True, "messages": [{"role": "user", "content": SECRET}]})
    assert r.status_code == 200

    def lines() -> list[str]:
        return [rec.getMessage() for rec in caplog.records if rec.name == "prefixgate.access"]

    deadline = time.monotonic() + 10
    while not lines() and time.monotonic() < deadline:  # the row is recorded after the stream
        time.sleep(0.05)
    httpx.post(rig.url + "/v1/v1/chat/completions", timeout=30, json={"model": "m"})
    assert len(lines()) == 2, lines()
    ok, missing = lines()
    assert ok.startswith("POST /v1/chat/completions 200 model=m ttft_ms=") and "cached=" in ok
    assert float(ok.split("ttft_ms=")[1].split()[0]) >= 0
    assert missing == "POST /v1/v1/chat/completions 404 (no such endpoint)"
    assert all(SECRET not in rec.getMessage() for rec in caplog.records)


def test_an_anthropic_sdk_base_url_ending_in_v1_is_told_which_to_use(rig: Any) -> None:
    client = anthropic.Anthropic(base_url=rig.url + "/v1", api_key="sk-proxy-anything",
                                 max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="m", max_tokens=8,
                               messages=[{"role": "user", "content": "hi"}])
    msg = str(e.value)
    assert "Invalid URL (POST /v1/v1/messages)" in msg
    assert f'base_url="{rig.url}" (without /v1)' in msg


def test_a_doubled_prefix_on_openai_paths_names_both_sdks(rig: Any) -> None:
    r = httpx.post(rig.url + "/v1/v1/chat/completions", json={}, timeout=30)
    assert r.status_code == 404
    msg = r.json()["error"]["message"]
    assert f'base_url="{rig.url}/v1" with the OpenAI SDK' in msg
    plain = httpx.post(rig.url + "/v1/nope", json={}, timeout=30).json()["error"]["message"]
    assert plain == "Invalid URL (POST /v1/nope)"  # no hint where none applies
