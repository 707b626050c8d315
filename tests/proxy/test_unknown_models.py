"""Unknown models are a 404 ``model_not_found`` with "did you mean" (issue 22, item 2): with the
shipped policy a typo (``gtp-4o``, ``smolm2``) or an empty model name answered 200 from the local
model through a ``*`` route."""

from __future__ import annotations

import httpx
import pytest

from prefixgate.config.loader import default_policy
from prefixgate.proxy.app import build_app
from prefixgate.proxy.core.errors import ModelNotFound
from prefixgate.proxy.routing.router import did_you_mean, plan_targets
from tests.servers import serve_app


@pytest.mark.parametrize("model, hint", [
    ("smolm2", "'smollm2'"), ("SmolLM2-135M-Instruc", "'SmolLM2-135M-Instruct'"),
    ("gtp-4o", "a model matching 'gpt-*'"), ("cluade-3-5", "a model matching 'claude-*'"),
    ("lcoal", "'local'"),
])
def test_a_typo_is_a_404_that_names_the_closest_callable_model(model: str, hint: str) -> None:
    with pytest.raises(ModelNotFound) as e:
        plan_targets(default_policy(), model, "openai")
    assert e.value.status == 404 and e.value.code == "model_not_found"
    assert f"Did you mean {hint}" in e.value.message or f"or {hint}" in e.value.message


@pytest.mark.parametrize("model", ["", "zzzzzz-unrelated"])
def test_nothing_close_gives_no_suggestion(model: str) -> None:
    assert did_you_mean(default_policy(), model) == ""
    with pytest.raises(ModelNotFound):
        plan_targets(default_policy(), model, "openai")


def test_the_local_model_is_reachable_by_its_id_and_its_aliases() -> None:
    for name in ("SmolLM2-135M-Instruct", "smollm2", "local"):
        (t,) = plan_targets(default_policy(), name, "openai")
        assert t.backend_name == "local"


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"model": "gtp-4o", "messages": [{"role": "user", "content": "x"}]}),
    ("/v1/messages", {"model": "smolm2", "max_tokens": 4,
                      "messages": [{"role": "user", "content": "x"}]}),
    ("/v1/chat/completions", {"model": "", "messages": [{"role": "user", "content": "x"}]}),
])
def test_through_the_proxy_a_typo_is_a_shaped_404_and_nothing_is_sent(path: str,
                                                                       body: dict) -> None:
    app = build_app(default_policy().model_copy(update={"ledger": default_policy().ledger.model_copy(
        update={"path": ":memory:"})}), rewrite_fn=None, analyze=False)
    with serve_app(app) as url:
        r = httpx.post(url + path, json=body, timeout=30)
    assert r.status_code == 404, r.text
    err = r.json()["error"]
    assert err.get("code", err.get("type")) in ("model_not_found", "not_found_error")
    assert "does not exist" in err["message"]


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_an_unknown_response_id_is_a_404_when_the_openai_key_is_unset(
        method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped policy's OpenAI backend without ``OPENAI_API_KEY``: an id the store does not
    hold is a 404 (it was a 500 "OPENAI_API_KEY is not set", issue 22 item 3)."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    policy = default_policy()
    policy = policy.model_copy(update={"ledger": policy.ledger.model_copy(update={"path": ":memory:"})})
    with serve_app(build_app(policy, rewrite_fn=None, analyze=False)) as url:
        r = httpx.request(method, url + "/v1/responses/resp_nope", timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_a_missing_backend_key_is_a_status_the_sdks_do_not_retry(monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    import openai

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    policy = default_policy()
    policy = policy.model_copy(update={"ledger": policy.ledger.model_copy(update={"path": ":memory:"})})
    app = build_app(policy, rewrite_fn=None, analyze=False)
    with serve_app(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=3)
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 424
    assert "OPENAI_API_KEY" in str(e.value) and "restart" in str(e.value)
    assert len(app.state.proxy.ledger.rows()) == 1  # one request: the SDK did not retry it
