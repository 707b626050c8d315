"""Which async HTTP client should carry the proxy's upstream requests (issue 10, item 7)?

    python bench/upstream_clients.py [--requests 3000] [--concurrency 32] [--rounds 2]
        [--out bench/results/upstream_clients.json]

Each candidate POSTs the same 1 KB Chat Completions body ``--requests`` times, ``--concurrency``
at once, to one fake upstream (``bench/fake_upstream.py``, its own process) and reads each answer
whole (the non-streamed path; the streamed one differs only in how the body is read). Candidates:
``httpx`` (default pool limits), ``httpx_big_pool`` (max_connections 512, keep-alive 64 — the
proxy's current settings), ``httpx_aiohttp`` (httpx API over the ``httpx-aiohttp`` transport),
``aiohttp`` (a ``ClientSession`` with a 512-connection ``TCPConnector``). Rounds alternate the
order; the best round of each counts (a shared machine only ever adds noise).
Output: ``{"command", "figures": {"<candidate>": {"rps", "p50_ms", "p99_ms"}}, "setup"}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.result_file import command, write_json  # noqa: E402
from prefixgate.cache.savings.report import percentile  # noqa: E402

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 900}]}).encode()
HEADERS = {"content-type": "application/json"}

Send = Callable[[], Awaitable[bytes]]


def start_upstream() -> tuple[subprocess.Popen[str], str]:
    """The fake upstream in its own process; (process, base URL)."""
    proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "fake_upstream.py")],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port = proc.stdout.readline().split()[1]
    return proc, f"http://127.0.0.1:{port}"


async def drive(send: Send, requests: int, concurrency: int) -> dict[str, float]:
    """``requests`` sends, ``concurrency`` at once: throughput and latency."""
    lat: list[float] = []
    todo = iter(range(requests))

    async def worker() -> None:
        for _ in todo:
            t = time.perf_counter()
            await send()
            lat.append((time.perf_counter() - t) * 1e3)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"rps": requests / wall, "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99)}


async def candidate(name: str, url: str, requests: int, concurrency: int) -> dict[str, float]:
    """Run one candidate client."""
    target = url + "/v1/chat/completions"
    if name == "aiohttp":
        import aiohttp

        conn = aiohttp.TCPConnector(limit=512, limit_per_host=0, ttl_dns_cache=None)
        async with aiohttp.ClientSession(connector=conn, auto_decompress=False) as s:
            async def send_aio() -> bytes:
                async with s.post(target, data=BODY, headers=HEADERS) as r:
                    return await r.read()
            await drive(send_aio, 100, concurrency)  # warm the pool
            return await drive(send_aio, requests, concurrency)
    import httpx

    kwargs: dict[str, Any] = {}
    if name == "httpx_big_pool":
        kwargs["limits"] = httpx.Limits(max_connections=512, max_keepalive_connections=64)
    if name == "httpx_aiohttp":
        from httpx_aiohttp import AiohttpTransport

        kwargs["transport"] = AiohttpTransport()
    async with httpx.AsyncClient(**kwargs) as c:
        async def send_httpx() -> bytes:
            r = await c.post(target, content=BODY, headers=HEADERS)
            return r.content
        await drive(send_httpx, 100, concurrency)
        return await drive(send_httpx, requests, concurrency)


def main() -> None:
    """Run every candidate ``--rounds`` times; write the best round of each."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "upstream_clients.json"))
    args = ap.parse_args()
    names = ["httpx", "httpx_big_pool", "httpx_aiohttp", "aiohttp"]
    proc, url = start_upstream()
    best: dict[str, dict[str, float]] = {}
    try:
        for rnd in range(args.rounds):
            for name in (names if rnd % 2 == 0 else names[::-1]):
                got = asyncio.run(candidate(name, url, args.requests, args.concurrency))
                print(name, {k: round(v, 2) for k, v in got.items()}, flush=True)
                if name not in best or got["rps"] > best[name]["rps"]:
                    best[name] = got
    finally:
        proc.terminate()
        proc.wait()
    doc = {"command": command(__file__),
           "figures": {k: {m: round(v, 2) for m, v in best[k].items()} for k in names},
           "setup": {"requests": args.requests, "concurrency": args.concurrency,
                     "rounds": args.rounds, "body_bytes": len(BODY),
                     "note": "one process, asyncio default loop; fake upstream in its own "
                             "process; shared 2-core machine, best round of each"}}
    write_json(args.out, doc)
    print(json.dumps(doc["figures"], indent=2))


if __name__ == "__main__":
    main()
