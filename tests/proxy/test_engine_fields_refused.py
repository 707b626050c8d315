"""Engine-to-engine fields are never a client's (issue 34, items 2, 11, 12): through the real
proxy app, a client's ``kv_transfer_params`` / ``first_token_ids`` / ``bootstrap_*`` are refused
with a 400 naming the field, in the caller's API shape, and never reach the backend; on a
llama.cpp backend a client's ``id_slot`` is replaced by the conversation's own slot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from tests.routing.llamacpp_upstream import LlamaCppScript, serve_llamacpp
from tests.servers import serve_app

MSGS = [{"role": "user", "content": "What is the capital of France?"}]


def _app(kind: str, upstream: str, tmp_path: Path) -> Any:
    policy = parse_policy({"backends": {"b": {"kind": kind, "base_url": upstream, "slots": 4}},
                           "routes": [{"match": "*", "backend": "b"}],
                           "ledger": {"path": str(tmp_path / "l.sqlite")}})
    return build_app(policy, rewrite_fn=None, analyze=False)


@pytest.mark.parametrize("field,value", [
    ("kv_transfer_params", {"do_remote_prefill": True, "transfer_id": 12345}),
    ("kv_transfer_params", {"do_remote_prefill": True, "transfer_id": 0,
                            "first_token_ids": [39, 3791]}),
    ("first_token_ids", [39, 3791]),
    ("bootstrap_room", 7),
    ("bootstrap_host", "10.0.0.9"),
])
def test_a_clients_pd_contract_field_is_refused_and_never_sent(
        field: str, value: Any, tmp_path: Path) -> None:
    script = LlamaCppScript(4)
    with serve_llamacpp(script) as upstream, serve_app(
            _app("openai_compat", upstream, tmp_path)) as url:
        r = httpx.post(url + "/v1/chat/completions", timeout=30,
                       json={"model": "m", "messages": MSGS, "max_tokens": 4, field: value})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == field and field in err["message"]
        a = httpx.post(url + "/v1/messages", timeout=30,
                       json={"model": "m", "messages": MSGS, "max_tokens": 4, field: value})
        assert a.status_code == 400 and a.json()["type"] == "error", a.text
        assert field in a.json()["error"]["message"]
        for path, body in (("/v1/completions", {"model": "m", "prompt": "Paris is", field: value}),
                           ("/v1/responses", {"model": "m", "input": "Paris is", field: value})):
            other = httpx.post(url + path, json=body, timeout=30)  # every model endpoint
            assert other.status_code == 400 and field in other.text, (path, other.text)
        ok = httpx.post(url + "/v1/chat/completions", timeout=30,
                        json={"model": "m", "messages": MSGS, "max_tokens": 4})
        assert ok.status_code == 200, ok.text
    assert len(script.seen) == 1  # only the clean request reached the backend


def test_a_clients_id_slot_is_replaced_by_its_conversations_slot(tmp_path: Path) -> None:
    script = LlamaCppScript(4)
    with serve_llamacpp(script) as upstream, serve_app(_app("llamacpp", upstream, tmp_path)) as url:
        for conv, asked in (("a", None), ("b", None), ("b", 0), ("b", "0; drop"), ("b", -1)):
            body: dict[str, Any] = {"model": "m", "messages": MSGS, "max_tokens": 4}
            if asked is not None:
                body["id_slot"] = asked
            r = httpx.post(url + "/v1/chat/completions", json=body, timeout=30,
                           headers={"x-prefixgate-session": conv})
            assert r.status_code == 200, r.text
    a, b = script.seen[0], script.seen[1]
    assert a != b and isinstance(b, int)
    # conversation b asked for a's slot, then for values llama.cpp would take as sent: it kept its own
    assert script.seen[2:] == [b, b, b], script.seen
