"""What the proxy adds to TTFT and inter-token gaps on loopback (case B10).

    .venv/bin/python bench/proxy_overhead.py [--requests 40] [--tokens 16] [--gap-ms 25]
        [--bodies tau|tiny] [--out bench/results/proxy_overhead.json]

A mock upstream streams ``--tokens`` Chat Completions chunks, one every ``--gap-ms`` ms, after a
fixed 20 ms "prefill". Request bodies are real agent requests (``--bodies tau``, default: the
tau-bench airline requests, tools and growing history, in trace order, each run one session) or
the old 3-word message (``tiny``). Like with like (issue 14): request *i* sends the SAME body
directly to the upstream and through the proxy (rewriting on, real pipeline, ledger on disk),
the two runs interleaved and their order alternating with *i*, after one warm-up request on each
side. Output: ``{"command", "figures": {"direct": {...}, "proxy": {...}, "ttft_overhead_p50_ms",
"ttft_overhead_p95_ms", "paired_overhead_p50_ms"}, "setup": {...}}`` (ms).
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
from proxy.sim_trace import load_tau, openai_body
from proxy.stats import percentile

TRACE = REPO.parent / "shared" / "data" / "traces" / "tau_bench_airline_gpt4o.json"
TINY = {"model": "m", "messages": [{"role": "user", "content": "Explain recursion"}]}


def bodies(kind: str, n: int) -> list[dict[str, Any]]:
    """``n`` request bodies: tau-bench requests in trace order (``tau``) or the 3-word one."""
    if kind == "tiny":
        return [TINY] * n
    out: list[dict[str, Any]] = []
    for run in load_tau(TRACE):
        out += [openai_body("gpt-4o", run.tools, r.messages) for r in run.requests]
        if len(out) >= n:
            break
    return out[:n]


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


def timed(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, list[float]]:
    """(TTFT ms, arrival times in s of each content event) of one streamed request."""
    body = {**body, "stream": True, "max_tokens": 64}
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
    ap.add_argument("--bodies", choices=["tau", "tiny"], default="tau")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "proxy_overhead.json"))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pg-overhead-"))
    work = bodies(args.bodies, args.requests)
    samples: dict[str, dict[str, list[float]]] = {k: {"ttft": [], "gaps": []}
                                                   for k in ("direct", "proxy")}
    t0 = time.perf_counter()
    with serve(upstream_app(args.tokens, args.gap_ms / 1e3)) as up:
        policy = parse_policy({"backends": {"up": {"kind": "openai_compat",
                                                   "base_url": up + "/v1"}},
                               "routes": [{"match": "*", "backend": "up"}],
                               "ledger": {"path": str(tmp / "ledger.sqlite")}})
        with serve(build_app(policy)) as proxy, httpx.Client(timeout=30) as client:
            urls = {"direct": up, "proxy": proxy}
            for url in urls.values():
                timed(client, url, work[0])  # warm-up, the same on both sides
            for i, body in enumerate(work):
                for name in (("direct", "proxy") if i % 2 == 0 else ("proxy", "direct")):
                    ttft, arr = timed(client, urls[name], body)
                    samples[name]["ttft"].append(ttft)
                    samples[name]["gaps"] += [(b - a) * 1e3 for a, b in itertools.pairwise(arr)]
    figures: dict[str, Any] = {}
    for name, got in samples.items():
        gaps = got["gaps"]
        figures[name] = {"ttft_p50_ms": percentile(got["ttft"], 50),
                         "ttft_p95_ms": percentile(got["ttft"], 95),
                         "gap_p50_ms": percentile(gaps, 50),
                         "same_ms_share": sum(g < 1 for g in gaps) / len(gaps) if gaps else None}
    d, p = figures["direct"], figures["proxy"]
    figures["ttft_overhead_p50_ms"] = p["ttft_p50_ms"] - d["ttft_p50_ms"]
    figures["ttft_overhead_p95_ms"] = p["ttft_p95_ms"] - d["ttft_p95_ms"]
    paired = [b - a for a, b in zip(samples["direct"]["ttft"], samples["proxy"]["ttft"])]
    figures["paired_overhead_p50_ms"] = percentile(paired, 50)
    body_bytes = sorted(len(json.dumps(b)) for b in work)
    doc = {"command": "python bench/proxy_overhead.py " + " ".join(sys.argv[1:]),
           "figures": figures,
           "setup": {"bodies": args.bodies, "requests": len(work), "tokens": args.tokens,
                     "gap_ms": args.gap_ms, "interleaved": True,
                     "order": "alternating per request", "warmup": "1 request per side",
                     "body_bytes_p50": body_bytes[len(body_bytes) // 2],
                     "body_bytes_max": body_bytes[-1], "wall_s": round(time.perf_counter() - t0, 1),
                     "note": "shared 2-core CPU box; loopback; mock upstream (20 ms prefill)"}}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc["figures"], indent=2))


if __name__ == "__main__":
    main()
