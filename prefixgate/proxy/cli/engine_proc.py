"""Start the local engine as its own process and wait until it serves (the proxy never imports it).

``prefixgate serve`` spawns one engine per ``local`` backend with ``spawn: true``::

    python -m prefixgate.local_engine --model DIR --host H --port P --device D

where ``H`` is 127.0.0.1 and ``P`` a free port the system picks (issue 37, item 7: an engine on
the policy's well-known 8081 answered an SDK pointed there by mistake, bypassing the proxy and
its ledger): the proxy reaches it at :attr:`EngineProcess.base_url`, which ``serve`` puts in the
policy it serves. It waits for ``GET /health`` to answer 200 and stops the process (SIGTERM,
then SIGKILL after a grace period) when the proxy exits. If an engine already answers at the
backend's ``base_url`` (one the user started, ``prefixgate engine``), it is reused and not
spawned — only when it serves the model asked for (its ``/v1/models`` lists the model
directory's name, the engine's default model name); otherwise serve stops with an error saying
what answers there.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import urlsplit

import httpx

from prefixgate.config.schema import Backend

log = logging.getLogger("prefixgate.engine")


class EngineStartError(RuntimeError):
    """The engine process exited or did not become healthy in time."""


def engine_address(backend: Backend) -> tuple[str, int]:
    """``(host, port)`` of a backend's ``base_url`` (port 80/443 by scheme when absent)."""
    u = urlsplit(backend.base_url)
    return u.hostname or "127.0.0.1", u.port or (443 if u.scheme == "https" else 80)


def health_url(backend: Backend) -> str:
    """``http://host:port/health``: the engine's health endpoint (outside ``/v1``)."""
    host, port = engine_address(backend)
    return f"http://{host}:{port}/health"


def engine_command(model_dir: str, host: str, port: int, device: str = "cpu",
                   extra: list[str] | None = None) -> list[str]:
    """argv of the engine process."""
    return [sys.executable, "-m", "prefixgate.local_engine", "--model", model_dir, "--host", host,
            "--port", str(port), "--device", device, *(extra or [])]


def is_healthy(url: str, timeout_s: float = 1.0) -> bool:
    """Whether ``GET url`` answers 200 now."""
    try:
        return httpx.get(url, timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def served_models(backend: Backend, timeout_s: float = 2.0) -> list[str] | None:
    """The model ids ``GET base_url/models`` lists, or None when it cannot be read."""
    try:
        data = httpx.get(backend.base_url + "/models", timeout=timeout_s).json().get("data")
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    if not isinstance(data, list):
        return None
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


def check_reused(backend: Backend, model_dir: str) -> None:
    """Raise EngineStartError when the engine answering at ``backend`` does not serve the model
    in ``model_dir`` (named by its directory, as ``python -m prefixgate.local_engine`` names it)."""
    want = Path(model_dir).expanduser().name
    got = served_models(backend)
    if got is not None and want not in got:
        raise EngineStartError(f"an engine already answers at {backend.base_url} but serves "
                               f"{got}, not {want!r} ({model_dir}): stop it, or give this "
                               "backend another port")


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 free now (the system's pick; a moment later another process
    could take it, which the engine's start then reports)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class EngineProcess:
    """Context manager: spawn the engine for ``backend`` with ``model_dir``; wait for health.

    Raises EngineStartError when the process exits early or is not healthy within
    ``startup_timeout_s`` seconds (model loading on CPU takes a few seconds). ``base_url``: where
    the proxy reaches the engine once entered (the reused one's, or the spawned one's random
    loopback port); ``random_port``: False spawns at the backend's own address instead;
    ``env``: variables added to the engine's environment.
    """

    backend: Backend
    model_dir: str
    startup_timeout_s: float = 600.0
    extra: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    random_port: bool = True
    base_url: str = ""
    env: dict[str, str] = field(default_factory=dict)

    def __enter__(self) -> Self:
        url = health_url(self.backend)
        self.base_url = self.backend.base_url
        if is_healthy(url):
            check_reused(self.backend, self.model_dir)
            log.info("engine already serving at %s: reusing it", url)
            return self
        host, port = engine_address(self.backend)
        if self.random_port:
            host, port = "127.0.0.1", free_loopback_port()
            self.base_url = f"http://{host}:{port}/v1"
            url = f"http://{host}:{port}/health"
        cmd = engine_command(self.model_dir, host, port, self.backend.device, self.extra)
        log.info("starting engine: %s", " ".join(cmd))
        self.proc = subprocess.Popen(cmd, env={**os.environ, **self.env} if self.env else None)
        try:
            self._wait_healthy(url)
        except BaseException:  # Ctrl-C / SIGTERM while it loads: not entered, so stop it here
            self.stop()
            raise
        log.info("engine healthy at %s (pid %d)", url, self.proc.pid)
        return self

    def _wait_healthy(self, url: str) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while not is_healthy(url):
            code = self.proc.poll()
            if code is not None:
                raise EngineStartError(f"engine exited with code {code} before serving {url}")
            if time.monotonic() > deadline:
                raise EngineStartError(f"engine not healthy at {url} after "
                                       f"{self.startup_timeout_s:.0f} s")
            time.sleep(0.25)

    def stop(self, grace_s: float = 10.0) -> None:
        """Terminate the process we started (never one we reused)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
