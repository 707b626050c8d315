"""Headless Chromium driven over the DevTools protocol, for the dashboard tests and
``bench/dashboard_screenshot.py``.

Usage::

    with Chromium.launch() as browser:
        page = browser.page
        page.navigate(url, headers={"authorization": "Basic ..."})
        page.wait_for("document.body.dataset.state === 'ready'")
        png = page.screenshot()
        page.errors          # console errors, uncaught exceptions, failed loads (strings)

Chromium is started as its own process (``--headless --no-sandbox``: the tests run as root in
CI; ``--remote-debugging-port=0``: the port is read from ``DevToolsActivePort`` in a fresh
profile directory), and one page target is driven over its websocket with
``websockets.sync`` (installed with ``uvicorn[standard]``). Events that arrive while waiting for
a command's answer are kept: console ``error`` / ``assert`` calls, uncaught exceptions and
``Log`` entries of level ``error`` (a 404 for a script, a CSP violation) land in ``errors``.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium_path() -> str | None:
    """The first Chromium-family executable on PATH (``PREFIXGATE_CHROMIUM`` first), or None."""
    env = os.environ.get("PREFIXGATE_CHROMIUM")
    if env and shutil.which(env):
        return shutil.which(env)
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


class CDPError(RuntimeError):
    """A DevTools command answered with an error, or an expected state never came."""


class Page:
    """One page target. ``errors``: every console error / exception / error log seen so far."""

    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._next = 0
        self.errors: list[str] = []
        self.events: list[dict[str, Any]] = []
        # event method -> callback(params), run as the event arrives (it may call post())
        self.handlers: dict[str, Callable[[dict[str, Any]], None]] = {}

    def post(self, method: str, params: dict[str, Any] | None = None) -> None:
        """Send ``method`` without waiting for its answer (for event handlers)."""
        self._next += 1
        self._ws.send(json.dumps({"id": self._next, "method": method, "params": params or {}}))

    def send(self, method: str, params: dict[str, Any] | None = None,
             timeout_s: float = 30.0) -> dict[str, Any]:
        """Run ``method``; its ``result``. Raises CDPError on an error answer or a timeout."""
        self._next += 1
        my_id = self._next
        self._ws.send(json.dumps({"id": my_id, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CDPError(f"{method}: no answer in {timeout_s} s")
            try:
                msg = json.loads(self._ws.recv(timeout=left))
            except TimeoutError:
                raise CDPError(f"{method}: no answer in {timeout_s} s") from None
            if msg.get("id") == my_id:
                if "error" in msg:
                    raise CDPError(f"{method}: {msg['error']}")
                return msg.get("result", {})  # type: ignore[no-any-return]
            if "method" in msg:
                self._on_event(msg)

    def _on_event(self, msg: dict[str, Any]) -> None:
        self.events.append(msg)
        method, params = msg["method"], msg.get("params", {})
        if method in self.handlers:
            self.handlers[method](params)
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            self.errors.append(f"console.{params['type']}: {args}")
        elif method == "Runtime.exceptionThrown":
            d = params["exceptionDetails"]
            self.errors.append("exception: " + str(d.get("exception", {}).get("description")
                                                   or d.get("text")))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            e = params["entry"]
            self.errors.append(f"log: {e.get('text')} {e.get('url', '')}".strip())

    def evaluate(self, expression: str, timeout_s: float = 30.0) -> Any:
        """The JSON value of ``expression`` in the page (promises awaited). Raises CDPError when
        it throws."""
        res = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                             "awaitPromise": True}, timeout_s)
        if "exceptionDetails" in res:
            raise CDPError(f"evaluate failed: {res['exceptionDetails']}")
        return res["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 30.0) -> Any:
        """Poll ``expression`` until truthy; its value. Raises CDPError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        raise CDPError(f"timed out after {timeout_s} s waiting for {expression!r}; "
                       f"errors: {self.errors}")

    def navigate(self, url: str, headers: dict[str, str] | None = None) -> None:
        """Load ``url``; ``headers`` go with every request the page makes from now on."""
        if headers:
            self.send("Network.setExtraHTTPHeaders", {"headers": headers})
        res = self.send("Page.navigate", {"url": url})
        if res.get("errorText"):
            raise CDPError(f"navigate {url}: {res['errorText']}")

    def screenshot(self, width: int = 1400) -> bytes:
        """A PNG of the whole page (``width`` CSS pixels wide, as tall as the document)."""
        height = int(self.evaluate("Math.ceil(document.documentElement.scrollHeight)") or 900)
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                          "deviceScaleFactor": 1, "mobile": False})
        try:
            res = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        finally:
            self.send("Emulation.clearDeviceMetricsOverride")
        return base64.b64decode(res["data"])


class Chromium:
    """A running headless Chromium with one page (``page``); see module docstring."""

    def __init__(self, proc: subprocess.Popen[bytes], profile: Path, page: Page,
                 ws: ClientConnection) -> None:
        self.proc, self.profile, self.page, self._ws = proc, profile, page, ws

    @classmethod
    @contextmanager
    def launch(cls, width: int = 1400, height: int = 1000,
               startup_timeout_s: float = 60.0) -> Iterator[Chromium]:
        """Start Chromium; yield it; kill it and remove its profile on exit. Raises
        FileNotFoundError without a Chromium on PATH, CDPError when it does not come up."""
        exe = chromium_path()
        if exe is None:
            raise FileNotFoundError("no chromium on PATH")
        profile = Path(tempfile.mkdtemp(prefix="pg-chromium-"))
        log = open(profile / "chromium.log", "wb")  # noqa: SIM115 (closed below)
        proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions",
             "--disable-background-networking", "--disable-component-update",
             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
             f"--user-data-dir={profile}", f"--window-size={width},{height}",
             "--hide-scrollbars", "about:blank"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            port = _devtools_port(proc, profile, startup_timeout_s)
            ws_url = _page_ws_url(port, startup_timeout_s)
            with connect(ws_url, max_size=64 * 1024 * 1024, open_timeout=startup_timeout_s) as ws:
                page = Page(ws)
                for domain in ("Runtime", "Log", "Page", "Network"):
                    page.send(f"{domain}.enable")
                yield cls(proc, profile, page, ws)
        finally:
            proc.kill()
            proc.wait(timeout=10)
            log.close()
            shutil.rmtree(profile, ignore_errors=True)


def _devtools_port(proc: subprocess.Popen[bytes], profile: Path, timeout_s: float) -> int:
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (profile / "chromium.log").read_text(errors="replace")[-2000:]
            raise CDPError(f"chromium exited with {proc.returncode}: {tail}")
        try:
            first = marker.read_text().splitlines()[0]
            if first.strip():
                return int(first)
        except (OSError, IndexError, ValueError):
            pass
        time.sleep(0.05)
    raise CDPError(f"chromium did not open its DevTools port in {timeout_s} s")


def _page_ws_url(port: int, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=5, trust_env=False).json()
            pages = [t for t in targets if t.get("type") == "page"]
            if pages:
                return str(pages[0]["webSocketDebuggerUrl"])
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise CDPError("chromium has no page target")
