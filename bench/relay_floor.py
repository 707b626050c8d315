"""The floor under ``added_p50_ms``: the least a Python relay on prefixgate's stack adds (issue 25).

    python bench/relay_floor.py --upstream http://127.0.0.1:PORT [--port 0]

Prints ``PORT <n>`` once listening. The same server stack as ``prefixgate serve`` — uvicorn
with uvloop and the httptools parser, one worker — and the same upstream client (one pooled
``aiohttp.ClientSession``), with nothing between them: a raw ASGI app that reads the body and
POSTs it, with the client's ``content-type``, to ``<upstream>/v1/chat/completions``, then
answers with the upstream's status, ``content-type`` and body. No framework, no parsing of the
body, no routing, rewriting, ledger, metrics or analysis.

``bench/proxy_overhead.py`` times it next to prefixgate (``floor_small`` / ``floor_agent``):
what a proxy on this stack cannot go below on this machine, so the part of prefixgate's
``added_p50_ms`` that is its own work is the difference.
"""

from __future__ import annotations

import argparse
import socket
from typing import Any

import aiohttp
import uvicorn

Scope = dict[str, Any]


class Relay:
    """The raw ASGI relay (module docstring); ``upstream``: the base URL."""

    def __init__(self, upstream: str) -> None:
        self.url = upstream.rstrip("/") + "/v1/chat/completions"
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    self.session = aiohttp.ClientSession(
                        connector=aiohttp.TCPConnector(limit=512))
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    if self.session is not None:
                        await self.session.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        parts = []
        more = True
        while more:
            msg = await receive()
            parts.append(msg.get("body", b""))
            more = msg.get("more_body", False)
        ctype = dict(scope["headers"]).get(b"content-type", b"application/json").decode()
        assert self.session is not None
        async with self.session.post(self.url, data=b"".join(parts),
                                     headers={"content-type": ctype}) as resp:
            body = await resp.read()
            headers = [(b"content-type", resp.headers.get("content-type", "").encode())]
            await send({"type": "http.response.start", "status": resp.status,
                        "headers": headers})
            await send({"type": "http.response.body", "body": body})


def main() -> None:
    """Serve the relay on loopback (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(Relay(args.upstream), loop="uvloop", http="httptools",
                            log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])  # sets up uvloop as prefixgate serve does


if __name__ == "__main__":
    main()
