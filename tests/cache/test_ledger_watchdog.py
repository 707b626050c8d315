"""The ledger's client-side deadline (:mod:`prefixgate.cache.ledger.watchdog`): a read blocked on
a socket whose peer never answers returns end-of-file once the deadline passes; a call that
finishes in time is never cut; ``cut_all`` frees every blocked call at once (a shutdown)."""

from __future__ import annotations

import socket
import threading

from prefixgate.cache.ledger.watchdog import Watchdog


def _blocked_read(sock: socket.socket, out: list[bytes]) -> threading.Thread:
    t = threading.Thread(target=lambda: out.append(sock.recv(10)), daemon=True)
    t.start()
    return t


def test_a_read_past_its_deadline_is_cut_and_returns() -> None:
    a, b = socket.socketpair()  # b is the server that never answers
    wd = Watchdog()
    got: list[bytes] = []
    with wd.guard(a.fileno(), 0.2) as g:
        t = _blocked_read(a, got)
        t.join(30)  # against hanging: without the watchdog this read never returns
        assert not t.is_alive() and got == [b""] and g.fired
    assert wd.fired == 1
    a.close()
    b.close()
    wd.stop()


def test_a_call_finished_in_time_is_not_cut() -> None:
    a, b = socket.socketpair()
    wd = Watchdog()
    with wd.guard(a.fileno(), 30) as g:
        b.sendall(b"pong")
        assert a.recv(10) == b"pong"
    assert not g.fired and wd.fired == 0
    b.sendall(b"again")  # the socket still works after the guard is left
    assert a.recv(10) == b"again"
    a.close()
    b.close()
    wd.stop()


def test_cut_all_frees_every_blocked_call() -> None:
    pairs = [socket.socketpair() for _ in range(3)]
    wd = Watchdog()
    got: list[bytes] = []
    guards = [wd.guard(a.fileno(), 3600) for a, _ in pairs]
    for g in guards:
        g.__enter__()
    threads = [_blocked_read(a, got) for a, _ in pairs]
    assert wd.cut_all() == 3
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    assert got == [b"", b"", b""]
    for g in guards:
        g.__exit__(None, None, None)
    for a, b in pairs:
        a.close()
        b.close()
    wd.stop()
