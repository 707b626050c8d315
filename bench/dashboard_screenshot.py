"""Screenshot of ``/dashboard`` after real traffic: ``bench/results/dashboard.png`` (issue 9).

Three sources, one page:

    # default: tau-bench traffic through a proxy (real rewrite pipeline, ledger on disk) in front
    # of a scripted OpenAI upstream whose prefix cache is cache.provider_models' OpenAI model and
    # whose TTFT grows with uncached tokens; then the screenshot
    .venv/bin/python bench/dashboard_screenshot.py [--runs 8] [--range 1h]

    # a ledger someone else filled (e.g. after `prefixgate replay` on the tau-bench trace):
    # a proxy is started over it (no traffic sent) and its dashboard shot
    .venv/bin/python bench/dashboard_screenshot.py --ledger ~/.prefixgate/ledger.sqlite

    # a proxy already running (its key, if any, from PREFIXGATE_DASHBOARD_KEY: sent as
    # HTTP Basic, never on the command line or in a URL)
    .venv/bin/python bench/dashboard_screenshot.py --proxy-url http://127.0.0.1:8080

Writes ``--out`` (PNG, default ``bench/results/dashboard.png``) and ``--json`` (default
``bench/results/dashboard.json``): ``{"command", "figures": {"requests", "cached_share",
"saved_usd", "charts_drawn", "page_numbers_match_api", "console_errors", "page_bytes"},
"setup": {...}}``. Fails (exit 1) when the page shows a console error, a number differing from
``/api/savings``, or a chart with nothing drawn. Needs Chromium (``make chromium``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.result_file import command, write_json
from prefixgate.cache.ledger.store import Ledger
from prefixgate.cache.provider_models import make_model
from prefixgate.cache.provider_models.prefix_blocks import memo_counter
from prefixgate.config.loader import parse_policy
from prefixgate.config.schema import Policy
from prefixgate.proxy.app import build_app
from prefixgate.proxy.observe import dashboard
from prefixgate.proxy.sim.traces import load_tau, openai_body
from prefixgate.rewriter.analysis.tokens import count_tokens
from tests.browser import Chromium
from tests.dashboard.page_check import canvas_report, number_mismatches, shown_numbers
from tests.paths import DATA
from tests.servers import serve_app

TRACE = DATA / "traces" / "tau_bench_airline_gpt4o.json"
MODEL = "gpt-4o"
READY = ("document.readyState === 'complete' && ['ready', 'failed'].includes(document.body.dataset.state)"
         " && document.body.dataset.state")


class CachingUpstream:
    """An OpenAI Chat Completions upstream: cached tokens from the OpenAI prefix-cache model
    over the body it receives, TTFT = 15 ms + 0.01 ms per uncached token, then ``out`` chunks
    5 ms apart and a usage chunk."""

    def __init__(self) -> None:
        self.count = memo_counter(count_tokens)
        self.model = make_model("openai", self.count)
        self.t0 = time.monotonic()

    def app(self) -> Starlette:
        async def chat(request: Request) -> Response:
            body = json.loads(await request.body())
            outcome = self.model.process(body, time.monotonic() - self.t0)
            usage = {"prompt_tokens": outcome.input_tokens, "completion_tokens": 6,
                     "total_tokens": outcome.input_tokens + 6,
                     "prompt_tokens_details": {"cached_tokens": outcome.cached_read_tokens}}
            ttft_s = 0.015 + outcome.uncached_tokens * 1e-5
            if not body.get("stream"):
                await asyncio.sleep(ttft_s)
                return JSONResponse({"id": "c1", "object": "chat.completion", "created": 1, "model": MODEL,
                                     "choices": [{"index": 0, "finish_reason": "stop", "message": {
                                         "role": "assistant", "content": "ok"}}], "usage": usage})
            return StreamingResponse(_sse(ttft_s, usage), media_type="text/event-stream")

        return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


async def _sse(ttft_s: float, usage: dict[str, Any]) -> AsyncIterator[bytes]:
    def event(obj: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
    await asyncio.sleep(ttft_s)
    for i in range(6):
        if i:
            await asyncio.sleep(0.005)
        yield event({**base, "choices": [{"index": 0, "delta": {"content": "tok "},
                                          "finish_reason": "stop" if i == 5 else None}]})
    yield event({**base, "choices": [], "usage": usage})
    yield b"data: [DONE]\n\n"


def bench_policy(upstream_url: str, ledger_path: Path) -> Policy:
    """The proxy's policy: every model to the scripted OpenAI upstream; holdout of a quarter of
    the sessions and SLOs when this checkout's policy schema has them."""
    data: dict[str, Any] = {
        "backends": {"openai": {"kind": "openai", "base_url": upstream_url + "/v1",
                                "api_key": "${PG_BENCH_UPSTREAM_KEY}"}},
        "routes": [{"match": "*", "backend": "openai"}],
        "ledger": {"path": str(ledger_path)},
    }
    fields = Policy.model_fields
    if "holdout" in fields:
        data["holdout"] = {"fraction": 0.25, "seed": 3}
    if "slo" in fields:
        data["slo"] = {"default": {"ttft_ms": 60, "tpot_ms": 8}}
    return parse_policy(data)


def drive_tau(proxy_url: str, runs: int) -> int:
    """Send the first ``runs`` tau-bench runs through the proxy, in order, alternating streamed
    and non-streamed requests; the number of requests sent."""
    sent = 0
    with httpx.Client(base_url=proxy_url, timeout=60, trust_env=False) as client:
        for run in load_tau(TRACE, runs=runs):
            for k, req in enumerate(run.requests):
                body = openai_body(MODEL, run.tools, req.messages)
                body["max_tokens"] = 16
                if k % 2:
                    body["stream"] = True
                    body["stream_options"] = {"include_usage": True}
                r = client.post("/v1/chat/completions", json=body,
                                headers={"x-prefixgate-session": run.run_id})
                r.raise_for_status()
                sent += 1
    return sent


@contextmanager
def proxy_over(ledger_path: Path, upstream_url: str = "http://127.0.0.1:9") -> Iterator[str]:
    """A proxy (real pipeline) over ``ledger_path``; its base URL."""
    os.environ.setdefault("PG_BENCH_UPSTREAM_KEY", "sk-bench-not-a-key")
    policy = bench_policy(upstream_url, ledger_path)
    with serve_app(build_app(policy, ledger=Ledger(ledger_path))) as url:
        yield url


def shoot(url: str, rng: str, out: Path) -> dict[str, Any]:
    """Load ``url``/dashboard#``rng`` in headless Chromium, check it, write the PNG; figures."""
    key = os.environ.get("PREFIXGATE_DASHBOARD_KEY", "")
    headers = {"authorization": "Basic " + base64.b64encode(f"bench:{key}".encode()).decode()} if key else {}
    with Chromium.launch() as browser:
        page = browser.page
        page.navigate(f"{url}/dashboard#{rng}", headers=headers)
        state = page.wait_for(READY, timeout_s=60)
        if state != "ready":
            raise SystemExit(f"dashboard did not load: {page.evaluate('window.dash.error')}")
        payload = page.evaluate("window.dash.payload")
        mismatches = number_mismatches(payload, shown_numbers(page))
        charts = canvas_report(page)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(page.screenshot())
        errors = list(page.errors)
    t = payload["totals"]
    return {"requests": t["requests"], "cached_share": t["cached_share"],
            "cf_cached_share": t["cf_cached_share"], "saved_usd": t["saved_usd"],
            "saved_pct": t["saved_pct"], "holdout_verdict": payload["holdout"]["verdict"],
            "charts_drawn": sorted(c["id"] for c in charts if c["series"] > 15),
            "charts_blank": sorted(c["id"] for c in charts if c["series"] <= 15),
            "page_numbers_match_api": not mismatches, "mismatches": mismatches[:10],
            "console_errors": errors, "page_bytes": dashboard.page_bytes()}


def _commit() -> str:
    """This checkout's commit (``+dirty`` with uncommitted changes), or "" outside git."""
    try:
        sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return sha + ("+dirty" if dirty else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--proxy-url", help="a running proxy (key from PREFIXGATE_DASHBOARD_KEY)")
    src.add_argument("--ledger", type=Path, help="a ledger file to serve (no traffic sent)")
    ap.add_argument("--runs", type=int, default=8, help="tau-bench runs to send (default mode)")
    ap.add_argument("--range", default="1h", choices=["1h", "24h", "7d"])
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "dashboard.png")
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "dashboard.json")
    a = ap.parse_args()
    setup: dict[str, Any] = {"range": a.range, "commit": _commit()}
    if a.proxy_url:
        setup["source"] = "proxy_url"
        figures = shoot(a.proxy_url.rstrip("/"), a.range, a.out)
    elif a.ledger:
        setup["source"] = "ledger"
        with proxy_over(a.ledger.expanduser()) as url:
            figures = shoot(url, a.range, a.out)
    else:
        setup.update(source="tau_bench_scripted_upstream", runs=a.runs, model=MODEL, trace=TRACE.name,
                     upstream="OpenAI prefix-cache model (cache.provider_models), TTFT 15 ms + 0.01 ms/uncached token")
        up = CachingUpstream()
        with tempfile.TemporaryDirectory() as tmp, serve_app(up.app()) as up_url, \
                proxy_over(Path(tmp) / "ledger.sqlite", up_url) as url:
            setup["requests_sent"] = drive_tau(url, a.runs)
            time.sleep(0.5)  # the last streamed row is written just after its last byte
            figures = shoot(url, a.range, a.out)
    write_json(a.json, {"command": command(__file__), "figures": figures, "setup": setup})
    print(json.dumps(figures, indent=2))
    bad = figures["console_errors"] or not figures["page_numbers_match_api"] or figures["charts_blank"]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
