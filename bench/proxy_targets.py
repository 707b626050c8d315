"""The processes a proxy benchmark times and how it loads them (``proxy_overhead``,
``hot_path_profile``, ``hot_path_ab``).

- targets on loopback, each its own process: the fake upstream (``bench/fake_upstream.py``),
  ``prefixgate serve`` with rewrite on or off, the bare relay floor (``bench/relay_floor.py``),
  the LiteLLM proxy (its own venv under ``~/.cache/prefixgate/litellm-venv``);
- the bodies: ``SMALL`` (1 KB) and ``agent_body()`` (the tau-bench airline request closest to
  29 KB), as the OpenAI SDK sends them (``wire``);
- the load: ``sequential`` (timed requests interleaved across targets in a seeded shuffled
  order) and ``wrk`` (Debian ``wrk`` throughput, requests/s).

Its own module so that ``proxy_overhead`` and ``hot_path_profile`` (which runs inside it) both
import it rather than each other.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from prefixgate.proxy.sim.traces import load_tau, openai_body  # noqa: E402

DATA = Path(os.environ.get("PREFIXGATE_DATA_DIR") or REPO.parent / "shared" / "data")
TRACE = DATA / "traces" / "tau_bench_airline_gpt4o.json"
LITELLM_VENV = Path("~/.cache/prefixgate/litellm-venv").expanduser()
MASTER_KEY = "sk-bench-master"
LITELLM_SPEC = "litellm[proxy]==1.108.7"  # the version issue 25 compares against
AGENT_BYTES = 29_000
SMALL = {"model": "m", "max_tokens": 16,
         "messages": [{"role": "system", "content": "You are a terse assistant. " * 6},
                      {"role": "user", "content": "Summarise this: " + "lorem ipsum " * 66}]}


def wire(body: dict[str, Any]) -> bytes:
    """``body`` as the OpenAI Python SDK sends it (httpx: compact JSON, UTF-8)."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def agent_body(target_bytes: int = AGENT_BYTES) -> dict[str, Any]:
    """The tau-bench airline request (tools + history, model ``m``) closest to
    ``target_bytes`` on the wire."""
    bodies = [openai_body("m", run.tools, r.messages)
              for run in load_tau(TRACE) for r in run.requests]
    return min(bodies, key=lambda b: abs(len(wire(b)) - target_bytes))


def free_port() -> int:
    """A free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str, proc: subprocess.Popen[bytes], timeout_s: float,
            headers: dict[str, str] | None = None) -> None:
    """Poll ``url`` until it answers < 500 (RuntimeError when ``proc`` dies or time is up)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url, timeout=2, headers=headers).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not come up")
        time.sleep(0.3)


def start_upstream() -> tuple[subprocess.Popen[bytes], str]:
    """The fake upstream process and its URL."""
    proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "fake_upstream.py")],
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None
    port = proc.stdout.readline().split()[1].decode()
    return proc, f"http://127.0.0.1:{port}"


def start_floor(up: str) -> tuple[subprocess.Popen[bytes], str]:
    """``bench/relay_floor.py`` (the bare relay on prefixgate's stack) in front of ``up``."""
    proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "relay_floor.py"),
                             "--upstream", up], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    port = proc.stdout.readline().split()[1].decode()
    url = f"http://127.0.0.1:{port}"
    wait_up(url + "/", proc, 60)
    return proc, url


def start_prefixgate(up: str, tmp: Path, name: str, rewrite: bool, workers: int = 1
                     ) -> tuple[subprocess.Popen[bytes], str]:
    """``prefixgate serve --workers <workers>`` in front of ``up``."""
    port = free_port()
    policy = tmp / f"{name}.yaml"
    policy.write_text(json.dumps({
        "listen": {"host": "127.0.0.1", "port": port},
        "backends": {"up": {"kind": "openai_compat", "base_url": up + "/v1"}},
        "routes": [{"match": "*", "backend": "up"}],
        "rewrite": {"enabled": rewrite},
        "ledger": {"path": str(tmp / f"{name}.sqlite")}}))
    proc = subprocess.Popen([sys.executable, "-m", "prefixgate.proxy.cli", "serve", "--policy", str(policy),
                             "--log-level", "warning", "--workers", str(workers)], cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    wait_up(url + "/healthz", proc, 120)
    return proc, url


def litellm_bin() -> Path:
    """The ``litellm`` CLI in its own venv, installed on first use (``litellm[proxy]``)."""
    exe = LITELLM_VENV / "bin" / "litellm"
    if not exe.exists():
        subprocess.run([shutil.which("python3.11") or "python3", "-m", "venv",
                        str(LITELLM_VENV)], check=True)
        subprocess.run([str(LITELLM_VENV / "bin" / "pip"), "install", "-q", LITELLM_SPEC],
                       check=True)
    return exe


def start_litellm(up: str, tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The LiteLLM proxy: one model ``m`` -> the fake upstream; no DB, no callbacks, 1 worker."""
    port = free_port()
    cfg = tmp / "litellm.yaml"
    cfg.write_text(json.dumps({
        "model_list": [{"model_name": "m", "litellm_params": {
            "model": "openai/m", "api_base": up + "/v1", "api_key": "sk-upstream"}}],
        "general_settings": {"master_key": MASTER_KEY},
        "litellm_settings": {"callbacks": [], "success_callback": [], "failure_callback": [],
                             "telemetry": False, "drop_params": True}}))
    env = {**os.environ, "LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False"}
    proc = subprocess.Popen([str(litellm_bin()), "--config", str(cfg), "--host", "127.0.0.1",
                             "--port", str(port), "--num_workers", "1"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_up(url + "/health/liveliness", proc, 300)
    return proc, url


def one(client: httpx.Client, url: str, body: bytes, stream: bool) -> float:
    """ms until the whole answer (``stream=False``) or its first body chunk (``True``)."""
    t0 = time.perf_counter()
    if not stream:
        r = client.post(url + "/v1/chat/completions", content=body)
        assert r.status_code == 200, r.text[:200]
        return (time.perf_counter() - t0) * 1e3
    with client.stream("POST", url + "/v1/chat/completions", content=body) as r:
        assert r.status_code == 200
        chunks = r.iter_raw()
        next(chunks)
        first = time.perf_counter()
        for _ in chunks:
            pass
    return (first - t0) * 1e3


def sequential(targets: dict[str, tuple[str, bytes]], n: int, stream: bool
               ) -> dict[str, list[float]]:
    """``n`` timed requests per target, interleaved, after 20 warm-ups. Each iteration takes
    the targets in a shuffled order (seeded, so reruns match): a server's after-answer work
    runs while the next target is timed, and a fixed rotation made some target always follow
    the same other one (measured: ~0.1 ms on the 1 KB figures, ~2 ms on the rewrite-on one)."""
    clients = {k: httpx.Client(timeout=30, headers={"authorization": f"Bearer {MASTER_KEY}",
                                                    "content-type": "application/json"})
               for k in targets}
    out: dict[str, list[float]] = {k: [] for k in targets}
    names = list(targets)
    rng = random.Random(25)
    try:
        for i in range(n + 20):
            order = rng.sample(names, len(names))
            for k in order:
                url, body = targets[k]
                ms = one(clients[k], url, body, stream)
                if i >= 20:
                    out[k].append(ms)
    finally:
        for c in clients.values():
            c.close()
    return out


def wrk(url: str, body: bytes, seconds: int, tmp: Path, connections: int = 32) -> float:
    """Requests/s of ``wrk -t1 -c<connections> -d<seconds>s`` POSTing ``body``."""
    script, payload = tmp / f"post-{len(body)}.lua", tmp / f"body-{len(body)}.json"
    payload.write_bytes(body)  # read by the script: no escaping of the body into Lua source
    script.write_text(
        'wrk.method = "POST"\n'
        f'local f = io.open("{payload}", "rb")\nwrk.body = f:read("*all")\nf:close()\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "Bearer {MASTER_KEY}"\n')
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "-s", str(script),
                          url + "/v1/chat/completions"], capture_output=True, text=True,
                         check=True).stdout
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise RuntimeError(f"wrk saw {errors.group(1)} error responses from {url}")
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    assert m, out
    return float(m.group(1))
