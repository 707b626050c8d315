"""Local engine vs llama.cpp on the same model and prompts: TTFT cold / warm, decode tokens/s.

    .venv/bin/python bench/engine_vs_llamacpp.py [--runs 3] [--quick] [--threads 2]

Both servers run as their own processes and are timed the same way from this client over
their OpenAI-compatible streaming API (``serving_client.timed_stream``):

- ours: ``python -m local_engine`` on the converted safetensors directory (fp32 weights),
  torch limited to ``--threads`` threads;
- llama.cpp: ``xllamacpp`` (PyPI, prebuilt llama.cpp server) on the original GGUF
  (Q4_1 weights — a 4-bit quantization, so it moves ~6x fewer weight bytes per token than our
  fp32), ``--threads`` threads, one slot, prompt cache on.

Each run uses a fresh prompt (a nonce in front of the tau-bench airline system prompt + a user
question): the first request is cold (nothing cached), the same request again is warm (the
whole prompt but its last token can come from the prefix cache). Both ask for ``--max-tokens``
tokens with ``ignore_eos`` so that decode always runs that long. Figures are medians over runs.
Writes ``bench/results/engine_vs_llamacpp.json``::

    {"command": str, "figures": {"ours": {"cold_ttft_ms", "warm_ttft_ms", "decode_tokens_per_s",
     "prompt_tokens", "warm_cached_tokens", "weights"}, "llamacpp": {...}}, "setup": {...}}
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

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


def measure(base_url: str, runs: int, max_tokens: int, system_chars: int) -> dict[str, Any]:
    """Cold then warm streamed requests per run; medians (ms, tokens/s) over runs."""
    cold, warm, decode, prompt_tokens, warm_cached = [], [], [], [], []
    # a fresh connection per request on both sides: llama.cpp's server may close a kept-alive
    # connection after a long stream, and loopback connects cost well under a millisecond
    with httpx.Client(timeout=600, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        warmup = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        timed_stream(client, base_url, warmup)  # first-call costs (allocations, threads)
        for _ in range(runs):
            msgs = base_messages(system_chars)
            msgs[0]["content"] = f"[session {uuid.uuid4().hex}]\n" + msgs[0]["content"]
            body = {"model": "m", "messages": msgs, "max_tokens": max_tokens,
                    "temperature": 0, "ignore_eos": True}
            first = timed_stream(client, base_url, body)
            second = timed_stream(client, base_url, body)
            cold.append(first.ttft_ms)
            warm.append(second.ttft_ms)
            decode += [t.decode_tokens_per_s for t in (first, second) if t.decode_tokens_per_s]
            prompt_tokens.append(first.usage["prompt_tokens"])
            warm_cached.append(second.cached_tokens)
    return {
        "cold_ttft_ms": round(median(cold) or 0, 1),
        "warm_ttft_ms": round(median(warm) or 0, 1),
        "decode_tokens_per_s": round(median(decode) or 0, 2),
        "prompt_tokens": int(median([float(p) for p in prompt_tokens]) or 0),
        "warm_cached_tokens": int(median([float(c) for c in warm_cached]) or 0),
        "samples": {"cold_ttft_ms": [round(x, 1) for x in cold],
                    "warm_ttft_ms": [round(x, 1) for x in warm],
                    "decode_tokens_per_s": [round(x, 2) for x in decode]},
    }


def main() -> None:
    """Run both servers in turn and write the JSON result."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--system-chars", type=int, default=6200, help="system prompt length")
    ap.add_argument("--quick", action="store_true", help="1 run, short prompt (smoke test)")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--only", choices=["ours", "llamacpp"], default=None,
                    help="run one side; the other side's figures in --out are kept")
    ap.add_argument("--llamacpp-poll", type=int, default=50,
                    help="llama.cpp threadpool busy-poll level (0 = sleep instead of spinning: "
                         "far better when the cores are shared)")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.max_tokens, args.system_chars = 1, 8, 1500
    log = Path(tempfile.gettempdir()) / "engine_vs_llamacpp.log"
    figures: dict[str, Any] = {}
    t0 = time.time()
    if args.only in (None, "ours"):
        with EngineProcess(MODEL_DIR, threads=args.threads, log_path=log) as eng:
            figures["ours"] = measure(eng.base_url, args.runs, args.max_tokens, args.system_chars)
        figures["ours"]["weights"] = "fp32 safetensors (converted from the Q4_1 GGUF)"
    if args.only in (None, "llamacpp"):
        cmd = [sys.executable, str(REPO / "bench" / "llamacpp_server.py"), "--gguf", str(GGUF),
               "--threads", str(args.threads), "--poll", str(args.llamacpp_poll), "--port"]
        server = EngineProcess(GGUF, log_path=log, command=cmd)
        server.cmd.append(str(server.port))
        with server:
            figures["llamacpp"] = measure(server.base_url, args.runs, args.max_tokens,
                                          args.system_chars)
        figures["llamacpp"]["weights"] = "Q4_1 GGUF (4-bit blocks), llama.cpp via xllamacpp"
        figures["llamacpp"]["poll"] = args.llamacpp_poll
    commands = [" ".join(shlex.quote(a) for a in [".venv/bin/python", *sys.argv])]
    if args.only and Path(args.out).exists():  # keep the other side's figures and command
        previous = json.loads(Path(args.out).read_text())
        for side, figs in previous.get("figures", {}).items():
            if side == "llamacpp" and side in figures and figs.get("poll", 50) != args.llamacpp_poll:
                side = f"llamacpp_poll{figs.get('poll', 50)}"  # keep the other poll setting too
            figures.setdefault(side, figs)
        if previous.get("command"):
            commands.insert(0, str(previous["command"]))
    result = {
        "command": " && ".join(commands),
        "figures": figures,
        "setup": {
            "model": "SmolLM2-135M-Instruct", "threads": args.threads, "runs": args.runs,
            "max_tokens": args.max_tokens, "system_chars": args.system_chars,
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "note": "shared 2-core CPU box; medians of runs; client-side timing over HTTP; "
                    "quantization differs: ours fp32 vs llama.cpp Q4_1",
            "wall_s": round(time.time() - t0, 1),
        },
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["figures"], indent=2))


if __name__ == "__main__":
    main()
