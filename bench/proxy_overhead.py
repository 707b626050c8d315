"""What the proxy adds to TTFT and inter-token gaps on loopback (case B10).

    .venv/bin/python bench/proxy_overhead.py [--requests 40] [--tokens 16] [--gap-ms 25]
        [--out bench/results/proxy_overhead.json]

A mock upstream streams ``--tokens`` Chat Completions chunks, one every ``--gap-ms`` ms, after a
fixed 20 ms "prefill". The same streamed request is timed at the client directly against the
upstream and through the proxy (rewriting on, real pipeline, ledger on disk). Output:
``{"command", "figures": {"direct": {...}, "proxy": {...}, "ttft_overhead_p50_ms",
"ttft_overhead_p95_ms", "gap_p50_ms_proxy", "same_ms_share_proxy"}}`` (ms).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import socket
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from config.loader import parse_policy
from proxy.app import build_app
from proxy.stats import percentile


def upstream_app(tokens: int, gap_s: float) -> Starlette:
    """Mock OpenAI-compatible upstream streaming ``tokens`` chunks ``gap_s`` apart."""

    async def chat(request: Request) -> StreamingResponse:
        await request.body()

        async def gen() -> AsyncIterator[bytes]:
            await asyncio.sleep(0.02)
            for i in range(tokens):
                if i:
                    await asyncio.sleep(gap_s)
                obj = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
                       "choices": [{"index": 0, "delta": {"content": f" t{i}"},
                                    "finish_reason": None}]}
                yield b"data: " + json.dumps(obj).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread on a free port; yield its URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        t.join(5)


def timed(client: httpx.Client, url: str) -> tuple[float, list[float]]:
    """(TTFT ms, arrival times in s of each content event) of one streamed request."""
    body = {"model": "m", "stream": True, "max_tokens": 64,
            "messages": [{"role": "user", "content": "Explain recursion"}]}
    t0 = time.perf_counter()
    arrivals: list[float] = []
    buf = b""
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        for piece in r.iter_raw():
            buf += piece
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                if b'" t' in ev:
                    arrivals.append(time.perf_counter())
    return (arrivals[0] - t0) * 1e3, arrivals


def main() -> None:
    """Run the benchmark (see module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--gap-ms", type=float, default=25.0)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "proxy_overhead.json"))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pg-overhead-"))
    figures: dict[str, Any] = {}
    with serve(upstream_app(args.tokens, args.gap_ms / 1e3)) as up:
        policy = parse_policy({"backends": {"up": {"kind": "openai_compat",
                                                   "base_url": up + "/v1"}},
                               "routes": [{"match": "*", "backend": "up"}],
                               "ledger": {"path": str(tmp / "ledger.sqlite")}})
        with serve(build_app(policy)) as proxy, httpx.Client(timeout=30) as client:
            for name, url in (("direct", up), ("proxy", proxy)):
                timed(client, url)  # warm-up
                ttfts, gaps = [], []
                for _ in range(args.requests):
                    ttft, arr = timed(client, url)
                    ttfts.append(ttft)
                    gaps += [(b - a) * 1e3 for a, b in itertools.pairwise(arr)]
                figures[name] = {"ttft_p50_ms": percentile(ttfts, 50),
                                 "ttft_p95_ms": percentile(ttfts, 95),
                                 "gap_p50_ms": percentile(gaps, 50),
                                 "same_ms_share": sum(g < 1 for g in gaps) / len(gaps),
                                 "ttfts": ttfts}
    d, p = figures["direct"], figures["proxy"]
    figures["ttft_overhead_p50_ms"] = p["ttft_p50_ms"] - d["ttft_p50_ms"]
    figures["ttft_overhead_p95_ms"] = p["ttft_p95_ms"] - d["ttft_p95_ms"]
    for f in (d, p):
        f.pop("ttfts")
    doc = {"command": "python bench/proxy_overhead.py " + " ".join(sys.argv[1:]),
           "figures": figures}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
