"""Client-side timing of one OpenAI-compatible streamed request, and engine subprocesses.

``timed_stream(base_url, body)`` sends ``POST /v1/chat/completions`` with ``stream: true`` and
``stream_options.include_usage`` and measures on the client clock:

- TTFT (ms): request sent -> first chunk carrying content (text or a tool call);
- TPOT (ms): (last content chunk - first content chunk) / (completion_tokens - 1), where
  ``completion_tokens`` comes from the final usage chunk (servers may pack several tokens
  into one chunk, so chunks are not counted);
- usage: the server's usage object (``prompt_tokens``, ``completion_tokens``,
  ``prompt_tokens_details.cached_tokens``).

``EngineProcess`` starts ``python -m prefixgate.local_engine`` (or any command) in the background and
waits for ``/health``; leaving the ``with`` block terminates it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

__all__ = ["EngineProcess", "StreamTiming", "free_port", "median", "percentile", "timed_stream"]


@dataclass
class StreamTiming:
    """One streamed request's client-side figures (ms) and the server's usage dict."""

    ttft_ms: float
    tpot_ms: float | None
    e2e_ms: float
    usage: dict[str, Any] = field(default_factory=dict)
    text: str = ""

    @property
    def cached_tokens(self) -> int:
        details = self.usage.get("prompt_tokens_details") or {}
        return int(details.get("cached_tokens") or 0)

    @property
    def decode_tokens_per_s(self) -> float | None:
        return 1000.0 / self.tpot_ms if self.tpot_ms else None


def timed_stream(
    client: httpx.Client, base_url: str, body: dict[str, Any], path: str = "/v1/chat/completions"
) -> StreamTiming:
    """Send ``body`` streamed and time it (see module docstring). Errors: httpx.HTTPStatusError
    for a non-2xx answer; RuntimeError when the stream carries no usage chunk."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = last = None
    usage: dict[str, Any] | None = None
    text: list[str] = []
    with client.stream("POST", base_url + path, json=body) as resp:
        if resp.status_code >= 400:
            resp.read()
            resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                piece = delta.get("content") or choice.get("text") or ""
                if piece or delta.get("tool_calls"):
                    now = time.perf_counter()
                    first = first if first is not None else now
                    last = now
                    text.append(piece)
    end = time.perf_counter()
    if usage is None:
        raise RuntimeError("stream ended without a usage chunk")
    n = int(usage.get("completion_tokens") or 0)
    first = end if first is None else first
    tpot = (last - first) * 1000.0 / (n - 1) if last is not None and n > 1 else None
    return StreamTiming(
        ttft_ms=(first - t0) * 1000.0, tpot_ms=tpot, e2e_ms=(end - t0) * 1000.0,
        usage=usage, text="".join(text),
    )


def median(values: list[float]) -> float | None:
    """Median of ``values`` (None when empty)."""
    return percentile(values, 50)


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated ``q``-th percentile (0..100) of ``values`` (None when empty)."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EngineProcess:
    """``python -m prefixgate.local_engine --model DIR --port P [extra...]`` as a background process.

    ``threads`` caps torch's intra-op threads (OMP_NUM_THREADS). The process's output goes to
    ``log_path``. Errors: RuntimeError when ``/health`` is not up within ``timeout_s``.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        extra_args: list[str] | None = None,
        threads: int | None = None,
        log_path: str | Path | None = None,
        timeout_s: float = 300.0,
        command: list[str] | None = None,
    ) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.cmd = command or [
            sys.executable, "-m", "prefixgate.local_engine", "--model", str(model_dir),
            "--port", str(self.port), "--log-level", "warning", *(extra_args or []),
        ]
        self.env = dict(os.environ)
        if threads:
            self.env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        self.log_path = Path(log_path) if log_path else Path(os.devnull)
        self.timeout_s = timeout_s
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        with open(self.log_path, "ab") as log:  # the child keeps its own copy of the fd
            self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=log, stderr=log)
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.__exit__(None, None, None)
        raise RuntimeError(f"engine not healthy within {self.timeout_s}s; see {self.log_path}")

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
