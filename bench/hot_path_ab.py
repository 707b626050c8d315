"""Before / after on one box in one run: prefixgate at an older commit next to this checkout (issue 25).

    python bench/hot_path_ab.py [--old adbd709] [--requests 200] [--wrk-seconds 5]
        [--rounds 2] [--out bench/results/hot_path_ab.json]

Figures of runs made at different times on shared cores cannot be compared (the same LiteLLM
moved 2.7x between two runs of ``proxy_overhead.py``), so this starts both versions at once:
``git archive <old> prefixgate`` unpacked into a temporary folder, and this checkout, each as
``prefixgate serve`` (one worker) in front of one fake upstream, 1 KB body rewrite off and the
29 KB tau-bench agent body rewrite on (``proxy_overhead.py``'s bodies). Per round: sequential
requests interleaved in a seeded shuffled order (``proxy_overhead.sequential``), added p50 =
the version's p50 minus direct's; then ``wrk -t1 -c32`` req/s per server. Also counted: the
servers' log lines saying a rewrite or an after-answer analysis passed its time budget or a
row waited for the previous one (overload signs under ``wrk``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import bench.proxy_targets as po  # noqa: E402
from bench.result_file import command, write_json  # noqa: E402
from prefixgate.cache.savings.report import percentile  # noqa: E402

OVERLOAD = ("over its", "not recorded within")


def start(up: str, tmp: Path, name: str, rewrite: bool, root: Path
          ) -> tuple[subprocess.Popen[bytes], str, Path]:
    """``prefixgate serve`` of the package under ``root``; (process, URL, its stderr file)."""
    port = po.free_port()
    policy = tmp / f"{name}.yaml"
    policy.write_text(json.dumps({
        "listen": {"host": "127.0.0.1", "port": port},
        "backends": {"up": {"kind": "openai_compat", "base_url": up + "/v1"}},
        "routes": [{"match": "*", "backend": "up"}], "rewrite": {"enabled": rewrite},
        "ledger": {"path": str(tmp / f"{name}.sqlite")}}))
    err = tmp / f"{name}.err"
    with err.open("w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "prefixgate.proxy.cli", "serve",
                                 "--policy", str(policy), "--log-level", "warning"],
                                env={**os.environ, "PYTHONPATH": str(root)}, cwd=root, stderr=fh)
    url = f"http://127.0.0.1:{port}"
    po.wait_up(url + "/healthz", proc, 120)
    return proc, url, err


def main() -> None:
    """Run and write the JSON (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", default="adbd709")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--wrk-seconds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "hot_path_ab.json"))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pg-ab-"))
    old_root = tmp / "old"
    old_root.mkdir()
    archive = subprocess.run(["git", "archive", args.old, "prefixgate"], cwd=REPO,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(old_root)], input=archive, check=True)
    small, agent = po.wire(po.SMALL), po.wire(po.agent_body())
    procs: list[subprocess.Popen[bytes]] = []
    errs: dict[str, Path] = {}
    t0 = time.perf_counter()
    try:
        up_proc, up = po.start_upstream()
        procs.append(up_proc)
        urls: dict[str, tuple[str, bytes]] = {}
        for version, root in (("old", old_root), ("new", REPO)):
            for case, body, rewrite in (("small_off", small, False), ("agent_on", agent, True)):
                proc, url, err = start(up, tmp, f"{version}_{case}", rewrite, root)
                procs.append(proc)
                urls[f"{version}_{case}"], errs[f"{version}_{case}"] = (url, body), err
        seq = {"direct_small": (up, small), "direct_agent": (up, agent), **urls}
        rounds: list[dict[str, Any]] = []
        for _ in range(args.rounds):
            lat = po.sequential(seq, args.requests, stream=False)
            rps = {k: round(po.wrk(u, b, args.wrk_seconds, tmp), 1) for k, (u, b) in urls.items()}
            rounds.append({"added_p50_ms": {
                k: round(percentile(lat[k], 50) - percentile(
                    lat["direct_small" if "small" in k else "direct_agent"], 50), 3)
                for k in urls}, "rps": rps})
            print(json.dumps(rounds[-1]), flush=True)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
    overload = {k: sum(1 for line in e.read_text().splitlines() if any(w in line for w in OVERLOAD))
                for k, e in errs.items()}
    doc = {"command": command(__file__, prefix="nice -n 5 python"),
           "old": args.old, "rounds": rounds, "overload_log_lines": overload,
           "setup": {"requests": args.requests, "wrk": f"wrk -t1 -c32 -d{args.wrk_seconds}s",
                     "wall_s": round(time.perf_counter() - t0, 1),
                     "machine": f"{os.cpu_count()} CPUs shared with other jobs; loopback"}}
    write_json(args.out, doc)
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
