"""Issue 20 High 3: keys fail closed. Once the proxy has required keys, no state of the keys file
opens it: emptied, deleted, the last key removed (no key in the file is valid any more),
unreadable, not YAML, the wrong shape, not a regular file, too large (the keys read before
stay) — every request without a valid key is a 401, the log says so once, ``/healthz`` lists
the reason (503) until the file is fixed."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

import prefixgate.proxy.http.keystore
from prefixgate.config.loader import save_keys_file
from prefixgate.config.schema import AuthSettings, ProxyKey
from prefixgate.proxy.cli import app as cli
from prefixgate.proxy.http.keystore import MAX_KEYS_FILE_BYTES, KeyStore, hash_key
from tests.proxy.upstream import Script, completion

KEY = "pgk-fail-closed-key-one-0123456789abcdefghijklmn"
OTHER = "pgk-fail-closed-key-two-0123456789abcdefghijklmn"
CHAT = {"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(autouse=True)
def _reload_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefixgate.proxy.http.keystore, "RELOAD_EVERY_S", 0.0)


def _empty(kf: Path) -> None:
    kf.write_text("")


def _empty_list(kf: Path) -> None:
    kf.write_text("keys: []\n")


def _deleted(kf: Path) -> None:
    kf.unlink()


def _garbage(kf: Path) -> None:
    kf.write_text("keys: [{id: k_one, hash: not-a-hash")


def _not_utf8(kf: Path) -> None:
    kf.write_bytes(b"keys:\n  - \xff\xfe\xfd\n")


def _wrong_shape(kf: Path) -> None:
    kf.write_text("keys: 5\n")


def _a_folder(kf: Path) -> None:  # unreadable even for root (tests may run as root)
    kf.unlink()
    kf.mkdir()


def _a_fifo(kf: Path) -> None:  # reading it would block the event loop for ever
    kf.unlink()
    os.mkfifo(kf)


def _too_large(kf: Path) -> None:
    with kf.open("ab") as f:
        f.truncate(MAX_KEYS_FILE_BYTES + 1)


def _unreadable_folder(kf: Path) -> None:
    kf.parent.chmod(0)  # only bites when not root; the folder case above covers root


# (how the file breaks, whether the key read before still admits)
NO_KEYS: list[Callable[[Path], None]] = [_empty, _empty_list, _deleted]
BROKEN: list[Callable[[Path], None]] = [_garbage, _not_utf8, _wrong_shape, _a_folder, _a_fifo,
                                         _too_large]


def _store(tmp_path: Path) -> tuple[KeyStore, Path]:
    kf = tmp_path / "keys.yaml"
    save_keys_file(kf, [ProxyKey(id="k_one", hash=hash_key(KEY))])
    return KeyStore(AuthSettings(keys_file=str(kf))), kf


@pytest.mark.parametrize("brk", NO_KEYS, ids=lambda f: f.__name__)
def test_a_keys_file_left_without_keys_refuses_everyone(tmp_path: Path, brk: Any) -> None:
    store, kf = _store(tmp_path)
    assert store.configured and store.lookup(KEY) is not None and store.reasons() == []
    brk(kf)
    assert store.configured  # keys still required: the proxy does not open
    assert store.lookup(KEY) is None and store.lookup(OTHER) is None  # removed = revoked
    (reason,) = store.reasons()
    assert "no keys" in reason and str(kf) not in reason  # /healthz is open: no path in it


@pytest.mark.parametrize("brk", BROKEN, ids=lambda f: f.__name__)
def test_a_keys_file_that_cannot_be_read_keeps_the_keys_read_before(
        tmp_path: Path, brk: Any) -> None:
    store, kf = _store(tmp_path)
    brk(kf)
    t0 = time.monotonic()
    assert store.configured
    assert time.monotonic() - t0 < 1  # the FIFO was not opened
    assert store.lookup(KEY) is not None and store.lookup(OTHER) is None
    (reason,) = store.reasons()
    assert "unreadable" in reason and str(kf) not in reason


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a folder with mode 0")
def test_a_keys_folder_that_cannot_be_looked_into_keeps_refusing(tmp_path: Path) -> None:
    store, kf = _store(tmp_path)
    _unreadable_folder(kf)
    try:
        assert store.configured and store.lookup(OTHER) is None and store.reasons()
    finally:
        kf.parent.chmod(0o700)


def test_the_problem_is_logged_once_and_its_end_too(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store, kf = _store(tmp_path)
    caplog.set_level(logging.WARNING, "prefixgate.auth")
    _garbage(kf)
    for _ in range(5):
        store.keys()
    kf.write_text("keys: [{id: k_one, hash: also-not-a-hash}]\n")  # broken the same way
    for _ in range(5):
        store.keys()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and str(kf) in errors[0].getMessage()  # the log names the file
    assert "also-not-a-hash" not in store.reasons()[0]  # /healthz shows no file content
    _empty(kf)  # a different problem: one more line
    store.keys()
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 2
    assert KEY not in caplog.text and hash_key(KEY) not in caplog.text
    save_keys_file(kf, [ProxyKey(id="k_two", hash=hash_key(OTHER))])
    assert store.lookup(OTHER) is not None and store.lookup(KEY) is None
    assert store.reasons() == [] and "readable again" in caplog.text


def test_an_unreadable_keys_file_at_start_requires_keys(tmp_path: Path) -> None:
    # not named by the issue: broken before any key was ever read -> closed, not open
    kf = tmp_path / "keys.yaml"
    kf.write_text("keys: [{oops")
    store = KeyStore(AuthSettings(keys_file=str(kf)))
    assert store.configured and store.keys() == [] and store.reasons()


def test_a_proxy_without_keys_yet_stays_open_until_the_first_key_then_never_again(
        tmp_path: Path) -> None:
    # a fresh loopback setup: no keys file yet is not a problem; once a key came, it is
    kf = tmp_path / "keys.yaml"
    store = KeyStore(AuthSettings(keys_file=str(kf)))
    assert not store.configured and store.reasons() == []
    save_keys_file(kf, [ProxyKey(id="k_one", hash=hash_key(KEY))])
    assert store.configured
    _deleted(kf)
    assert store.configured and store.lookup(KEY) is None


def test_an_inline_key_still_admits_when_the_file_is_emptied(tmp_path: Path) -> None:
    kf = tmp_path / "keys.yaml"
    save_keys_file(kf, [ProxyKey(id="k_one", hash=hash_key(KEY))])
    store = KeyStore(AuthSettings(keys=[ProxyKey(id="k_inline", hash=hash_key(OTHER))],
                                  keys_file=str(kf)))
    _empty(kf)
    assert store.lookup(OTHER) is not None and store.lookup(KEY) is None


def test_a_change_within_the_same_mtime_tick_is_seen(tmp_path: Path) -> None:
    # not named by the issue: a replacement of the same size in the same mtime tick (coarse
    # file-system clocks) is a new inode: still re-read
    store, kf = _store(tmp_path)
    st = kf.stat()
    save_keys_file(kf, [ProxyKey(id="k_one", hash=hash_key(OTHER))])  # same length
    os.utime(kf, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert store.lookup(OTHER) is not None and store.lookup(KEY) is None


# --- the running proxy ----------------------------------------------------------------------

def _policy(tmp_path: Path) -> tuple[Path, Path]:
    kf = tmp_path / "keys.yaml"
    save_keys_file(kf, [ProxyKey(id="k_one", name="one", hash=hash_key(KEY))])
    return tmp_path / "p.yaml", kf


def _remove_last(kf: Path) -> None:
    p = kf.parent / "p.yaml"
    p.write_text("backends:\n  b: {kind: openai_compat, base_url: 'http://127.0.0.1:9/v1'}\n"
                 f"routes:\n  - {{match: '*', backend: b}}\nauth: {{keys_file: {kf.name}}}\n")
    r = CliRunner().invoke(cli, ["keys", "remove", "one", "--policy", str(p)])
    assert r.exit_code == 0 and "last key" in r.output


@pytest.mark.parametrize("brk", [_empty, _deleted, _remove_last, _garbage, _a_folder],
                         ids=lambda f: f.__name__)
def test_the_running_proxy_keeps_refusing_requests_without_a_key(
        rig_factory: Any, tmp_path: Path, brk: Any) -> None:
    _, kf = _policy(tmp_path)
    rig = rig_factory(auth={"keys_file": str(kf)})
    rig.upstream.script = Script(body=completion())
    post = lambda **h: httpx.post(rig.url + "/v1/chat/completions", json=CHAT,  # noqa: E731
                                  headers=h, timeout=30).status_code
    assert post() == 401 and post(authorization=f"Bearer {KEY}") == 200
    reasons = lambda: httpx.get(rig.url + "/healthz", timeout=30).json()["reasons"]  # noqa: E731
    assert not any(r.startswith("proxy keys:") for r in reasons())
    brk(kf)
    deadline = time.monotonic() + 1.5  # the issue saw it open within a second: keep asking
    while time.monotonic() < deadline:
        assert post() == 401
        assert post(authorization=f"Bearer {OTHER}") == 401
        assert post(**{"x-api-key": "anything"}) == 401
        time.sleep(0.1)
    kept = brk in (_garbage, _a_folder)
    assert post(authorization=f"Bearer {KEY}") == (200 if kept else 401)
    health = httpx.get(rig.url + "/healthz", timeout=30)
    assert health.status_code == 503
    assert any(r.startswith("proxy keys:") for r in health.json()["reasons"])
    assert str(kf) not in health.text
    n = len(rig.upstream.seen)
    assert n == 1 + (1 if kept else 0)  # nothing without a valid key reached the upstream
