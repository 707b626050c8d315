"""HTTP hygiene (issue 8 class 6): request-controlled values cannot forge log lines, no response
carries a URL built from the client's Host, and HEAD is answered wherever GET is."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

from prefixgate.proxy.core.logsafe import SafeFormatter, safe
from tests.proxy.upstream import Script, completion

FORGED = "gpt-x\n2026-01-01 00:00:00 prefixgate.proxy admin login ok"


def _proxy_lines(caplog: pytest.LogCaptureFixture, rig: Any = None) -> list[str]:
    """The proxy's log lines (its own and the access line); with ``rig``, once its answered requests are recorded (the
    per-request line is logged with the row, after a non-streamed answer is sent)."""
    if rig is not None:
        rig.ledger.rows()  # waits for the rows already answered for (cache.announced_rows)
    fmt = logging.Formatter("%(name)s %(message)s")  # a plain formatter: call sites must escape
    return [fmt.format(r) for r in caplog.records if r.name in ("prefixgate.proxy", "prefixgate.access")]


def test_newline_in_model_does_not_forge_a_log_line(rig: Any,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="prefixgate.access")  # the per-request (access) line
    rig.upstream.script = Script(body=completion())
    r = httpx.post(rig.url + "/v1/chat/completions", timeout=30,
                   json={"model": FORGED, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    lines = _proxy_lines(caplog, rig)
    assert lines and all("\n" not in line for line in lines)
    assert any("gpt-x\\n2026-01-01" in line for line in lines)


@pytest.mark.parametrize("char", ["\r", "\x1b[2J", "\u2028", "\x85"])
def test_other_line_breaking_characters_in_model_are_escaped(
        rig: Any, caplog: pytest.LogCaptureFixture, char: str) -> None:
    # not named by the issue: CR, terminal escapes, Unicode line separator, NEL
    rig.upstream.script = Script(body=completion())
    caplog.set_level(logging.DEBUG, logger="prefixgate.access")  # the per-request (access) line
    httpx.post(rig.url + "/v1/chat/completions", timeout=30,
               json={"model": "m" + char + "forged", "messages": [{"role": "user",
                                                                    "content": "hi"}]})
    lines = _proxy_lines(caplog, rig)
    assert lines and not any(char in line for line in lines)


def test_newline_in_path_does_not_forge_a_log_line(rig: Any,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="prefixgate.access")  # the per-request (access) line
    rig.upstream.script = Script(body=completion())
    r = httpx.post(rig.url + "/v1/chat/completions/%0Aforged%20line", timeout=30,
                   json={"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404
    assert all("\n" not in line for line in _proxy_lines(caplog, rig))


def test_safe_formatter_escapes_any_message_but_keeps_traceback_lines() -> None:
    fmt = SafeFormatter("%(message)s")
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "model=%s", ("a\nb",),
                                sys.exc_info())
    out = fmt.format(rec)
    assert out.startswith("model=a\\nb\n") and "Traceback" in out


def test_exception_message_in_a_traceback_cannot_forge_a_line() -> None:
    # not named by the issue: an error message quoting request data, logged with its traceback
    import sys

    try:
        try:
            raise KeyError("inner")
        except KeyError as e:
            raise ValueError("bad model 'x\n2026-01-01 forged'") from e
    except ValueError:
        rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    out = SafeFormatter("%(message)s").format(rec)
    assert "bad model 'x\\n2026-01-01 forged'" in out
    assert not any(line.startswith("2026-01-01") for line in out.splitlines())
    assert "direct cause" in out and out.count("Traceback (most recent call last):") == 2


def test_safe_truncates_and_keeps_printable_text() -> None:
    assert safe("café 日本") == "café 日本"
    assert safe("a" * 300, limit=10) == "a" * 10 + "…(+290 chars)"
    assert safe("back\\slash") == "back\\\\slash"  # an escape the client typed stays visible


@pytest.mark.parametrize("host", ["evil.example", "evil.example:443", "127.0.0.1:1"])
@pytest.mark.parametrize("path", ["/v1/chat/completions/", "/healthz/", "/v1/models/"])
def test_trailing_slash_is_served_not_redirected_to_the_clients_host(
        rig: Any, host: str, path: str) -> None:
    rig.upstream.script = Script(body=completion())
    method = "POST" if "chat" in path else "GET"
    r = httpx.request(method, rig.url + path, headers={"host": host}, timeout=30,
                      json={"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]},
                      follow_redirects=False)
    assert r.status_code == 200, r.text
    assert "location" not in r.headers
    assert not any(host in v for v in r.headers.values())


def test_no_response_anywhere_carries_a_location_built_from_host(rig: Any) -> None:
    # not named by the issue: unknown paths and wrong methods, with and without the slash
    for method, path in (("GET", "/v1/chat/completions/"), ("POST", "/v1/not-an-endpoint/"),
                         ("GET", "/nothing/"), ("DELETE", "/healthz/")):
        r = httpx.request(method, rig.url + path, headers={"host": "evil.example"},
                          timeout=30, follow_redirects=False)
        assert r.status_code in (404, 405) and "location" not in r.headers


@pytest.mark.parametrize("path", ["/healthz", "/metrics", "/v1/models"])
def test_head_is_answered_wherever_get_is(rig: Any, path: str) -> None:
    get = httpx.get(rig.url + path, timeout=30)
    head = httpx.head(rig.url + path, timeout=30)
    assert head.status_code == get.status_code == 200
    assert head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]


def test_head_on_a_post_endpoint_is_still_405_with_allow(rig: Any) -> None:
    r = httpx.head(rig.url + "/v1/chat/completions", timeout=30)
    assert r.status_code == 405 and "POST" in r.headers["allow"]


def test_openapi_schema_has_one_operation_id_per_operation_and_no_duplicate_warning(
        recwarn: pytest.WarningsRecorder) -> None:
    # HEAD is served (above) but left out of the schema: FastAPI gave GET and HEAD of one
    # api_route the same operation id ("Duplicate Operation ID models_v1_models_head")
    from prefixgate.config.loader import parse_policy
    from prefixgate.proxy.app import build_app

    policy = parse_policy({"backends": {"up": {"kind": "openai_compat", "base_url": "http://x/v1"}},
                           "routes": [{"match": "*", "backend": "up"}], "ledger": {"path": ":memory:"}})
    spec = build_app(policy).openapi()
    ids = [op["operationId"] for ops in spec["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids)) and "head" not in spec["paths"]["/v1/models"]
    assert not [w for w in recwarn if "Duplicate Operation ID" in str(w.message)]
