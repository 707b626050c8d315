"""The server under ``prefixgate serve`` bounds what one connection may hold (issue 8 class 6):
headers larger than ``limits.max_header_bytes`` are a 431 in the caller's shape, headers not
complete within ``limits.header_timeout_s`` and bodies not complete within
``limits.body_timeout_s`` end the connection (408), idle keep-alive connections are closed after
``limits.keep_alive_s``, and ``limits.max_connections`` caps concurrency. Raw sockets throughout:
an HTTP client library would not misbehave this way."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefixgate.cache.ledger.store import Ledger
from prefixgate.proxy.app import build_app
from prefixgate.proxy.http.server import uvicorn_options
from tests.proxy.conftest import make_policy
from tests.proxy.upstream import Script, completion
from tests.servers import serve_app

FAST = {"header_timeout_s": 0.5, "body_timeout_s": 0.5, "keep_alive_s": 0.5,
        "max_header_bytes": 8192}


@pytest.fixture
def limited(tmp_path: Path, upstream: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``limited(**limits) -> base URL`` of a proxy served with those policy limits."""
    monkeypatch.setenv("PG_TEST_ANTHROPIC_KEY", "backend-placeholder")
    up, up_url = upstream
    up.script = Script(body=completion())
    stack: list[Any] = []

    def make(**limits: Any) -> str:
        policy = make_policy(up_url, tmp_path / "ledger.sqlite", limits={**FAST, **limits})
        cm = serve_app(build_app(policy, ledger=Ledger(policy.ledger.path), rewrite_fn=None),
                       **uvicorn_options(policy.limits))
        stack.append(cm)
        return cm.__enter__()

    yield make
    for cm in reversed(stack):
        cm.__exit__(None, None, None)


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=20)
    return s


def _read_all(s: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    return out


def _send_quietly(s: socket.socket, data: bytes) -> bool:
    try:
        s.sendall(data)
        return True
    except (BrokenPipeError, ConnectionResetError):
        return False


@pytest.mark.parametrize("size", [100_000, 10_000_000])
def test_header_larger_than_the_limit_is_a_431_in_openai_shape(limited: Any, size: int) -> None:
    url = limited()
    s = _connect(url)
    _send_quietly(s, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-big: ")
    sent = 0
    while sent < size and _send_quietly(s, b"a" * 65536):  # the server hangs up well before
        sent += 65536
    out = _read_all(s)
    assert out.startswith(b"HTTP/1.1 431 ")
    body = json.loads(out.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == "headers_too_large" and "8192" in body["error"]["message"]
    if size > 1_000_000:
        assert sent < size  # cut off long before the client could send it all


def test_many_small_headers_past_the_limit_are_a_431_in_anthropic_shape(limited: Any) -> None:
    # not named by the issue: the limit is on the whole head, not on one header
    url = limited()
    s = _connect(url)
    head = b"POST /v1/messages HTTP/1.1\r\nhost: x\r\n" + b"".join(
        b"x-h%d: %s\r\n" % (i, b"v" * 50) for i in range(400))
    _send_quietly(s, head)
    out = _read_all(s)
    assert out.startswith(b"HTTP/1.1 431 ")
    body = json.loads(out.split(b"\r\n\r\n", 1)[1])
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"


def test_headers_sent_one_byte_at_a_time_are_cut_off_at_the_header_deadline(limited: Any) -> None:
    url = limited()
    s = _connect(url)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-slow: " + b"a" * 10_000
    dripped = 0
    for byte in head:  # a slowloris: one byte every 10 ms, 100+ s to finish
        if not _send_quietly(s, bytes([byte])):
            break
        dripped += 1
        time.sleep(0.01)
        s.setblocking(False)
        try:
            if s.recv(65536, socket.MSG_PEEK):
                break  # the server has answered
        except BlockingIOError:
            pass
        finally:
            s.setblocking(True)
    s.settimeout(20)
    out = _read_all(s)
    assert out.startswith(b"HTTP/1.1 408 ")
    assert dripped < len(head)  # cut off before the headers were complete


def test_connection_that_never_sends_a_byte_is_closed(limited: Any) -> None:
    s = _connect(limited())
    assert _read_all(s) == b""  # closed by the server, no response to a request never made


def test_slow_body_is_a_408_in_the_callers_shape(limited: Any) -> None:
    url = limited()
    for path, anthropic in (("/v1/chat/completions", False), ("/v1/messages", True)):
        s = _connect(url)
        s.sendall(f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  "content-length: 1000\r\n\r\n{\"model\": ".encode())
        out = _read_all(s)
        assert out.startswith(b"HTTP/1.1 408 "), out[:100]
        body = json.loads(out.split(b"\r\n\r\n", 1)[1])
        if anthropic:
            assert body["type"] == "error" and "body_timeout_s" in body["error"]["message"]
        else:
            assert body["error"]["code"] == "request_timeout"


def test_idle_keep_alive_connection_is_closed_after_keep_alive_s(limited: Any) -> None:
    url = limited()
    s = _connect(url)
    s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
    out = _read_all(s)  # returns once the server closes the kept-alive connection
    assert out.startswith(b"HTTP/1.1 200 ") and out.count(b"HTTP/1.1") == 1


def test_slow_connections_do_not_keep_a_normal_request_from_being_served(limited: Any) -> None:
    url = limited()
    slow = [_connect(url) for _ in range(50)]
    for s in slow:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-slow: a")
    r = httpx.post(url + "/v1/chat/completions", timeout=20,
                   json={"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    assert all(_read_all(s).startswith(b"HTTP/1.1 408 ") for s in slow)


def test_connections_past_max_connections_get_503(limited: Any) -> None:
    url = limited(max_connections=2, header_timeout_s=30, keep_alive_s=30)
    held = [_connect(url) for _ in range(2)]
    for s in held:
        s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        s.recv(65536)  # served; the connection stays open (keep-alive)
    r = httpx.get(url + "/healthz", timeout=20)
    assert r.status_code == 503
    for s in held:
        s.close()


# --- issue 20 High 1: only head bytes count (raw sockets; the protocol-level cases are in
# test_header_limit_counts_heads.py) --------------------------------------------------------

def _chat(body_bytes: int) -> bytes:
    pad = "x" * max(0, body_bytes - 80)
    return json.dumps({"model": "gpt-x", "messages": [{"role": "user", "content": pad}]}).encode()


def _post_bytes(body: bytes, path: str = "/v1/chat/completions") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


def _responses(s: socket.socket, n: int) -> list[int]:
    """Statuses of the next ``n`` responses on ``s`` (content-length framed)."""
    buf, out = b"", []
    while len(out) < n:
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            assert chunk, f"closed after {out}"
            buf += chunk
        head, buf = buf.split(b"\r\n\r\n", 1)
        length = int(next(ln.split(b":", 1)[1] for ln in head.split(b"\r\n")
                          if ln.lower().startswith(b"content-length:")))
        while len(buf) < length:
            buf += s.recv(65536)
        buf = buf[length:]
        out.append(int(head.split(b" ")[1]))
    return out


def test_a_small_head_and_a_330_kb_body_in_one_send_are_served(limited: Any) -> None:
    url = limited()  # max_header_bytes 8192: the body is 40x the limit
    req = _post_bytes(_chat(330_000))
    for _ in range(10):  # the SDK's 330 KB conversation got 431 on 5 of 10 tries
        s = _connect(url)
        s.sendall(req)
        assert _responses(s, 1) == [200]
        s.close()


def test_an_http_client_sending_large_bodies_is_never_431(limited: Any) -> None:
    url = limited()
    with httpx.Client(timeout=20) as c:
        codes = [c.post(url + "/v1/chat/completions", content=_chat(n),
                        headers={"content-type": "application/json"}).status_code
                 for n in (9_000, 70_000, 330_000, 1_000_000) for _ in range(3)]
    assert codes == [200] * 12


def test_a_head_split_across_sends_then_its_body_is_served(limited: Any) -> None:
    url = limited()
    req = _post_bytes(_chat(100_000))
    head_len = req.index(b"\r\n\r\n") + 4
    s = _connect(url)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for a, b in ((0, 20), (20, head_len - 2), (head_len - 2, len(req))):
        s.sendall(req[a:b])  # the blank line itself is split across sends
        time.sleep(0.05)
    assert _responses(s, 1) == [200]


def test_two_pipelined_requests_in_one_send_are_both_served(limited: Any) -> None:
    url = limited()
    s = _connect(url)
    s.sendall(_post_bytes(_chat(100_000)) + _post_bytes(_chat(200)))
    assert _responses(s, 2) == [200, 200]


def test_a_pipelined_request_with_large_headers_is_431_after_the_first_is_answered(
        limited: Any) -> None:
    # not named by the issue: the pipelined head's own bytes still count
    url = limited()
    s = _connect(url)
    big = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 9000 + b"\r\n\r\n"
    s.sendall(_post_bytes(_chat(50_000)) + big)
    out = _read_all(s)
    assert out.startswith(b"HTTP/1.1 200 ") and b"HTTP/1.1 431 " in out


def test_the_openai_sdk_sending_a_330_kb_conversation_is_never_431(limited: Any) -> None:
    # the report: the SDK got 431 on 5 of 10 tries and does not retry a 431 (whether a
    # read holds head + body depends on timing here; test_header_limit_counts_heads fixes the reads)
    import openai

    url = limited()
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=20)
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": "x" * 3300}
             for i in range(99)]
    for _ in range(10):
        done = client.chat.completions.create(model="gpt-x", messages=turns)  # type: ignore[arg-type]
        assert done.choices[0].message.content == "hi"
