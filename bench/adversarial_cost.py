"""Cost of hostile-sized requests (issue 8, class 2): rewrite time by body size, event-loop lag
while a 30 MB request is rewritten, and session memory after 10,000 sessions.

* ``rewrite_ms_by_size`` — :func:`prefixgate.rewriter.pipeline.rewrite_request` with every pass on (the
  pruning passes too), Anthropic form, for 10 KB / 1 MB / 10 MB / 30 MB bodies: a system prompt
  of rule lines with a clock and a request id (1/5 of the body), 40 tools, and a conversation of
  tool calls whose results carry six ``<document>`` passages each. Median of 3 runs (1 for
  10 MB and 30 MB), run as the proxy runs it: bodies of 1 MB and more with the objects alive at
  the start frozen out of the garbage collector (``prefixgate/proxy/pipeline/rewrite.py``, ``GC_FREEZE``). Goal:
  linear growth, ``30m <= 45 x 1m``.
* ``loop_lag_p99_ms`` — the proxy app (:func:`prefixgate.proxy.app.build_app`, in-process ASGI, upstream
  an httpx mock) serves one 30 MB request (rewrite budget raised so it is rewritten whole) while
  small chat requests are sent back to back and a ticker sleeps 5 ms at a time on the same loop;
  lag = how late each tick wakes. p99 of the ticks from the 30 MB request's start to its answer.
  Goal <= 20 ms. The small requests' own latency p99 is in ``notes``.
* ``session_memory_mb`` — growth of the process's resident memory after 10,000 sessions, each a
  request (full pipeline, default passes) whose system prompt is a 1 MB rule block shared by all
  plus a per-session header with a clock, its memory merged into the default
  :class:`prefixgate.cache.state.session.MemorySessionStore`; measured in a fresh child process (resident memory
  after warm-up vs after the last session), so freed heap of the other phases cannot hide
  growth; the figure is the larger of that growth and the store's own byte count
  (``MemorySessionStore.bytes_used``). Goal <= 64 MB.

    .venv/bin/python bench/adversarial_cost.py [--sessions N]
Writes ``bench/results/adversarial_cost.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
import orjson  # noqa: E402

from bench.result_file import command, load_average, write_json  # noqa: E402
from prefixgate.cache.ledger.store import Ledger  # noqa: E402
from prefixgate.cache.state.session import MemorySessionStore  # noqa: E402
from prefixgate.config.loader import parse_policy  # noqa: E402
from prefixgate.config.schema import RewriteSettings  # noqa: E402
from prefixgate.proxy.app import build_app
from prefixgate.proxy.pipeline.rewrite import LARGE_BODY_BYTES
from prefixgate.rewriter.pipeline import rewrite_request, session_updates  # noqa: E402
from prefixgate.rewriter.types import Context  # noqa: E402

MODEL = "claude-sonnet-4-5"
SIZES = {"10k": 10_000, "1m": 1_000_000, "10m": 10_000_000, "30m": 30_000_000}
EVERY_PASS = {"prune_tools": True, "prune_history": True, "prune_rag": True,
              "time_budget_ms": 600_000}
LOAD_NOTE = ("ran under load: a shared machine with other jobs running; absolute milliseconds are "
             "inflated and noisy, the growth ratio and the loop lag are the figures to read")
WORDS = ("alpha beta gamma delta cache prefix token model agent tool request order flight "
         "seat refund policy the a of and to").split()


def make_body(size: int, seed: int = 0) -> dict[str, Any]:
    """An Anthropic Messages body of about ``size`` bytes of JSON (see module docstring)."""
    rnd = random.Random(seed)

    def para(n: int) -> str:
        return " ".join(rnd.choice(WORDS) for _ in range(n))
    lines = ["You are a helpful agent.", "Current time: 2026-12-01 05:29:04 UTC",
             "request id: req_8f3a2b1c9d7e6f5a4b3c"]
    chars = sum(map(len, lines))
    while chars < size // 5:
        lines.append(f"- rule {len(lines)}: " + para(12))
        chars += len(lines[-1]) + 1
    system = "\n".join(lines)
    tools = [{"name": f"tool_{i}", "description": para(20),
              "input_schema": {"type": "object", "properties": {"x": {"type": "string"}}}}
             for i in range(40)]
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Book me a flight. " + para(20)}]
    used, i = len(system) + 8_000, 0
    while used < size:
        tid = f"toolu_{i:08d}"
        docs = "\n".join(f'<document index="{k}">{para(40)}</document>' for k in range(6))
        msgs.append({"role": "assistant", "content": [
            {"type": "text", "text": para(15)},
            {"type": "tool_use", "id": tid, "name": f"tool_{i % 40}", "input": {"x": para(3)}}]})
        msgs.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tid, "content": docs}]})
        used += len(docs) + 260
        i += 1
    msgs += [{"role": "assistant", "content": "ok " + para(10)},
             {"role": "user", "content": "And now? " + para(10)}]
    return {"model": MODEL, "max_tokens": 1024, "system": system, "tools": tools,
            "messages": msgs}


def rewrite_ms_by_size() -> tuple[dict[str, float], dict[str, int]]:
    """Median pipeline milliseconds per size label, and the bodies' exact JSON sizes."""
    ctx = Context(RewriteSettings(**EVERY_PASS), model=MODEL, provider="anthropic")
    out, sizes = {}, {}
    for label, size in SIZES.items():
        body = make_body(size)
        sizes[label] = len(orjson.dumps(body))
        runs = []
        for _ in range(3 if size <= 1_000_000 else 1):
            gc.collect()
            if sizes[label] >= LARGE_BODY_BYTES:
                gc.freeze()
            t0 = time.perf_counter()
            rewrite_request(body, "anthropic", ctx)
            runs.append((time.perf_counter() - t0) * 1000)
            gc.unfreeze()
        out[label] = round(statistics.median(runs), 1)
        print(label, sizes[label], out[label], "ms", flush=True)
        del body
    return out, sizes


def _answer(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={
        "id": "msg_1", "type": "message", "role": "assistant", "model": MODEL,
        "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
        "usage": {"input_tokens": 10, "output_tokens": 1}})


def _small(i: int) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 16,
            "system": "You are brief. Current time: 2026-12-01 05:29:04 UTC\n" + "Be kind.\n" * 30,
            "messages": [{"role": "user", "content": f"hello {i}"}]}


async def _loop_lag(tmp: Path) -> dict[str, float]:
    policy = parse_policy({
        "backends": {"anth": {"kind": "anthropic", "base_url": "http://upstream.test/v1",
                              "api_key": "${PG_BENCH_KEY}"}},
        "routes": [{"match": "*", "backend": "anth"}],
        "rewrite": {**EVERY_PASS},
        "ledger": {"path": str(tmp / "ledger.sqlite")}})
    os.environ.setdefault("PG_BENCH_KEY", "bench-placeholder")
    app = build_app(policy, ledger=Ledger(policy.ledger.path),
                    transport=httpx.MockTransport(_answer))
    state = app.state.proxy
    await state.upstream.start()
    big = orjson.dumps(make_body(SIZES["30m"]))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://pg",
                               timeout=600)
    lags: list[float] = []
    small_ms: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(0.005)
            lags.append((time.perf_counter() - t0 - 0.005) * 1000)

    async def smalls() -> None:
        i = 0
        while not done.is_set():
            t0 = time.perf_counter()
            r = await client.post("/v1/messages", json=_small(i),
                                  headers={"x-prefixgate-session": f"small-{i % 50}"})
            assert r.status_code == 200, r.text
            small_ms.append((time.perf_counter() - t0) * 1000)
            i += 1
            await asyncio.sleep(0.002)

    async def large() -> tuple[int, str, float]:
        t0 = time.perf_counter()
        r = await client.post("/v1/messages", content=big,
                              headers={"content-type": "application/json"})
        done.set()
        return r.status_code, r.headers.get("x-prefixgate-edits", ""), time.perf_counter() - t0

    await client.post("/v1/messages", json=_small(-1))  # warm: imports, tokenizer, threads
    tasks = [asyncio.create_task(ticker()), asyncio.create_task(smalls())]
    status, edits, secs = await large()
    await asyncio.gather(*tasks)
    await client.aclose()
    await state.upstream.close()
    lags.sort()
    small_ms.sort()
    return {"loop_lag_p99_ms": round(lags[int(0.99 * (len(lags) - 1))], 1),
            "loop_lag_max_ms": round(lags[-1], 1), "ticks": len(lags),
            "small_requests": len(small_ms),
            "small_request_p99_ms": round(small_ms[int(0.99 * (len(small_ms) - 1))], 1),
            "large_status": status, "large_edits": edits, "large_seconds": round(secs, 1)}


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def session_memory(n: int) -> dict[str, float]:
    """RSS growth (MB) after ``n`` sessions with a 1 MB system prompt each (see docstring)."""
    rnd = random.Random(1)
    rules = "\n".join("- rule: " + " ".join(rnd.choice(WORDS) for _ in range(12))
                      for _ in range(1_000_000 // 60))
    settings = RewriteSettings()
    store = MemorySessionStore()
    base = 0.0
    t0 = time.perf_counter()
    for i in range(-1, n):  # session -1 warms up (imports, tokenizer), then the baseline
        if i == 0:
            gc.collect()
            base = _rss_mb()
        header = f"Session {i}. Current time: 2026-12-01 05:{i // 60 % 60:02d}:{i % 60:02d} UTC"
        body = {"model": MODEL, "max_tokens": 16,
                "system": [{"type": "text", "text": header}, {"type": "text", "text": rules}],
                "messages": [{"role": "user", "content": f"hello {i}"}]}
        sid = f"s{i}"
        ctx = Context(settings, model=MODEL, provider="anthropic", session_id=sid,
                      session=store.get(sid))
        store.merge(sid, session_updates(rewrite_request(body, "anthropic", ctx)))
        if i >= 0 and i % 1000 == 999:
            print("sessions", i + 1, round(time.perf_counter() - t0, 1), "s",
                  round(_rss_mb() - base, 1), "MB", file=sys.stderr, flush=True)
    gc.collect()
    rss = _rss_mb() - base
    return {"session_memory_mb": round(max(rss, store.bytes_used / 2**20), 1),
            "rss_growth_mb": round(rss, 1), "sessions_kept": len(store),
            "store_bytes_used_mb": round(store.bytes_used / 2**20, 1),
            "session_seconds": round(time.perf_counter() - t0, 1)}


def main() -> None:
    """Run the three measurements and write the JSON result."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--sessions-only", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.sessions_only is not None:  # the child process of the memory measurement
        print(json.dumps(session_memory(args.sessions_only)))
        return
    load_before = load_average()[0]
    sizes_ms, sizes = rewrite_ms_by_size()
    with tempfile.TemporaryDirectory() as tmp:
        lag = asyncio.run(_loop_lag(Path(tmp)))
    print(lag, flush=True)
    child = subprocess.run([sys.executable, __file__, "--sessions-only", str(args.sessions)],
                           stdout=subprocess.PIPE, text=True, check=True)
    mem = json.loads(child.stdout.strip().splitlines()[-1])
    print(mem, flush=True)
    load_after = load_average()[0]
    result = {
        "command": command(__file__),
        "figures": {"rewrite_ms_by_size": sizes_ms, "loop_lag_p99_ms": lag["loop_lag_p99_ms"],
                    "session_memory_mb": mem["session_memory_mb"]},
        "notes": {
            "body_bytes": sizes, "growth_30m_over_1m": round(sizes_ms["30m"] / sizes_ms["1m"], 1),
            **{k: v for k, v in lag.items() if k != "loop_lag_p99_ms"},
            **{k: v for k, v in mem.items() if k != "session_memory_mb"},
            "cpus": os.cpu_count(), "load_avg_1m_before_after": [load_before, load_after],
            "under_load": max(load_before, load_after) > 0.5 * (os.cpu_count() or 1),
        },
    }
    if result["notes"]["under_load"]:
        result["notes"]["load"] = LOAD_NOTE
    out = REPO / "bench" / "results" / "adversarial_cost.json"
    write_json(out, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
