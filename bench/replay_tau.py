"""Replay tau-bench airline runs through ``prefixgate serve`` (proxy + local engine), rewriting off
vs on, and record the figures.

    .venv/bin/python bench/replay_tau.py [--runs 1] [--max-requests N] [--max-tokens 8]
        [--model-dir ~/.cache/prefixgate/models/SmolLM2-135M-Instruct] [--device cpu]
        [--out bench/results/replay_tau_airline.json] [--ledger FILE]

Starts ``prefixgate serve`` on free local ports with a throw-away policy (one ``local`` backend,
spawned, every model routed to it; its own ledger, in a temporary folder unless ``--ledger``
names a file to keep), waits for the proxy, runs
``prefixgate replay ../shared/data/traces/tau_bench_airline_gpt4o.json --volatile-clock ...``
against it, stops the server (which stops the engine) and writes
``{"command": <this command>, "replay_command": ..., "figures": {"off": {...}, "on": {...}},
"requests": [...], "report": <ledger summary>}``. Units: ms, tokens, shares 0-1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.result_file import command, write_json  # noqa: E402

DATA = REPO.parent / "shared" / "data"
DEFAULT_MODEL = Path("~/.cache/prefixgate/models/SmolLM2-135M-Instruct").expanduser()


def free_port() -> int:
    """A TCP port free right now on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    """Run the benchmark (see module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--max-requests", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--model-dir", default=str(DEFAULT_MODEL))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "replay_tau_airline.json"))
    ap.add_argument("--ledger", default=None, help="ledger file to keep (default: temporary)")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="pg-replay-"))
    proxy_port, engine_port = free_port(), free_port()
    policy = tmp / "policy.yaml"
    ledger = Path(args.ledger).resolve() if args.ledger else tmp / "ledger.sqlite"
    policy.write_text(
        f"listen: {{host: 127.0.0.1, port: {proxy_port}}}\n"
        "backends:\n"
        f"  local: {{kind: local, base_url: 'http://127.0.0.1:{engine_port}/v1', spawn: true, "
        f"model_path: '{args.model_dir}', device: {args.device}}}\n"
        "routes:\n  - {match: '*', backend: local}\n"
        f"ledger: {{path: '{ledger}'}}\n")
    cli = [sys.executable, "-m", "prefixgate.proxy.cli"]
    server = subprocess.Popen([*cli, "serve", "--policy", str(policy), "--log-level", "warning"],
                              cwd=REPO)
    try:
        url = f"http://127.0.0.1:{proxy_port}"
        deadline = time.monotonic() + 900
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("prefixgate serve did not come up")
            time.sleep(0.5)
        out = tmp / "replay.json"
        replay = [*cli, "replay", str(DATA / "traces" / "tau_bench_airline_gpt4o.json"),
                  "--proxy", url, "--runs", str(args.runs), "--volatile-clock",
                  "--max-tokens", str(args.max_tokens), "--json-out", str(out)]
        if args.max_requests:
            replay += ["--max-requests", str(args.max_requests)]
        subprocess.run(replay, cwd=REPO, check=True)
        report = subprocess.run([*cli, "report", "--ledger", str(ledger),
                                 "--json"], cwd=REPO, check=True, capture_output=True, text=True)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
    doc = json.loads(out.read_text())
    doc["replay_command"] = "prefixgate " + " ".join(replay[3:])
    doc["command"] = command(__file__)
    doc["report"] = json.loads(report.stdout)
    doc["setup"] = {"model_dir": os.path.basename(args.model_dir.rstrip("/")),
                    "device": args.device, "cpu_count": os.cpu_count()}
    write_json(args.out, doc)
    print(json.dumps(doc["figures"], indent=2))


if __name__ == "__main__":
    main()
