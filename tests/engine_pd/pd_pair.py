"""Start a real prefill + decode engine pair as two processes (for the slow end-to-end tests)."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

PAIR_SECRET = secrets.token_hex(32)
"""The pair's shared secret (``pd.auth``): one per test run, as ``serve`` would make one."""


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def engine(model: Path, port: int, role: str, link: str, peer: str | None,
           log: Path, timeout_s: float = 60.0) -> subprocess.Popen[bytes]:
    """One engine process of a P/D pair (``role`` prefill or decode), logging to ``log``."""
    cmd = [sys.executable, "-m", "prefixgate.local_engine", "--model", str(model),
           "--port", str(port), "--role", role, "--pd-link", link, "--threads", "1",
           "--num-kv-slots", "4096", "--log-level", "warning", "--pd-timeout-s", str(timeout_s)]
    if peer:
        cmd += ["--pd-peer-url", peer]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
           "PREFIXGATE_PD_SECRET": PAIR_SECRET}
    return subprocess.Popen(cmd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


@contextmanager
def pd_pair(model: Path, tmp: Path, ready_s: float = 240.0) -> Iterator[tuple[str, str]]:
    """``(prefill_url, decode_url)`` (``http://127.0.0.1:PORT/v1``) of a paired engine pair;
    both processes are stopped on exit."""
    pp, dp = free_port(), free_port()
    link = f"tcp://127.0.0.1:{free_port()}"
    dec = engine(model, dp, "decode", link, None, tmp / "decode.log")
    pre = engine(model, pp, "prefill", link, f"http://127.0.0.1:{dp}", tmp / "prefill.log")
    try:
        end = time.monotonic() + ready_s
        for port in (pp, dp):
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > end or pre.poll() is not None or dec.poll() is not None:
                    raise RuntimeError("engine pair did not start: " +
                                       (tmp / "prefill.log").read_text()[-2000:])
                time.sleep(0.5)
        while "engine_kv_link_up 1.0" not in httpx.get(f"http://127.0.0.1:{pp}/metrics").text:
            if time.monotonic() > end:
                raise RuntimeError("the P/D link did not pair")
            time.sleep(0.5)
        yield f"http://127.0.0.1:{pp}/v1", f"http://127.0.0.1:{dp}/v1"
    finally:
        for p in (pre, dec):
            p.terminate()
        for p in (pre, dec):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
