"""Tools masked instead of removed, on our engine: cached share and forced-call validity.

Phase ``forced``: the forced-tool test set (``tests/engine_server/forced_tools.py``: 4 prompts x
3 forcing choices, greedy) through the engine's HTTP app; ``forced_tool_valid_share`` = answers
that are one call of an allowed tool with arguments valid against its schema.

Phase ``replay``: the first ``--requests`` requests of tau-bench airline run 0 (14 tools),
streamed through three proxies in front of one engine, each side with its own session and
``cache_salt`` (cold start, no cross-warming): ``masking`` (backend kind ``local``,
``prune_tools`` on with ``prune_tools_min_catalog: 1``: tools kept, ``allowed_tools`` sent),
``pruning`` (same policy, backend kind ``openai_compat``: tools removed) and ``no_pruning``
(kind ``local``, ``prune_tools`` off). ``cached_share_*`` = cached / prompt tokens over the
side's requests (engine usage). Results are merged into ``bench/results/tool_masking.json``.

    nice python bench/tool_masking.py --phase all --requests 6
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from bench.result_file import command, write_json  # noqa: E402
from prefixgate.cache.ledger.store import Ledger  # noqa: E402
from prefixgate.config.loader import parse_policy  # noqa: E402
from prefixgate.local_engine.engine import Engine, EngineConfig  # noqa: E402
from prefixgate.local_engine.server import build_app as engine_app  # noqa: E402
from prefixgate.proxy.app import build_app as proxy_app
from prefixgate.proxy.cli.replay import send_streaming  # noqa: E402
from tests.engine_server.forced_tools import (  # noqa: E402
    CHOICES,
    PROMPTS,
    TOOLS,
    valid_forced_answer,
)
from tests.servers import serve_app  # noqa: E402
from tests.tiny_model import model_dir  # noqa: E402

DATA = REPO.parent / "shared" / "data"
TRACE = DATA / "traces" / "tau_bench_airline_gpt4o.json"
TAU_TOOLS = DATA / "tools" / "tau_bench_airline.json"
OUT = REPO / "bench/results/tool_masking.json"
SIDES = {"masking": ("local", True), "pruning": ("openai_compat", True),
         "no_pruning": ("local", False)}


def forced(engine_url: str) -> dict[str, Any]:
    """Forced-call validity over the test set (greedy)."""
    valid = total = 0
    with httpx.Client(timeout=600) as client:
        for choice in CHOICES:
            for prompt in PROMPTS:
                r = client.post(f"{engine_url}/v1/chat/completions", json={
                    "model": "m", "messages": [{"role": "user", "content": prompt}],
                    "tools": TOOLS, "tool_choice": choice, "max_tokens": 200, "temperature": 0})
                valid += r.status_code == 200 and valid_forced_answer(r.json(), choice)
                total += 1
    return {"forced_tool_valid_share": valid / total, "forced_requests": total}


def mask_cost(model_path: str, steps: int = 300) -> dict[str, Any]:
    """Per-step cost of the mask on CPU (ms, p50 / p95): a forced call decoded from random
    logits (the grammar's worst case: long free strings) with the model's tokenizer."""
    import statistics

    import torch
    from transformers import AutoTokenizer

    from prefixgate.local_engine.server.constrained import tool_call_processor
    from prefixgate.local_engine.server.tool_mask import resolve_tool_constraint

    tok = AutoTokenizer.from_pretrained(model_path)
    gen = torch.Generator().manual_seed(0)
    times: list[float] = []
    while len(times) < steps:
        proc = tool_call_processor(tok, TOOLS, resolve_tool_constraint(TOOLS, "required"))
        ids: list[int] = []
        for _ in range(steps):
            t0 = time.perf_counter()
            logits = proc(ids, torch.randn(len(tok), generator=gen))
            times.append((time.perf_counter() - t0) * 1e3)
            nxt = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
            if nxt == tok.eos_token_id:
                break
            ids.append(nxt)
    times.sort()
    return {"mask_ms_per_step_p50": round(statistics.median(times), 3),
            "mask_ms_per_step_p95": round(times[int(0.95 * len(times))], 3)}


def _side(engine_url: str, kind: str, prune: bool, reqs: list[dict[str, Any]],
          tmp: Path) -> dict[str, Any]:
    policy = parse_policy({
        "backends": {"b": {"kind": kind, "base_url": engine_url + "/v1"}},
        "routes": [{"match": "*", "backend": "b"}],
        "rewrite": {"prune_tools": prune, "prune_tools_min_catalog": 1},
        "ledger": {"path": str(tmp / f"{uuid.uuid4().hex}.sqlite")}})
    tag = uuid.uuid4().hex[:8]
    prompt = cached = done = 0
    with serve_app(proxy_app(policy, ledger=Ledger(policy.ledger.path))) as url, \
            httpx.Client(timeout=900) as client:
        for base in reqs:
            body = {**base, "stream": True, "stream_options": {"include_usage": True},
                    "max_tokens": 8, "temperature": 0, "cache_salt": tag}
            status, fig = send_streaming(client, url + "/v1/chat/completions", body,
                                         {"x-prefixgate-session": tag})
            if status != "ok":
                raise RuntimeError(f"{kind}: {fig.get('error')}")
            prompt += fig["prompt_tokens"] or 0
            cached += fig["cached_tokens"] or 0
            done += 1
    return {"requests": done, "prompt_tokens": prompt, "cached_tokens": cached,
            "cached_share": round(cached / prompt, 4) if prompt else None}


def tau_requests(n: int) -> list[dict[str, Any]]:
    """The first ``n`` Chat Completions bodies of tau-bench run 0: one per assistant turn, the
    conversation before it, with the 14 airline tools."""
    traj = json.loads(TRACE.read_text())[0]["traj"]
    tools = json.loads(TAU_TOOLS.read_text())
    ends = [i for i, m in enumerate(traj) if m.get("role") == "assistant" and i > 0][:n]
    return [{"model": "m", "messages": traj[:i], "tools": tools} for i in ends]


def replay(engine_url: str, n: int) -> dict[str, Any]:
    """Cached share per side over the first ``n`` requests of run 0."""
    reqs = tau_requests(n)
    with tempfile.TemporaryDirectory() as tmp:
        sides = {name: _side(engine_url, kind, prune, reqs, Path(tmp))
                 for name, (kind, prune) in SIDES.items()}
    return {"cached_share_masking": sides["masking"]["cached_share"],
            "cached_share_pruning": sides["pruning"]["cached_share"],
            "cached_share_no_pruning": sides["no_pruning"]["cached_share"],
            "replay": {"trace": TRACE.name, "run": 0, "requests": n, "sides": sides}}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", choices=["forced", "replay", "all"], default="all")
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--model-dir", default=str(model_dir()))
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    engine = Engine(EngineConfig(model_path=args.model_dir, max_context_len=8192,
                                 model_name="m"))
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.exists() else {"figures": {}}
    t0 = time.perf_counter()
    try:
        with serve_app(engine_app(engine)) as engine_url:
            if args.phase in ("forced", "all"):
                result["figures"].update(forced(engine_url))
                result["figures"].update(mask_cost(args.model_dir))
            if args.phase in ("replay", "all"):
                result["figures"].update(replay(engine_url, args.requests))
    finally:
        engine.shutdown()
    result["command"] = command(__file__, prefix="nice python")
    result["model"] = Path(args.model_dir).name
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    write_json(out, result)
    print(json.dumps(result["figures"], indent=2))
    f = result["figures"]
    return 0 if f.get("forced_tool_valid_share") in (None, 1.0) else 1


if __name__ == "__main__":
    raise SystemExit(main())
