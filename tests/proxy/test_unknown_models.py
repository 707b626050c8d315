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
