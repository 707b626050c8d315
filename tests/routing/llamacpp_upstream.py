"""A scripted llama.cpp-shaped server (aiohttp, loopback) for the slot tests.

It keeps one cached prompt per slot, as llama.cpp's server does (``--parallel N``): a request
naming ``id_slot`` runs on that slot; one without it runs on the least recently used slot
(llama.cpp's fallback when no slot's prompt is similar enough). A prompt's "tokens" are the
whitespace-separated words of its messages' contents; the answer carries llama.cpp's
``timings`` — ``cache_n`` (the prompt's prefix the slot held), ``prompt_n`` (the rest),
``prompt_ms`` (1 ms a token) — and a usage without cached-token details, as llama.cpp sends.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web


class LlamaCppScript:
    """The server's state: ``slots`` cached prompts, the ``id_slot`` of every request seen."""

    def __init__(self, slots: int) -> None:
        self.cache: list[list[str]] = [[] for _ in range(slots)]
        self.used = [0] * slots
        self.clock = 0
        self.seen: list[Any] = []

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """The chat answer of ``body`` (module docstring)."""
        words = [w for m in body.get("messages", []) for w in str(m.get("content", "")).split()]
        self.seen.append(body.get("id_slot"))
        slot = body.get("id_slot")
        if not isinstance(slot, int) or not 0 <= slot < len(self.cache):
            slot = min(range(len(self.cache)), key=lambda s: self.used[s])
        held = self.cache[slot]
        n = 0
        while n < min(len(held), len(words)) and held[n] == words[n]:
            n += 1
        self.cache[slot] = words
        self.clock += 1
        self.used[slot] = self.clock
        return {"id": "chatcmpl-x", "object": "chat.completion", "model": body.get("model"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "ok"}}],
                "usage": {"prompt_tokens": len(words), "completion_tokens": 1,
                          "total_tokens": len(words) + 1},
                "timings": {"cache_n": n, "prompt_n": len(words) - n,
                            "prompt_ms": float(len(words) - n), "predicted_n": 1,
                            "predicted_ms": 1.0}}


@contextmanager
def serve_llamacpp(script: LlamaCppScript) -> Iterator[str]:
    """Serve ``script`` on a free loopback port in a thread; yields its ``/v1`` base URL."""
    async def chat(request: web.Request) -> web.Response:
        return web.json_response(script.answer(await request.json()))

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.run_until_complete(runner.cleanup())
        loop.close()
