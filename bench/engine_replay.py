"""Replay tau-bench airline agent sessions against the local engine and transformers' CB.

    .venv/bin/python bench/engine_replay.py [--quick] [--runs 8] [--turns 6] [--sessions 4]

Workload: the real GPT-4o airline runs of ``../shared/data/traces/tau_bench_airline_gpt4o.json``
with the 14 tools of ``tools/tau_bench_airline.json``. Request *k* of a run is
system + tools + the run's messages before its *k*-th assistant turn (the request that produced
that turn), ``max_tokens`` small (default 16), greedy. Requests whose prompt does not fit the
context (prompt + max_tokens > 8192 tokens) are skipped on both sides and counted. Each run is
one agent session; ``--sessions`` sessions run concurrently, each sending its requests one
after the other, so consecutive requests of a session share a growing prefix and all sessions
share the system + tools prefix — the shape prefix caching is for.

- ours: ``python -m prefixgate.local_engine`` (radix prefix cache, continuous batching, chunked prefill),
  driven over HTTP by ``--sessions`` client threads; streamed, timed on the client.
- transformers: ``model.generate_batch(..., ContinuousBatchingConfig(allow_block_sharing=True))``
  (transformers 5.x built-in continuous batching with prefix block sharing), same token ids,
  persistent manager so blocks stay shared across calls, fed in waves: wave *k* = the *k*-th
  request of each of ``--sessions`` sessions, submitted together. TTFT = first token timestamp
  - request creation; cached tokens are read by wrapping ``PagedAttentionCache.search_prefix_match``
  (instrumentation only: its result is returned unchanged).

Figures per side: cached-token share (cached prompt tokens / prompt tokens), TTFT p50/p95 (ms),
TPOT p50 (ms), KV pool peak (tokens; ours: ``engine_kv_slots_used`` sampled from /metrics every
0.2 s, radix-cache-held slots included), wall time. ``--quick`` (smoke test, about a minute on an
idle 2-core box): 4 runs x 2 turns, system prompt cut to 600 characters, 2 tools, 8 tokens,
transformers on the first wave only.
Like with like (issue 14): both sides replay exactly the same requests (``--tf-waves`` limits
both, :func:`wave_keys`) after the same kind of untimed warm-up request; ``figures.same_requests``
records that the request sets matched.
Writes ``bench/results/engine_replay.json`` = ``{"command", "figures": {"ours", "transformers",
"same_requests"}, "setup"}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.result_file import command, write_json  # noqa: E402
from bench.serving_client import EngineProcess, percentile, timed_stream

DATA = REPO.parent / "shared" / "data"
MODEL_DIR = Path("~/.cache/prefixgate/models/SmolLM2-135M-Instruct").expanduser()
OUT = REPO / "bench" / "results" / "engine_replay.json"
CONTEXT = 8192


def build_sessions(
    runs: int, turns: int, system_chars: int | None, n_tools: int | None
) -> list[list[dict[str, Any]]]:
    """Per run, its first ``turns`` request bodies ``{"messages", "tools"}`` (rule: module doc)."""
    trace = json.loads((DATA / "traces" / "tau_bench_airline_gpt4o.json").read_text())
    tools = json.loads((DATA / "tools" / "tau_bench_airline.json").read_text())[:n_tools]
    sessions = []
    for run in trace[:runs]:
        traj = [dict(m) for m in run["traj"]]
        if system_chars is not None and traj[0]["role"] == "system":
            traj[0]["content"] = traj[0]["content"][:system_chars]
        bodies = [{"messages": traj[:k], "tools": tools}
                  for k, m in enumerate(traj) if m["role"] == "assistant"]
        sessions.append(bodies[:turns])
    return sessions


def tokenize_sessions(
    sessions: list[list[dict[str, Any]]], max_tokens: int
) -> tuple[list[list[tuple[dict[str, Any], list[int]]]], int]:
    """Attach prompt token ids (the server's own rendering) and drop over-context requests.

    Returns (sessions of (body, ids), number skipped)."""
    from transformers import AutoTokenizer

    from prefixgate.local_engine.server.chat import encode_chat

    tok = AutoTokenizer.from_pretrained(str(MODEL_DIR))
    kept, skipped = [], 0
    for bodies in sessions:
        items = []
        for body in bodies:
            ids = encode_chat(tok, body["messages"], body["tools"])
            if len(ids) + max_tokens > CONTEXT:
                skipped += 1
                continue
            items.append((body, ids))
        kept.append(items)
    return kept, skipped


def _summary(rows: list[dict[str, Any]], wall_s: float | None) -> dict[str, Any]:
    ttft = [r["ttft_ms"] for r in rows]
    tpot = [r["tpot_ms"] for r in rows if r.get("tpot_ms")]
    prompt = sum(r["prompt_tokens"] for r in rows)
    cached = sum(r["cached_tokens"] for r in rows)
    p = {k: percentile(v, q) for k, v, q in
         (("p50", ttft, 50), ("p95", ttft, 95), ("tpot", tpot, 50))}
    return {
        "requests": len(rows),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_token_share": round(cached / prompt, 4) if prompt else None,
        "ttft_p50_ms": round(p["p50"], 1) if p["p50"] is not None else None,
        "ttft_p95_ms": round(p["p95"], 1) if p["p95"] is not None else None,
        "tpot_p50_ms": round(p["tpot"], 2) if p["tpot"] is not None else None,
        "wall_s": round(wall_s, 1) if wall_s is not None else None,
    }


def _scrape(url: str, name: str) -> float | None:
    try:
        text = httpx.get(url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def replay_ours(
    sessions: list[list[tuple[dict[str, Any], list[int]]]], n_concurrent: int, max_tokens: int,
    threads: int,
) -> dict[str, Any]:
    """Replay over HTTP against ``python -m prefixgate.local_engine``; ``n_concurrent`` client threads."""
    rows: list[dict[str, Any]] = []
    lock = threading.Lock()
    peak = [0.0]
    done = threading.Event()
    log = Path(tempfile.gettempdir()) / "engine_replay_ours.log"

    with EngineProcess(MODEL_DIR, threads=threads, log_path=log) as eng:
        def sample_pool() -> None:
            while not done.wait(0.2):
                used = _scrape(eng.base_url, "engine_kv_slots_used")
                if used is not None:
                    peak[0] = max(peak[0], used)

        def run_session(index: int) -> None:
            with httpx.Client(timeout=1800) as client:
                for turn, (body, _) in enumerate(sessions[index]):
                    req = {**body, "model": "m", "max_tokens": max_tokens, "temperature": 0}
                    t = timed_stream(client, eng.base_url, req)
                    with lock:
                        rows.append({"key": (index, turn), "ttft_ms": t.ttft_ms,
                                     "tpot_ms": t.tpot_ms or 0.0,
                                     "prompt_tokens": t.usage["prompt_tokens"],
                                     "cached_tokens": t.cached_tokens})

        with httpx.Client(timeout=600) as client:  # first-call costs, outside the figures
            timed_stream(client, eng.base_url, {"messages": [{"role": "user", "content": "hi"}],
                                                "max_tokens": 2})
        sampler = threading.Thread(target=sample_pool, daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        with ThreadPoolExecutor(n_concurrent) as pool:
            list(pool.map(run_session, range(len(sessions))))
        wall = time.perf_counter() - t0
        done.set()
        sampler.join()
        total = _scrape(eng.base_url, "engine_kv_slots_total")
    out = _summary(rows, wall)
    out["kv_pool_peak_tokens"] = int(peak[0])
    out["kv_pool_total_tokens"] = int(total or 0)
    out["rows"] = rows
    return out


def wave_keys(lengths: list[int], n_concurrent: int, max_waves: int | None) -> list[list[int]]:
    """The requests transformers' wave replay reaches: per session, the turn indices it sends.

    ``lengths``: requests per session. Waves hold the next request of up to ``n_concurrent``
    active sessions; a session that ends is replaced by the next pending one (the schedule of
    :func:`replay_transformers`); ``max_waves`` None = until every request is sent. Both sides
    replay exactly these requests, so the top-level figures compare the same requests.
    """
    pending = [i for i, n in enumerate(lengths) if n]
    active = [(pending.pop(0), 0) for _ in range(min(n_concurrent, len(pending)))]
    turns: list[list[int]] = [[] for _ in lengths]
    waves = 0
    while active and (max_waves is None or waves < max_waves):
        for s, t in active:
            turns[s].append(t)
        waves += 1
        nxt = []
        for s, t in active:
            if t + 1 < lengths[s]:
                nxt.append((s, t + 1))
            elif pending:
                nxt.append((pending.pop(0), 0))
        active = nxt
    return turns


def replay_transformers(
    sessions: list[list[tuple[dict[str, Any], list[int]]]], n_concurrent: int, max_tokens: int,
    threads: int, page_size: int, num_blocks: int, max_waves: int | None,
) -> dict[str, Any]:
    """Replay through transformers' ``generate_batch`` in waves (rule: module doc)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    from transformers.generation.continuous_batching import cache as cb_cache

    torch.set_num_threads(threads)
    matched: dict[str, int] = {}
    original = cb_cache.PagedAttentionCache.search_prefix_match

    def recording(self: Any, request_id: str, prompt_ids: list[int]) -> int:
        n = int(original(self, request_id, prompt_ids))
        matched[request_id] = n
        return n

    cb_cache.PagedAttentionCache.search_prefix_match = recording  # type: ignore[method-assign]
    try:
        model = AutoModelForCausalLM.from_pretrained(str(MODEL_DIR), dtype=torch.float32,
                                                     attn_implementation="sdpa")
        gen = GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=2,
                               pad_token_id=2)
        cb = ContinuousBatchingConfig(page_size=page_size, num_blocks=num_blocks,
                                      max_batch_tokens=2048, allow_block_sharing=True,
                                      use_cuda_graph=False, use_async_batching=False)
        # the same untimed warm-up request as ours (first-call costs outside the figures)
        model.generate_batch([[1, 2, 3]], generation_config=gen, continuous_batching_config=cb,
                             persistent_manager=True, warmup=False, progress_bar=False)
        matched.clear()
        rows: list[dict[str, Any]] = []
        # n_concurrent sessions active at once; when one ends the next run takes its place
        pending = list(range(len(sessions)))
        active = [(pending.pop(0), 0) for _ in range(min(n_concurrent, len(pending)))]
        t0 = time.perf_counter()
        waves = 0
        while active and (max_waves is None or waves < max_waves):
            wave = [sessions[s][t][1] for s, t in active]
            out = model.generate_batch(wave, generation_config=gen, continuous_batching_config=cb,
                                       record_timestamps=True, persistent_manager=True,
                                       warmup=False, progress_bar=False)
            waves += 1
            ordered = sorted(out.items(), key=lambda kv: int(kv[0].rsplit("_", 1)[1]))
            for (s, t), (rid, res) in zip(active, ordered):
                assert list(res.prompt_ids) == sessions[s][t][1]
                ts = res.timestamps or []
                n = len(res.generated_tokens)
                rows.append({
                    "key": (s, t),
                    "ttft_ms": (ts[0] - res.created_time) * 1000.0 if ts else 0.0,
                    "tpot_ms": (ts[-1] - ts[0]) * 1000.0 / (n - 1) if len(ts) > 1 and n > 1 else 0.0,
                    "prompt_tokens": len(res.prompt_ids),
                    "cached_tokens": matched.get(rid, 0),
                })
            nxt = []
            for s, t in active:
                if t + 1 < len(sessions[s]):
                    nxt.append((s, t + 1))
                elif pending:
                    nxt.append((pending.pop(0), 0))
            active = nxt
        wall = time.perf_counter() - t0
        model.destroy_cached_continuous_batching_manager()
    finally:
        cb_cache.PagedAttentionCache.search_prefix_match = original  # type: ignore[method-assign]
    result = _summary(rows, wall)
    result["rows"] = rows
    result["waves"] = waves
    result["kv_pool_peak_tokens"] = None
    result["kv_pool_total_tokens"] = page_size * num_blocks
    result["note"] = (f"waves of up to {n_concurrent} requests per generate_batch call; "
                      f"page_size {page_size} (block sharing at page granularity); KV use "
                      "not observable from outside, total = preallocated capacity")
    return result


def main() -> None:
    """Build the workload, replay it on each side, write the JSON result."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=8, help="trace runs (sessions) to replay")
    ap.add_argument("--turns", type=int, default=6, help="first N requests of each run")
    ap.add_argument("--sessions", type=int, default=4, help="concurrent sessions")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=["ours", "transformers"], default=None)
    ap.add_argument("--tf-waves", type=int, default=None,
                    help="replay only the requests of transformers' first N waves (it is slow "
                         "on CPU) -- on both sides, so both replay the same requests")
    ap.add_argument("--tf-threads", type=int, default=1,
                    help="torch threads for transformers (2 was 10-20x slower on the shared "
                         "2-core box: its generation thread and the waiting caller contend)")
    ap.add_argument("--tf-page-size", type=int, default=16)
    ap.add_argument("--tf-num-blocks", type=int, default=None,
                    help="transformers KV blocks (default: enough for the concurrent prompts)")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    system_chars = n_tools = None
    if args.quick:
        args.runs, args.turns, system_chars, n_tools, args.max_tokens = 4, 2, 600, 2, 8
        args.tf_waves = 1 if args.tf_waves is None else args.tf_waves
    sessions, skipped = tokenize_sessions(
        build_sessions(args.runs, args.turns, system_chars, n_tools), args.max_tokens)
    sessions = [s for s in sessions if s]
    if args.tf_waves is not None and args.only is None:  # both sides: exactly the same requests
        reach = wave_keys([len(s) for s in sessions], args.sessions, args.tf_waves)
        sessions = [[s[t] for t in turns] for s, turns in zip(sessions, reach) if turns]
    if args.tf_num_blocks is None:  # room for the concurrent requests' contexts, x1.5 for sharing
        longest = max(len(ids) for items in sessions for _, ids in items) + args.max_tokens
        args.tf_num_blocks = -(-longest * args.sessions * 3 // 2 // args.tf_page_size)
    figures: dict[str, Any] = {}
    if args.only in (None, "ours"):
        figures["ours"] = replay_ours(sessions, args.sessions, args.max_tokens, args.threads)
    if args.only in (None, "transformers"):
        figures["transformers"] = replay_transformers(
            sessions, args.sessions, args.max_tokens, args.tf_threads, args.tf_page_size,
            args.tf_num_blocks, args.tf_waves)
    if "ours" in figures and "transformers" in figures:
        ours_keys = sorted(tuple(r["key"]) for r in figures["ours"]["rows"])
        tf_keys = sorted(tuple(r["key"]) for r in figures["transformers"]["rows"])
        figures["same_requests"] = ours_keys == tf_keys
    for side in figures.values():
        if not isinstance(side, dict):
            continue
        side.pop("rows", None)
    result = {
        "command": command(__file__, prefix=".venv/bin/python"),
        "figures": figures,
        "setup": {
            "model": "SmolLM2-135M-Instruct fp32 (both sides)", "runs": args.runs,
            "turns_per_run": args.turns, "concurrent_sessions": args.sessions,
            "max_tokens": args.max_tokens, "threads": args.threads,
            "transformers_threads": args.tf_threads,
            "requests": sum(len(s) for s in sessions), "skipped_over_context": skipped,
            "system_chars": system_chars, "tools": n_tools or 14,
            "per_side": {"ours": {"threads": args.threads, "warmup": "1 request 'hi', 2 tokens"},
                         "transformers": {"threads": args.tf_threads,
                                          "warmup": "1 request of 3 tokens"}},
            "note": "shared 2-core CPU box; client-side timing for ours, transformers' own "
                    "token timestamps for transformers; both sides replay the same requests "
                    "(--tf-waves limits both)",
        },
    }
    write_json(args.out, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
