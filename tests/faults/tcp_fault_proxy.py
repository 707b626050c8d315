"""A loopback TCP proxy a test controls, to put a database (or any TCP server) behind a fault
without touching the server itself (issue 34: "a hung PostgreSQL").

:class:`TcpFaultProxy` listens on 127.0.0.1 and forwards each connection to ``target``. Its
``mode`` is switched by the test, at any moment, for connections open and new:

- ``"pass"``: bytes flow both ways.
- ``"hang"``: connections are accepted and kept open, and nothing is forwarded either way —
  the kernel still acknowledges what the client sends, so neither TCP keepalives nor
  ``tcp_user_timeout`` notice: only a client-side deadline does. What a hung server, a
  stuck pooler or a black-holing middlebox looks like to a client.
- ``"reset"``: every connection open is reset (RST) and new ones are reset on accept.
- ``"close"``: every connection open is closed cleanly (FIN) and new ones on accept.

Bytes that arrived during ``"hang"`` are kept and delivered if the mode returns to ``"pass"``
(a stall, not a loss). Threads only (one accept thread, one per connection): the code under
test is synchronous.
"""

from __future__ import annotations

import selectors
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager

MODES = ("pass", "hang", "reset", "close")


class TcpFaultProxy:
    """The proxy (module docstring); :attr:`port` its listening port, :attr:`accepted` how many
    connections it took. Use as a context manager or call :meth:`close`."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.mode = "pass"
        self.accepted = 0
        self._lock = threading.Lock()
        self._conns: list[tuple[socket.socket, socket.socket | None]] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._stop = threading.Event()
        threading.Thread(target=self._accept, name="tcp-fault-accept", daemon=True).start()

    def set_mode(self, mode: str) -> None:
        """Switch to ``mode`` (one of :data:`MODES`); ``reset`` / ``close`` act on open
        connections at once."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        with self._lock:
            self.mode = mode
            if mode in ("reset", "close"):
                for a, b in self._conns:
                    _end(a, rst=mode == "reset")
                    if b is not None:
                        _end(b, rst=mode == "reset")
                self._conns.clear()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                mode = self.mode
            if mode in ("reset", "close"):
                _end(client, rst=mode == "reset")
                continue
            threading.Thread(target=self._pump, args=(client,), name="tcp-fault-pump",
                             daemon=True).start()

    def _pump(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            while self.mode == "hang":  # accepted, nothing forwarded, not even a connect
                if self._stop.wait(0.02):
                    return
            upstream = socket.create_connection(self.target, timeout=5)
            upstream.settimeout(None)
            with self._lock:
                self._conns.append((client, upstream))
            held = {client: b"", upstream: b""}  # bytes read, not yet forwarded
            peer = {client: upstream, upstream: client}
            sel = selectors.DefaultSelector()
            sel.register(client, selectors.EVENT_READ)
            sel.register(upstream, selectors.EVENT_READ)
            while not self._stop.is_set():
                for key, _ in sel.select(timeout=0.02):
                    src: socket.socket = key.fileobj  # type: ignore[assignment]
                    data = src.recv(65536)
                    if not data:
                        return
                    held[src] += data
                if self.mode == "pass":
                    for src, data in held.items():
                        if data:
                            peer[src].sendall(data)
                            held[src] = b""
        except OSError:
            return
        finally:
            for s in (client, upstream):
                if s is not None:
                    try:
                        s.close()
                    except OSError:
                        pass

    def close(self) -> None:
        """Stop accepting and end every connection."""
        self._stop.set()
        self._listener.close()
        self.set_mode("close")

    def __enter__(self) -> TcpFaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _end(s: socket.socket, *, rst: bool) -> None:
    try:
        if rst:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            s.shutdown(socket.SHUT_RDWR)
        s.close()
    except OSError:
        pass


@contextmanager
def fault_proxy(host: str, port: int) -> Iterator[TcpFaultProxy]:
    """A :class:`TcpFaultProxy` to ``host:port`` for the ``with`` block."""
    proxy = TcpFaultProxy((host, port))
    try:
        yield proxy
    finally:
        proxy.close()
