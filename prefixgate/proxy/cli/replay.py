"""``prefixgate replay TRACE``: send a recorded agent trace through the proxy, rewriting off then
on, and compare cached-token share, TTFT and TPOT.

Each run's requests (a tau-bench JSON or a SWE-agent ``.traj``, read by
:func:`prefixgate.proxy.sim.traces.load_trace` as ``simulate`` reads them) are sent in order,
streamed, with a small ``max_tokens`` and ``temperature: 0``; first the whole run with
``x-prefixgate-rewrite: off``, then the same run with rewriting on. Timings are measured here, at
the client: TTFT = until the first content chunk arrived, TPOT = (last content chunk - first) /
(completion tokens - 1). Prompt and cached tokens come from the stream's usage chunk
(``include_usage``).

Fairness: the two sides must not warm each other's prefix cache. Each (side, run) pair gets its
own session id and its own ``cache_salt`` (an engine extension our engine and vLLM honour: prefix
cache entries are only shared between requests with the same salt), so the first request of
every side is cold and every later hit comes from that side's own earlier requests. Turn the salt
off (``--no-cache-salt``) for backends that reject unknown fields; then the "off" side runs first
and, with ``--volatile-clock``, its prefix diverges from the "on" side's a few tokens into the
system prompt, so it still cannot warm it.

Requests longer than the model's context are answered 400 by the backend; they are counted as
``skipped``, never dropped silently. ``--json-out FILE`` writes
``{"command": ..., "figures": {"off": {...}, "on": {...}}}``.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from prefixgate.cache.savings.report import percentile
from prefixgate.proxy.cli.format import fmt
from prefixgate.proxy.core.sse import EventSplitter, parse_event
from prefixgate.proxy.sim.traces import TraceError, load_trace, openai_body
from prefixgate.proxy.sim.wall_clock import with_wall_clock


@dataclass
class Sent:
    """One replayed request: ``status`` ok | skipped | error; tokens; client-side ms."""

    side: str
    run: int
    k: int
    status: str
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    engine_ttft_ms: float | None = None
    error: str = ""


def _is_context_error(status: int, text: str) -> bool:
    low = text.lower()
    return status == 400 and ("context length" in low or "context_length" in low
                              or "maximum context" in low or "too long" in low)


def send_streaming(client: httpx.Client, url: str, body: dict[str, Any],
                   headers: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """POST a streamed chat request; return (status, figures) with ``ttft_ms``, ``tpot_ms``,
    ``prompt_tokens``, ``cached_tokens``, ``output_tokens``, ``engine_ttft_ms`` (the backend's
    own ``X-Engine-TTFT-Ms`` when it sends one) (or ``error``)."""
    t0 = time.perf_counter()
    first = last = None
    deltas = 0
    usage: dict[str, Any] = {}
    with client.stream("POST", url, json=body, headers=headers) as r:
        if r.status_code != 200:
            text = r.read().decode(errors="replace")
            return ("skipped" if _is_context_error(r.status_code, text) else "error",
                    {"error": f"{r.status_code}: {text[:200]}"})
        engine_ttft = r.headers.get("x-engine-ttft-ms")
        splitter = EventSplitter()
        for piece in r.iter_raw():
            for raw in splitter.feed(piece):
                ev = parse_event(raw)
                if not ev.data or ev.data.strip() == "[DONE]":
                    continue
                chunk = json.loads(ev.data)
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for ch in chunk.get("choices") or []:
                    d = ch.get("delta") or {}
                    if d.get("content") or d.get("tool_calls") or d.get("reasoning_content"):
                        now = time.perf_counter()
                        first = first or now
                        last = now
                        deltas += 1
    out_tokens = usage.get("completion_tokens", deltas)
    figures = {
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
        "output_tokens": out_tokens,
        "ttft_ms": None if first is None else (first - t0) * 1e3,
        "tpot_ms": None if first is None or last is None or out_tokens < 2
        else (last - first) * 1e3 / (out_tokens - 1),
        "engine_ttft_ms": float(engine_ttft) if engine_ttft else None,
    }
    return "ok", figures


def side_figures(results: list[Sent]) -> dict[str, Any]:
    """``{"requests", "skipped", "errors", "prompt_tokens", "cached_share" (0-1),
    "ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "engine_ttft_p50_ms"}`` of one side (client-side
    timings; the last one is the backend's own TTFT when it reports it)."""
    ok = [r for r in results if r.status == "ok"]
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    cached = sum(r.cached_tokens or 0 for r in ok)
    ttft = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    tpot = [r.tpot_ms for r in ok if r.tpot_ms is not None]
    eng = [r.engine_ttft_ms for r in ok if r.engine_ttft_ms is not None]
    return {"requests": len(ok), "skipped": sum(r.status == "skipped" for r in results),
            "errors": sum(r.status == "error" for r in results), "prompt_tokens": prompt,
            "cached_share": cached / prompt if prompt else None,
            "ttft_p50_ms": percentile(ttft, 50), "ttft_p95_ms": percentile(ttft, 95),
            "tpot_p50_ms": percentile(tpot, 50), "engine_ttft_p50_ms": percentile(eng, 50)}


def probe_proxy(proxy: str) -> None:
    """Exit 2 with one line when nothing answers ``GET /healthz`` at ``proxy``."""
    try:
        httpx.get(proxy.rstrip("/") + "/healthz", timeout=5.0)
    except httpx.HTTPError as e:
        typer.echo(f"replay: no answer from {proxy} ({type(e).__name__}): is the proxy running "
                   f"at {proxy}? Start it with `prefixgate serve`.", err=True)
        raise typer.Exit(2) from None


def replay(
    trace: Path = typer.Argument(..., help="tau-bench JSON or SWE-agent .traj (as simulate)"),
    proxy: str = typer.Option("http://127.0.0.1:8080", "--proxy", help="proxy base URL"),
    runs: int = typer.Option(1, "--runs", help="number of runs to replay"),
    first_run: int = typer.Option(0, "--first-run", help="index of the first run"),
    max_requests: int | None = typer.Option(None, "--max-requests", help="per run"),
    volatile_clock: bool = typer.Option(False, "--volatile-clock",
                                        help="system-prompt clock = wall clock of each request"),
    max_tokens: int = typer.Option(8, "--max-tokens"),
    model: str = typer.Option("smollm2", "--model"),
    tools: Path | None = typer.Option(None, "--tools", help="tool definitions JSON (tau-bench)"),
    cache_salt: bool = typer.Option(True, "--cache-salt/--no-cache-salt"),
    json_out: Path | None = typer.Option(None, "--json-out"),
    timeout_s: float = typer.Option(600.0, "--timeout"),
) -> None:
    """Replay TRACE through the proxy with rewriting off, then on; print both sides.

    Exits 2 with one line when the trace or tools file cannot be read or nothing answers."""
    try:
        picked = load_trace(trace, tools, first_run + runs)[first_run:]
    except (TraceError, OSError, ValueError, KeyError, TypeError) as e:
        typer.echo(f"replay: cannot read trace {trace}: {getattr(e, 'strerror', None) or e}",
                   err=True)
        raise typer.Exit(2) from None
    probe_proxy(proxy)
    plans = []
    for i, run in enumerate(picked, start=first_run):
        reqs = [openai_body(model, run.tools, r.messages) for r in run.requests]
        plans.append((i, reqs[:max_requests] if max_requests else reqs))
    total = 2 * sum(len(r) for _, r in plans)
    results: list[Sent] = []
    url = proxy.rstrip("/") + "/v1/chat/completions"
    tag = uuid.uuid4().hex[:8]
    with httpx.Client(timeout=timeout_s) as client, Progress() as progress:
        task = progress.add_task("replaying", total=total)
        for run_idx, reqs in plans:
            for side in ("off", "on"):
                headers = {"x-prefixgate-session": f"replay-{tag}-{side}-{run_idx}"}
                if side == "off":
                    headers["x-prefixgate-rewrite"] = "off"
                for k, base in enumerate(reqs):
                    body = with_wall_clock(base) if volatile_clock else dict(base)
                    body.update({"stream": True, "stream_options": {"include_usage": True},
                                 "max_tokens": max_tokens, "temperature": 0})
                    if cache_salt:
                        body["cache_salt"] = f"replay-{tag}-{side}-{run_idx}"
                    try:
                        status, fig = send_streaming(client, url, body, headers)
                    except httpx.HTTPError as e:
                        status, fig = "error", {"error": type(e).__name__}
                    results.append(Sent(side, run_idx, k, status, **fig))
                    progress.update(task, advance=1,
                                    description=f"run {run_idx} {side} {k + 1}/{len(reqs)}")
    figures = {s: side_figures([r for r in results if r.side == s]) for s in ("off", "on")}
    t = Table(title=f"replay of {trace.name}: {len(plans)} run(s)")
    t.add_column("figure")
    t.add_column("rewrite off", justify="right")
    t.add_column("rewrite on", justify="right")
    for key, kind in (("requests", ""), ("skipped", ""), ("errors", ""), ("prompt_tokens", ""),
                      ("cached_share", "share"), ("ttft_p50_ms", "ms"), ("ttft_p95_ms", "ms"),
                      ("tpot_p50_ms", "ms"), ("engine_ttft_p50_ms", "ms")):
        t.add_row(key, fmt(figures["off"][key], kind), fmt(figures["on"][key], kind))
    Console().print(t)
    errors = [r for r in results if r.status == "error"]
    for r in errors[:5]:
        typer.echo(f"error: run {r.run} {r.side} request {r.k}: {r.error}", err=True)
    if results and len(errors) == len(results):
        raise typer.Exit(1)
    if json_out:
        cmd = "prefixgate " + " ".join(sys.argv[1:]) if sys.argv else "prefixgate replay"
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps({"command": cmd, "figures": figures,
                                        "requests": [asdict(r) for r in results]}, indent=2))


def register(app: typer.Typer) -> None:
    """Add ``replay``."""
    app.command("replay")(replay)
