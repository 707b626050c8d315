"""A client-side deadline for blocking database calls (issue 34, "a hung PostgreSQL").

``statement_timeout`` is enforced by the server: a server that stops answering (a hung host, a
proxy or load balancer that accepted the connection and forwards nothing, a network path that
black-holes packets while the kernel still acknowledges them) never sends the error, and a
psycopg call blocks in its socket read forever. libpq's keepalives and ``tcp_user_timeout`` end
some of these (unacknowledged data, a silent peer host) but not one where something on the path
keeps acknowledging. So the ledger also arms a :class:`Watchdog` around each call: past the
deadline the watchdog shuts the connection's socket down (``shutdown(SHUT_RDWR)`` on a duplicate
of its descriptor), the blocked read returns end-of-file at once, and psycopg raises
``OperationalError`` in the caller — the same "database unreachable" every other outage gives,
so the caller's spool-and-retry path takes over.

Why a socket shutdown and not ``conn.cancel()``: a cancel request is a new connection to the same
hung server; and closing the connection from another thread races libpq on the blocked one. The
descriptor is duplicated when the guard is armed and closed when it is left, both under the
watchdog's lock, so a deadline never cuts an unrelated socket that reused the number.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

log = logging.getLogger("prefixgate.ledger")


@dataclass
class Guard:
    """One armed deadline: ``fired`` is True once the watchdog cut its socket."""

    deadline: float
    fd: int
    fired: bool = False


class Watchdog:
    """One thread that cuts the sockets of guarded calls past their deadline (module
    docstring). ``fired``: guards cut so far. The thread starts with the first guard."""

    def __init__(self, name: str = "ledger-watchdog") -> None:
        self.name = name
        self.fired = 0
        self._cv = threading.Condition()
        self._armed: dict[int, Guard] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopped = False

    @contextlib.contextmanager
    def guard(self, fd: int, timeout_s: float) -> Iterator[Guard]:
        """Arm a deadline ``timeout_s`` seconds from now on the socket ``fd`` (a connection's
        ``fileno()``) for the ``with`` block; yields the :class:`Guard` (``fired`` says whether
        it was cut). Raises OSError when ``fd`` is not open."""
        g = Guard(time.monotonic() + timeout_s, os.dup(fd))
        key = next(self._ids)
        with self._cv:
            self._armed[key] = g
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cv.notify_all()
        try:
            yield g
        finally:
            with self._cv:
                self._armed.pop(key, None)
                os.close(g.fd)

    def cut_all(self) -> int:
        """Cut every armed socket now (a shutdown that cannot wait); return how many."""
        with self._cv:
            for g in self._armed.values():
                self._cut(g)
            return len(self._armed)

    def stop(self) -> None:
        """End the thread (guards still armed are left as they are)."""
        with self._cv:
            self._stopped = True
            self._cv.notify_all()

    def _run(self) -> None:
        with self._cv:
            while not self._stopped:
                live = [g for g in self._armed.values() if not g.fired]
                if not live:
                    self._cv.wait()
                    continue
                first = min(live, key=lambda g: g.deadline)
                wait = first.deadline - time.monotonic()
                if wait > 0:
                    self._cv.wait(wait)
                    continue
                self._cut(first)

    def _cut(self, g: Guard) -> None:
        """Shut ``g``'s socket down (under the lock: its descriptor is still the duplicate)."""
        if g.fired:
            return
        g.fired = True
        self.fired += 1
        try:
            s = socket.socket(fileno=os.dup(g.fd))
        except OSError:
            return
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            s.close()
        log.warning("ledger: a database call passed its client-side deadline; connection cut")
