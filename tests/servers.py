"""Run an ASGI app under a real uvicorn server in a background thread, for tests.

Usage::

    with serve_app(app) as base_url:      # e.g. "http://127.0.0.1:54321"
        httpx.get(base_url + "/health")

The socket is bound before the server starts (port 0 → a free port chosen by the OS), so
there is no race between picking a port and listening on it. Leaving the block asks uvicorn
to exit and joins the thread; the app's lifespan runs on enter/exit like in production.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

__all__ = ["serve_app"]


@contextlib.contextmanager
def serve_app(app: Any, host: str = "127.0.0.1", startup_timeout_s: float = 30.0,
              **options: Any) -> Iterator[str]:
    """Serve ``app`` (any ASGI callable) on a free local port; yield its base URL.
    ``options``: more ``uvicorn.Config`` arguments (e.g. :func:`prefixgate.proxy.http.server.uvicorn_options`).

    Errors: RuntimeError when uvicorn has not started within ``startup_timeout_s`` seconds
    or its thread died during startup.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="auto", timeout_graceful_shutdown=2,
                            **options)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
