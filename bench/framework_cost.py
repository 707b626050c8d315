"""What FastAPI's routing and middleware cost per request, and what the lean path saves (issue 25).

    python bench/framework_cost.py [--requests 3000] [--rounds 3]
        [--out bench/results/framework_cost.json]

In process, no sockets: the proxy app of :func:`prefixgate.proxy.app.build_app` gets one extra
``POST`` route whose handler returns a canned 200 at once, placed first in the route list (as
the chat routes are), and the ASGI app is called with a prepared scope ``--requests`` times:

- ``full_stack_us``: the route served the way every route was before issue 25 — server-error,
  telemetry and body-limit middleware, the path rewriting, exception middleware, exit stacks,
  the router, FastAPI's request handler;
- ``lean_us``: the same handler behind :class:`prefixgate.proxy.http.lean.LeanRoutes` (what the
  chat routes now take): the outer middleware still runs, the router and FastAPI's handler do
  not;
- ``handler_us``: the handler and its response called directly (the floor).

Rounds are interleaved (full, lean, direct, full, ...); each figure is the median over the
rounds with its min / max. Microseconds per request on the machine as it is (shared cores:
absolute values move with the load, the ratio much less).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from starlette.middleware import Middleware  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import Response  # noqa: E402

from bench.result_file import command, write_json  # noqa: E402
from prefixgate.config.schema import Policy  # noqa: E402
from prefixgate.proxy.app import build_app  # noqa: E402
from prefixgate.proxy.http.lean import LeanRoutes  # noqa: E402


async def handler(request: Request) -> Response:
    """The canned answer."""
    return Response(b'{"ok":1}', media_type="application/json")


def scope(path: str) -> dict[str, Any]:
    """An HTTP POST scope for ``path`` as uvicorn makes it."""
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "1.1", "method": "POST", "scheme": "http", "path": path,
            "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")],
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2), "state": {}}


async def measure(n: int, rounds: int) -> dict[str, list[float]]:
    """Per-request microseconds of each way, one value per round."""
    tmp = tempfile.mkdtemp(prefix="pg-fw-")
    policy = Policy.model_validate({
        "backends": {"up": {"kind": "openai_compat", "base_url": "http://127.0.0.1:9/v1"}},
        "routes": [{"match": "*", "backend": "up"}], "ledger": {"path": tmp + "/l.sqlite"}})
    app = build_app(policy, analyze=False)
    for path in ("/v1/bench_full", "/v1/bench_lean"):
        app.add_api_route(path, handler, methods=["POST"])
        app.router.routes.insert(0, app.router.routes.pop())
    app.user_middleware.append(Middleware(LeanRoutes, fastapi_app=app,  # innermost
                                          paths=("/v1/bench_lean",)))

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    statuses: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def direct(sc: dict[str, Any], rc: Any, sd: Any) -> None:
        response = await handler(Request(sc, rc, sd))
        await response(sc, rc, sd)

    ways = {"full_stack_us": (app, "/v1/bench_full"), "lean_us": (app, "/v1/bench_lean"),
            "handler_us": (direct, "/v1/bench_full")}
    out: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(rounds):
        for name, (asgi, path) in ways.items():
            for _ in range(200):  # warm
                await asgi(scope(path), receive, send)
            t0 = time.perf_counter()
            for _ in range(n):
                await asgi(scope(path), receive, send)
            out[name].append((time.perf_counter() - t0) / n * 1e6)
    if set(statuses) != {200}:
        raise RuntimeError(f"a request did not answer 200: {sorted(set(statuses))}")
    return out


def main() -> None:
    """Run and write the JSON (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "framework_cost.json"))
    args = ap.parse_args()
    got = asyncio.run(measure(args.requests, args.rounds))
    fig = {k: {"median": round(sorted(v)[len(v) // 2], 1), "min": round(min(v), 1),
               "max": round(max(v), 1)} for k, v in got.items()}
    doc = {"command": command(__file__, prefix="nice -n 5 python"),
           "figures": fig,
           "saved_per_request_us": round(fig["full_stack_us"]["median"]
                                         - fig["lean_us"]["median"], 1),
           "setup": {"requests": args.requests, "rounds": args.rounds,
                     "machine": f"{os.cpu_count()} CPUs shared with other jobs; in process"}}
    write_json(args.out, doc)
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
