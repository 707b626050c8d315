"""Local engine vs llama.cpp on the same model and prompts: TTFT cold / warm, decode tokens/s.

    .venv/bin/python bench/engine_vs_llamacpp.py [--runs 3] [--quick] [--threads 2]
        [--llamacpp-poll 50 0]

Both servers run as their own processes and are timed the same way from this client over
their OpenAI-compatible streaming API (``serving_client.timed_stream``):

- ours: ``python -m prefixgate.local_engine`` on the converted safetensors directory (fp32 weights),
  torch limited to ``--threads`` threads;
- llama.cpp: ``xllamacpp`` (PyPI, prebuilt llama.cpp server) on the original GGUF
  (Q4_1 weights — a 4-bit quantization, so it moves ~6x fewer weight bytes per token than our
  fp32), ``--threads`` threads, one slot, prompt cache on.

Each run uses a fresh prompt (a nonce in front of the tau-bench airline system prompt + a user
question): the first request is cold (nothing cached), the same request again is warm (the
whole prompt but its last token can come from the prefix cache). Both ask for ``--max-tokens``
tokens with ``ignore_eos`` so that decode always runs that long. Figures are medians over runs.

Like with like (issue 14): all servers are up at once and measured interleaved (each run visits
every side, the order rotated per run), with the same warm-up request and thread count on every
side; llama.cpp runs in each ``--llamacpp-poll`` setting and the headline ``llamacpp`` is its
best configuration (highest decode tokens/s), every configuration recorded.
Writes ``bench/results/engine_vs_llamacpp.json``::

    {"command": str, "figures": {"ours": {"cold_ttft_ms", "warm_ttft_ms", "decode_tokens_per_s",
     "prompt_tokens", "warm_cached_tokens", "weights"}, "llamacpp": {... best config, "poll"},
     "llamacpp_configs": {"llamacpp_poll50": {...}, "llamacpp_poll0": {...}}, "headline": str},
     "setup": {..., "per_side": {"threads", "warmup", "interleaved"}}}
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.result_file import command, write_json  # noqa: E402
from bench.serving_client import EngineProcess, median, timed_stream

DATA = REPO.parent / "shared" / "data"
MODEL_DIR = Path("~/.cache/prefixgate/models/SmolLM2-135M-Instruct").expanduser()
GGUF = MODEL_DIR / "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = REPO / "bench" / "results" / "engine_vs_llamacpp.json"


def base_messages(system_chars: int) -> list[dict[str, str]]:
    """System prompt (first ``system_chars`` characters of the tau-bench airline policy) and
    the first user turn of the first trace run."""
    run = json.loads((DATA / "traces" / "tau_bench_airline_gpt4o.json").read_text())[0]
    system = run["traj"][0]["content"][:system_chars]
    user = next(m["content"] for m in run["traj"] if m["role"] == "user")
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


WARMUP = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _run_body(system_chars: int, max_tokens: int) -> dict[str, Any]:
    msgs = base_messages(system_chars)
    msgs[0]["content"] = f"[session {uuid.uuid4().hex}]\n" + msgs[0]["content"]
    return {"model": "m", "messages": msgs, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}


def _summary(samples: dict[str, list[float]]) -> dict[str, Any]:
    return {
        "cold_ttft_ms": round(median(samples["cold"]) or 0, 1),
        "warm_ttft_ms": round(median(samples["warm"]) or 0, 1),
        "decode_tokens_per_s": round(median(samples["decode"]) or 0, 2),
        "prompt_tokens": int(median(samples["prompt"]) or 0),
        "warm_cached_tokens": int(median(samples["cached"]) or 0),
        "samples": {"cold_ttft_ms": [round(x, 1) for x in samples["cold"]],
                    "warm_ttft_ms": [round(x, 1) for x in samples["warm"]],
                    "decode_tokens_per_s": [round(x, 2) for x in samples["decode"]]},
    }


def measure(servers: dict[str, str], runs: int, max_tokens: int, system_chars: int,
            settle_s: float = 1.0) -> dict[str, dict[str, Any]]:
    """Interleaved cold-then-warm streamed requests: run ``r`` visits every side, in an order
    rotated by ``r`` (so no side always goes first on a warmer machine), each side with a fresh
    prompt of the same length; the same warm-up request on every side before any timing.
    ``servers``: side name -> base URL. Returns medians (ms, tokens/s) per side."""
    samples = {side: {"cold": [], "warm": [], "decode": [], "prompt": [], "cached": []}
               for side in servers}
    names = list(servers)
    # a fresh connection per request on all sides: llama.cpp's server may close a kept-alive
    # connection after a long stream, and loopback connects cost well under a millisecond
    with httpx.Client(timeout=600, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        for url in servers.values():
            timed_stream(client, url, WARMUP)  # first-call costs (allocations, threads)
        for r in range(runs):
            for side in names[r % len(names):] + names[:r % len(names)]:
                time.sleep(settle_s)  # let the other side's spinning threads go idle
                body = _run_body(system_chars, max_tokens)
                first = timed_stream(client, servers[side], body)
                second = timed_stream(client, servers[side], body)
                got = samples[side]
                got["cold"].append(first.ttft_ms)
                got["warm"].append(second.ttft_ms)
                got["decode"] += [t.decode_tokens_per_s for t in (first, second)
                                  if t.decode_tokens_per_s]
                got["prompt"].append(float(first.usage["prompt_tokens"]))
                got["cached"].append(float(second.cached_tokens))
    return {side: _summary(samples[side]) for side in names}


def best_llamacpp(configs: dict[str, dict[str, Any]]) -> str:
    """The peer's best configuration: highest decode tokens/s, ties by lower cold TTFT."""
    return max(configs, key=lambda k: (configs[k]["decode_tokens_per_s"],
                                       -configs[k]["cold_ttft_ms"]))


def main() -> None:
    """Start our engine and llama.cpp (every ``--llamacpp-poll`` setting) together, measure them
    interleaved, and write the JSON result with llama.cpp's best configuration as headline."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2, help="threads for every side")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--system-chars", type=int, default=6200, help="system prompt length")
    ap.add_argument("--quick", action="store_true", help="1 run, short prompt (smoke test)")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--llamacpp-poll", type=int, nargs="+", default=[50, 0],
                    help="llama.cpp threadpool busy-poll levels to run (each one a side; 0 = "
                         "sleep instead of spinning); the best one is the headline")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.max_tokens, args.system_chars = 1, 8, 1500
    log = Path(tempfile.gettempdir()) / "engine_vs_llamacpp.log"
    t0 = time.time()
    with ExitStack() as stack:
        servers = {"ours": stack.enter_context(
            EngineProcess(MODEL_DIR, threads=args.threads, log_path=log)).base_url}
        for poll in args.llamacpp_poll:
            cmd = [sys.executable, str(REPO / "bench" / "llamacpp_server.py"), "--gguf",
                   str(GGUF), "--threads", str(args.threads), "--poll", str(poll), "--port"]
            server = EngineProcess(GGUF, log_path=log, command=cmd)
            server.cmd.append(str(server.port))
            servers[f"llamacpp_poll{poll}"] = stack.enter_context(server).base_url
        measured = measure(servers, args.runs, args.max_tokens, args.system_chars)
    ours = dict(measured.pop("ours"), weights="fp32 safetensors (converted from the Q4_1 GGUF)")
    configs = {k: dict(v, weights="Q4_1 GGUF (4-bit blocks), llama.cpp via xllamacpp",
                       poll=int(k.removeprefix("llamacpp_poll"))) for k, v in measured.items()}
    best = best_llamacpp(configs)
    result = {
        "command": command(__file__, prefix=".venv/bin/python"),
        "figures": {"ours": ours, "llamacpp": configs[best], "llamacpp_configs": configs,
                    "headline": f"llamacpp = llama.cpp's best configuration ({best})"},
        "setup": {
            "model": "SmolLM2-135M-Instruct", "threads": args.threads, "runs": args.runs,
            "max_tokens": args.max_tokens, "system_chars": args.system_chars,
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "per_side": {"threads": args.threads, "warmup": WARMUP, "interleaved": True,
                         "order": "rotated per run", "settle_s_between_sides": 1.0},
            "note": "shared 2-core CPU box; medians of runs; client-side timing over HTTP; "
                    "quantization differs: ours fp32 vs llama.cpp Q4_1",
            "wall_s": round(time.time() - t0, 1),
        },
    }
    write_json(args.out, result)
    print(json.dumps(result["figures"], indent=2))


if __name__ == "__main__":
    main()
